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

import json
import time
from pathlib import Path

import numpy as np
import torch

from embodied.data.build import generate_dataset
from embodied.data.episodes import generate_episodes, matches
from embodied.data.load import load_examples
from embodied.envs import env_reward, is_interactive
from embodied.envs.evaluate import evaluate_env, rollout_video
from embodied.envs.parity import answer_text, random_action
from embodied.envs.report import write_report
from embodied.eval.loop import evaluate
from embodied.policy.model import (
    completion_logprobs,
    encode_completions,
    encode_prompts,
    load,
    load_policy,
    save_policy,
)
from embodied.rl.losses import masked_mean
from embodied.rl.rewards import mcq_reward
from embodied.train.common import index_batches
from embodied.train.grpo import train_grpo
from embodied.train.metrics import MetricsLog, plot_curves, read_metrics
from embodied.train.sft import train_sft

ARMS = ("mcq", "sim", "mixed")


def routed_reward(cfg):
    """One batch reward for any mix of records: physics for interactive ones, rules for MCQs.

    Interactive completions of a call are executed together (one Warp batch per task on `warp`).
    """

    def reward_fn(texts: list[str], records: list[dict]) -> list[dict[str, float]]:
        env_idx = [i for i, r in enumerate(records) if is_interactive(r)]
        out: list[dict[str, float]] = [{} for _ in texts]
        sim = (
            env_reward(
                [texts[i] for i in env_idx],
                [records[i] for i in env_idx],
                cfg.env.backend,
                cfg.env.format_weight,
            )
            if env_idx
            else []
        )
        for i, terms in zip(env_idx, sim):
            out[i] = terms
        for i, (text, rec) in enumerate(zip(texts, records)):
            if not is_interactive(rec):
                out[i] = mcq_reward(text, rec["answer"], cfg.grpo.accuracy_weight, cfg.grpo.format_weight)
        return out

    return reward_fn


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
    """SFT on interactive prompts with uniformly random in-range actions as targets (format, not physics)."""
    fb = cfg.env.feedback
    if fb.format_steps <= 0:
        return
    device = next(model.parameters()).device
    rng = np.random.default_rng([cfg.seed, 31])
    optimizer = torch.optim.AdamW(model.parameters(), lr=fb.format_lr, weight_decay=0.0)
    order = index_batches(len(examples), cfg.sft.batch_size, cfg.seed)
    log = MetricsLog(out / "metrics.jsonl", "format")
    model.train()
    for step in range(1, fb.format_steps + 1):
        chunk = [examples[i] for i in next(order)]
        records = [e.record for e in chunk]
        targets = [answer_text(r["task"], random_action(r["task"], rng)) for r in records]
        batch = encode_prompts(processor, records, [e.clip for e in chunk], cfg.video, device)
        ids, mask = encode_completions(processor, targets, device)
        loss = -masked_mean(completion_logprobs(model, batch, ids, mask), mask)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.sft.grad_clip)
        optimizer.step()
        if step % cfg.sft.log_every == 0 or step == fb.format_steps:
            log.log(step, {"loss/format_sft": loss.item()})
    model.eval()


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
            reward_fn=routed_reward(cfg),
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
