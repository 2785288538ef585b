"""`embodied experiment env-feedback`: does a simulator's verdict ground physical reasoning better than MCQs?

Per seed, one starting point and, by default (`env_feedback.arms`), three GRPO arms with equal steps,
prompts per step and group size, and one expert-iteration arm that scores as many answers:

* ``mcq``: rule-checked answers to the generated multiple-choice questions (`data:`),
* ``sim``: interactive episodes (`env:`), each answer executed in MuJoCo and scored by what happens,
* ``mixed``: both, half the prompts of each kind on average, each scored by its own reward,
* ``expert``: the sim arm's episodes and physics, with expert iteration (`expert:`) instead of GRPO.

The start is format-only SFT (`sft.targets=format`) on the MCQ and interactive training prompts together:
random letters and random in-range actions as targets, so the policy learns to answer in the format and
nothing about which answer is right; whatever beats chance or the best constant answer afterwards is the
reinforcement learning's. Every stage of every seed is evaluated on the held-out MCQ test split, on the
held-out MCQ benchmark of every family (`env_feedback.benchmark`) and on held-out interactive episodes:
success per task, how the answers spread over episodes and whether they follow the scene parameter that
decides the outcome, against the best constant answer (`embodied.eval.env_baselines.best_constant`). For
`env_feedback.test_time_seeds` the arms are also evaluated with sampled answers: best-of-N with the
simulator as the verifier and majority vote, against N and against seconds.

Outputs in `run_dir`: `results.md`, `results.json`, `results.png`, `reward_curves.png`,
`test_time.png`, `seed<S>/<stage>/` (metrics, curves, predictions and the model) and
`videos/<arm>_<task>_<i>.mp4` (first seed: the clip, then the physics of the policy's answer, with the
answer and the outcome drawn on it). A finished stage keeps its results in `seed<S>/<stage>/result.json`
and a rerun with the same settings reuses it. `env_feedback.workers` runs the starts, then the arms, in
that many processes side by side.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import torch

from embodied.data.build import ensure_dataset
from embodied.data.episodes import ensure_episodes
from embodied.data.load import load_examples
from embodied.environment import stamped
from embodied.envs import answer_examples
from embodied.envs.config import Turns
from embodied.eval.env_baselines import best_constant
from embodied.eval.env_loop import EnvEval, check_sample_episodes, evaluate_env
from embodied.eval.env_video import rollout_video
from embodied.eval.loop import evaluate_free
from embodied.experiments.env_report import write_env_report
from embodied.experiments.reuse import process_data, provenance, reuse_or_run, run_jobs, start_and_arm_jobs
from embodied.policy.engines import make_engine
from embodied.policy.model import load, load_policy, save_policy
from embodied.rl.rewards import rewards_for
from embodied.train.common import seed_everything
from embodied.train.expert import train_expert_config
from embodied.train.grpo import train_grpo
from embodied.train.metrics import plot_curves, read_metrics
from embodied.train.sft import train_sft
from embodied.train.state import Run

ARMS = ("mcq", "sim", "mixed", "expert")


def benchmark_config(cfg):
    """The `data:` section of `env_feedback.benchmark` at `benchmark_n_test` questions (own root), or None."""
    from embodied.config import load_config

    fb = cfg.env_feedback
    if not fb.benchmark:
        return None
    bench = load_config(fb.benchmark).data
    return dataclasses.replace(bench, n_test=fb.benchmark_n_test, root=f"{bench.root}_n{fb.benchmark_n_test}")


def _load_data(cfg, progress: bool) -> dict[str, list]:
    """MCQ train/test, benchmark, interactive train/test examples, generating what is missing or stale."""
    ensure_dataset(cfg.data, progress)
    ensure_episodes(cfg.env, progress)
    fps, mf = cfg.video.fps, cfg.video.max_frames
    fb = cfg.env_feedback
    data = {
        "mcq_train": load_examples(cfg.data.root, "train", fps, mf)[0],
        "mcq_test": load_examples(cfg.data.root, "test", fps, mf, limit=fb.eval_mcq or None)[0],
        "env_train": answer_examples(load_examples(cfg.env.root, "train", fps, mf)[0], cfg.env.answer),
        "env_test": answer_examples(load_examples(cfg.env.root, "test", fps, mf)[0], cfg.env.answer),
    }
    if (bench := benchmark_config(cfg)) is not None:
        ensure_dataset(bench, progress)
        data["bench"] = load_examples(bench.root, "test", fps, mf)[0]
    empty = [k for k, v in data.items() if not v]
    if empty:
        raise ValueError(f"env-feedback: no readable examples in {empty}; check data.root and env.root")
    return data


def _train_set(arm: str, data: dict, seed: int) -> list:
    if arm == "mcq":
        return data["mcq_train"]
    if arm in ("sim", "expert"):
        return data["env_train"]
    if arm == "mixed":  # as many MCQs as episodes, so a step draws half of each on average
        rng = np.random.default_rng([seed, 7])
        mcq, env = data["mcq_train"], data["env_train"]
        n = min(len(mcq), len(env))
        pick = rng.choice(len(mcq), size=n, replace=False)
        if n < len(env):  # more episodes than MCQs: a random n of them, so every task keeps its share
            env = [env[i] for i in sorted(rng.choice(len(env), size=n, replace=False))]
        return [mcq[i] for i in pick] + list(env)
    raise ValueError(f"env_feedback.arms: unknown arm {arm!r}; choose from {ARMS}")


def _mcq(model, processor, examples, cfg, samples: int = 0, ks=()) -> dict:
    return evaluate_free(model, processor, examples, cfg, samples=samples, k=ks)


def evaluate_stage(model, processor, data: dict, cfg, test_time: bool) -> dict:
    """Held-out MCQ test, benchmark and interactive episodes; with sampled answers when `test_time`."""
    fb = cfg.env_feedback
    samples, ks = (fb.test_time_samples, fb.test_time_k) if test_time else (0, ())
    result = {"mcq": _mcq(model, processor, data["mcq_test"], cfg, samples, ks)}
    if "bench" in data:
        result["bench"] = _mcq(model, processor, data["bench"], cfg)
    e, env = cfg.eval, cfg.env
    how = EnvEval(env.backend, e.batch_size, e.max_new_tokens, env.format_weight, samples, ks, seed=cfg.seed)
    how = dataclasses.replace(how, sample_episodes=fb.test_time_episodes, turns=Turns.of(env))
    result["env"] = evaluate_env(model, processor, data["env_test"], cfg.video, how)
    return result


def _videos(env_result: dict, data: dict, cfg, out: Path, arm: str) -> list[str]:
    """A few rollout videos per task from the arm's greedy answers on held-out episodes."""
    by_id = {p["id"]: [t["response"] for t in p.get("turns", [p])] for p in env_result["predictions"]}
    written, per_task = [], {}
    for ex in data["env_test"]:
        name = ex.record["task"]
        k = per_task.get(name, 0)
        if k >= cfg.env_feedback.videos_per_task:
            continue
        path = out / "videos" / f"{arm}_{name}_{k}.mp4"
        rollout_video(ex.record, ex.clip.frames, by_id[ex.record["id"]], path, cfg.env_feedback.rollout_fps)
        per_task[name] = k + 1
        written.append(str(path.relative_to(out)))
    return written


def _keep(result: dict, path: Path) -> dict:
    """Write every prediction of a stage to `path`; return the figures without them."""
    path.write_text(json.dumps(result, indent=1, default=float))
    return {
        part: {k: v for k, v in r.items() if k not in ("predictions", "per_family_tier")}
        for part, r in result.items()
    }


def run_start(cfg, data: dict, out: Path, progress: bool) -> dict:
    """Format-only SFT of `policy.path` on the MCQ and interactive training prompts; saved and evaluated."""
    seed_everything(cfg.seed)  # the same numbers whether stages run one after another or in workers
    t = time.perf_counter()
    model, processor = load(cfg.policy)
    start_dir = out / f"seed{cfg.seed}" / "start"
    start_dir.mkdir(parents=True, exist_ok=True)
    (start_dir / "metrics.jsonl").unlink(missing_ok=True)
    sft = dataclasses.replace(cfg.sft, targets="format")  # no stage before RL ever sees a right answer
    train = data["mcq_train"] + data["env_train"]
    train_sft(sft, Run.of(cfg, model, processor, train, start_dir, progress=progress))
    save_policy(model, processor, start_dir / "model")
    wall = time.perf_counter() - t
    result = evaluate_stage(model, processor, data, cfg, _test_time(cfg))
    return {"figures": _keep(result, start_dir / "predictions.json"), "train_s": round(wall, 1), "videos": []}


def run_arm(cfg, data: dict, out: Path, arm: str, progress: bool) -> dict:
    """GRPO of the seed's start on the arm's prompts and reward; evaluated (and filmed for the first seed)."""
    seed_everything(cfg.seed)
    start_dir, arm_dir = out / f"seed{cfg.seed}" / "start", out / f"seed{cfg.seed}" / arm
    t = time.perf_counter()
    model, processor = load_policy(start_dir / "model", cfg.policy.dtype, cfg.policy.device)
    engine = make_engine(cfg, model, processor)  # samples the arm's rollouts (rollout.engine)
    arm_dir.mkdir(parents=True, exist_ok=True)
    (arm_dir / "metrics.jsonl").unlink(missing_ok=True)
    train = _train_set(arm, data, cfg.seed)
    if arm == "expert":  # best-of-N verified by the simulator, then fine-tuned on: no GRPO update
        run = Run(model, processor, train, arm_dir, progress=progress, engine=engine)
        info = train_expert_config(cfg, run)
        answers = info["answers_scored"]
    else:
        grpo = dataclasses.replace(cfg.grpo, checkpoint_every=0)
        turns = Turns.of(cfg.env)  # env.turns: multi-turn episodes
        run = Run.of(cfg, model, processor, train, arm_dir, progress=progress, reward_fn=rewards_for(cfg))
        train_grpo(grpo, dataclasses.replace(run, turns=turns, engine=engine))
        answers = cfg.grpo.steps * cfg.grpo.prompts_per_step * cfg.grpo.group_size
    wall = time.perf_counter() - t
    save_policy(model, processor, arm_dir / "model")  # for `embodied eval policy.path=...`
    plot_curves(read_metrics(arm_dir / "metrics.jsonl"), arm_dir / "curves.png")
    result = evaluate_stage(model, processor, data, cfg, _test_time(cfg))
    videos = _videos(result["env"], data, cfg, out, arm) if cfg.seed == cfg.env_feedback.seeds[0] else []
    return {
        "figures": _keep(result, arm_dir / "predictions.json"),
        "train_s": round(wall, 1),
        "answers_scored": answers,
        "videos": videos,
    }


def _test_time(cfg) -> bool:
    return cfg.seed in cfg.env_feedback.test_time_seeds


def _stage_key(cfg, stage: str) -> dict:
    """Everything a stage's run depends on: a finished stage with the same key is reused."""
    skip = ("seeds", "videos_per_task", "workers", "arms")
    fb = {k: v for k, v in dataclasses.asdict(cfg.env_feedback).items() if k not in skip}
    fb["test_time"] = _test_time(cfg)
    parts = ["policy", "data", "video", "sft", "eval"]
    # every arm samples with grpo's token budget; the expert arm's rounds are `expert`
    parts += [] if stage == "start" else ["grpo"] + (["expert"] if stage == "expert" else [])
    key = {"seed": cfg.seed, "stage": stage, "feedback": fb, "env": dataclasses.asdict(cfg.env)}
    return key | {p: dataclasses.asdict(getattr(cfg, p)) for p in parts}


_DATA: dict = {}
"""A worker process's examples, loaded by its first job and kept for the next."""


def run_stage(
    cfg, out: Path, seed: int, stage: str, progress: bool = False, data: dict | None = None
) -> dict:
    """The start (`stage="start"`) or one arm of `seed`, or its saved result when the settings match."""
    cfg = dataclasses.replace(cfg, seed=seed)
    if data is None:  # in a worker process
        key = {k: dataclasses.asdict(getattr(cfg, k)) for k in ("data", "env", "video")}
        data = process_data(key, lambda: _load_data(cfg, progress=False), cfg.threads)

    def compute() -> dict:
        return (
            run_start(cfg, data, out, progress)
            if stage == "start"
            else run_arm(cfg, data, out, stage, progress)
        )

    return reuse_or_run(
        out / f"seed{seed}" / stage / "result.json",
        _stage_key(cfg, stage),
        compute,
        f"seed {seed} {stage}",
        cfg.policy,
    )


LONGEST_FIRST = ("expert", "sim", "mixed", "mcq")
"""The arms by their training seconds in the shipped config, longest first: the order workers take them."""


def _run_all(cfg, out: Path, data: dict, progress: bool) -> dict[tuple[int, str], dict]:
    """Every seed's start and arms, `(seed, stage) -> result`, in `env_feedback.workers` processes. A seed's
    arms start as soon as its start is done, the longest arms first (`LONGEST_FIRST`), so no worker waits for
    another seed's start and the long arms do not come last."""
    fb = cfg.env_feedback
    jobs, needs = start_and_arm_jobs(fb.seeds, sorted(fb.arms, key=LONGEST_FIRST.index), "start")
    args = [(cfg, out, seed, stage) for seed, stage in jobs]
    return dict(zip(jobs, run_jobs(run_stage, args, fb.workers, (progress, data), needs)))


def _best_constant(cfg, data: dict, progress: bool) -> dict:
    """The best constant answer per task on the held-out episodes, kept beside them in `env.root`; in
    `env_feedback.workers` processes (nothing else runs yet)."""
    records = [e.record for e in data["env_test"]]
    key = {"backend": cfg.env.backend, "ids": [r["id"] for r in records], "env": dataclasses.asdict(cfg.env)}
    key["options"] = {r["task"]: r["options"] for r in records}  # a task's grid (env.answer) is part of it
    return reuse_or_run(
        Path(cfg.env.root) / "best_constant.json",
        key,
        lambda: best_constant(records, cfg.env.backend, progress, cfg.env_feedback.workers),
        "best constant",
    )


def run(cfg, out: Path, progress: bool = True) -> dict:
    """Every seed's start and arms -> tables, plots and videos in `out`."""
    t0 = time.perf_counter()
    out = Path(out)
    fb = cfg.env_feedback
    unknown = [a for a in fb.arms if a not in ARMS]
    if unknown:
        raise ValueError(f"env_feedback.arms: unknown arm(s) {unknown}; choose from {list(ARMS)}")
    Turns.of(cfg.env)  # invalid turn settings fail here, before any work
    check_sample_episodes(fb.test_time_episodes)
    data = _load_data(cfg, progress)
    constant = _best_constant(cfg, data, progress)
    results = _run_all(cfg, out, data, progress)
    rows = []
    for seed in fb.seeds:
        stages = {stage: results[(seed, stage)] for stage in ("start", *fb.arms)}
        rows.append(
            {
                "seed": seed,
                "stages": {k: v["figures"] for k, v in stages.items()},
                "videos": {k: v["videos"] for k, v in stages.items() if v["videos"]},
                "timings_s": {k: v["train_s"] for k, v in stages.items()},
                "answers_scored": {
                    k: v["answers_scored"] for k, v in stages.items() if "answers_scored" in v
                },
            }
        )
    summary = write_env_report(rows, constant, out, cfg)
    summary["timings_s"] = {
        "total": round(time.perf_counter() - t0, 1),
        "per_seed": [r["timings_s"] for r in rows],
    }
    summary["threads"] = torch.get_num_threads()
    summary["policy"] = cfg.policy.path
    summary["provenance"] = provenance(cfg.policy)  # the code and start weights every stage was keyed on
    (out / "results.json").write_text(json.dumps(stamped(summary), indent=2, default=float))
    print(f"results: {out / 'results.md'}; plots: {out / 'results.png'}; videos: {out / 'videos'}")
    return summary
