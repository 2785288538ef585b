"""`embodied experiment env-feedback`: does a simulator's verdict ground physical reasoning better than MCQs?

One starting point, three GRPO arms with equal steps, prompts per step and group size:

* ``mcq``: rule-checked answers to the generated multiple-choice questions (`data:`),
* ``sim``: interactive episodes (`env:`), each answer executed in MuJoCo and scored by what happens,
* ``mixed``: both, half the prompts of each kind on average, each scored by its own reward.

The starting point is SFT on the MCQ training split, then `env.feedback.format_steps` of SFT on the
interactive prompts with *random* in-range actions as targets: it teaches the answer format (numbers
or a letter inside `<answer>`), not physics, so that the sim arm has parseable answers to learn from.
Every arm (and the start) is evaluated on the held-out MCQ test split (all families in `data:`) and on
held-out interactive episodes (success rate per task, failure terms, unparseable share). Outputs in
`run_dir`: `results.md`, `results.json`, `results.png`, `reward_curves.png`, `<arm>/metrics.jsonl`,
`<arm>/curves.png`, and `videos/<arm>_<task>_<i>.mp4` (the clip, then the physics of the policy's
answer, with the answer and the outcome drawn on it).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import torch

from embodied.data.build import generate_dataset
from embodied.data.episodes import generate_episodes, matches
from embodied.data.load import load_examples
from embodied.envs.evaluate import evaluate_env, rollout_video
from embodied.envs.parity import answer_text, random_action
from embodied.envs.report import write_report
from embodied.eval.loop import evaluate
from embodied.policy.model import (
    load,
    load_policy,
    save_policy,
)
from embodied.rl.rewards import routed_rewards
from embodied.train.grpo import train_grpo
from embodied.train.metrics import plot_curves, read_metrics
from embodied.train.sft import train_sft

ARMS = ("mcq", "sim", "mixed")


def _load_data(cfg, progress: bool) -> dict[str, list]:
    """MCQ train/test and interactive train/test examples, generating what is missing or stale."""
    from embodied.data.build import dataset_matches

    if not dataset_matches(cfg.data):
        generate_dataset(cfg.data, progress=progress)
    if not matches(cfg.env):
        generate_episodes(cfg.env, progress=progress)
    fps, mf = cfg.video.fps, cfg.video.max_frames
    fb = cfg.env.feedback
    data = {
        "mcq_train": load_examples(cfg.data.root, "train", fps, mf)[0],
        "mcq_test": load_examples(cfg.data.root, "test", fps, mf, limit=fb.eval_mcq or None)[0],
        "env_train": load_examples(cfg.env.root, "train", fps, mf)[0],
        "env_test": load_examples(cfg.env.root, "test", fps, mf)[0],
    }
    empty = [k for k, v in data.items() if not v]
    if empty:
        raise ValueError(f"env-feedback: no readable examples in {empty}; check data.root and env.root")
    return data


def format_warmup(model, processor, examples, cfg, out: Path, progress: bool) -> None:
    """SFT (`train_sft`) on interactive prompts with uniformly random in-range actions as targets (format, not
    physics): `env.feedback.format_steps` steps at `format_lr`, its metrics in `out/format/`."""
    fb = cfg.env.feedback
    if fb.format_steps <= 0:
        return
    rng = np.random.default_rng([cfg.seed, 31])
    sft = dataclasses.replace(
        cfg.sft,
        steps=fb.format_steps,
        lr=fb.format_lr,
        warmup_steps=0,
        vision_lr_scale=1.0,
        restart_every=0,
        weight_decay=0.0,
        eval_every=0,
        checkpoint_every=0,
    )

    def random_answer(record: dict) -> str:
        return answer_text(record["task"], random_action(record["task"], rng))

    train_sft(
        model,
        processor,
        examples,
        sft,
        cfg.video,
        out / "format",
        (),
        cfg.seed,
        progress,
        target_fn=random_answer,
    )


def _train_set(arm: str, data: dict, seed: int) -> list:
    if arm == "mcq":
        return data["mcq_train"]
    if arm == "sim":
        return data["env_train"]
    if arm == "mixed":  # as many MCQs as episodes, so a step draws half of each on average
        rng = np.random.default_rng([seed, 7])
        n = min(len(data["mcq_train"]), len(data["env_train"]))
        pick = rng.choice(len(data["mcq_train"]), size=n, replace=False)
        return [data["mcq_train"][i] for i in pick] + list(data["env_train"][:n])
    raise ValueError(f"env.feedback.arms: unknown arm {arm!r}; choose from {ARMS}")


def _evaluate_all(model, processor, data: dict, cfg, progress: bool, name: str) -> dict:
    mcq = evaluate(
        model,
        processor,
        data["mcq_test"],
        cfg.video,
        cfg.eval.batch_size,
        cfg.eval.max_new_tokens,
        choice=cfg.eval.choice,
        progress=progress,
        desc=f"mcq {name}",
    )
    env = evaluate_env(
        model,
        processor,
        data["env_test"],
        cfg.video,
        cfg.env.backend,
        cfg.eval.batch_size,
        cfg.eval.max_new_tokens,
        cfg.env.format_weight,
        progress,
        desc=f"env {name}",
    )
    return {"mcq": mcq, "env": env}


def _videos(result: dict, data: dict, cfg, out: Path, arm: str) -> list[str]:
    """A few rollout videos per task from the arm's greedy answers on held-out episodes."""
    by_id = {p["id"]: p["response"] for p in result["env"]["predictions"]}
    written, per_task = [], {}
    for ex in data["env_test"]:
        name = ex.record["task"]
        k = per_task.get(name, 0)
        if k >= cfg.env.feedback.videos_per_task:
            continue
        path = out / "videos" / f"{arm}_{name}_{k}.mp4"
        rollout_video(ex.record, ex.clip.frames, by_id[ex.record["id"]], path, cfg.env.feedback.video_fps)
        per_task[name] = k + 1
        written.append(str(path.relative_to(out)))
    return written


def run(cfg, out: Path, progress: bool = True) -> dict:
    """Start -> one GRPO run per arm -> evaluation, table, plots and videos in `out`."""
    t0 = time.perf_counter()
    out = Path(out)
    data = _load_data(cfg, progress)
    model, processor = load(cfg.policy)
    (out / "start").mkdir(parents=True, exist_ok=True)
    (out / "start" / "metrics.jsonl").unlink(missing_ok=True)
    train_sft(model, processor, data["mcq_train"], cfg.sft, cfg.video, out / "start", (), cfg.seed, progress)
    format_warmup(model, processor, data["env_train"], cfg, out / "start", progress)
    save_policy(model, processor, out / "start" / "model")
    results = {"start": _evaluate_all(model, processor, data, cfg, progress, "start")}
    timings = {"start": round(time.perf_counter() - t0, 1)}
    videos = {"start": _videos(results["start"], data, cfg, out, "start")}
    for arm in cfg.env.feedback.arms:
        t = time.perf_counter()
        model, processor = load_policy(out / "start" / "model", cfg.policy.dtype, cfg.policy.device)
        arm_dir = out / arm
        arm_dir.mkdir(parents=True, exist_ok=True)
        (arm_dir / "metrics.jsonl").unlink(missing_ok=True)
        train = _train_set(arm, data, cfg.seed)
        train_grpo(
            model,
            processor,
            train,
            cfg.grpo,
            cfg.video,
            arm_dir,
            (),
            cfg.seed,
            progress,
            reward_fn=routed_rewards(
                cfg.env.backend, cfg.env.format_weight, cfg.grpo.accuracy_weight, cfg.grpo.format_weight
            ),
        )
        plot_curves(read_metrics(arm_dir / "metrics.jsonl"), arm_dir / "curves.png")
        results[arm] = _evaluate_all(model, processor, data, cfg, progress, arm)
        videos[arm] = _videos(results[arm], data, cfg, out, arm)
        timings[arm] = round(time.perf_counter() - t, 1)
    summary = write_report(results, videos, out, cfg)
    summary["timings_s"] = timings | {"total": round(time.perf_counter() - t0, 1)}
    summary["threads"] = torch.get_num_threads()
    (out / "results.json").write_text(json.dumps(summary, indent=2))
    print(f"results: {out / 'results.md'}; plots: {out / 'results.png'}; videos: {out / 'videos'}")
    return summary
