"""Zero-label RL: GRPO alone teaches arrow of time to a policy that has never seen a correct answer.

`embodied experiment zero-label -c configs/experiment_zero_label.yaml` runs, for every seed in
`zero_label.seeds` (the seed of data order, sampling and the SFT draws):

1. the quickstart dataset (generated unless `data.root` already holds it);
2. two starts from `policy.path` (the perception-pretrained tiny base by default):
   - **format**: `zero_label.format_steps` of SFT whose targets carry a uniformly random letter
     (`sft.targets=format`): the policy learns to answer `<think></think><answer>X</answer>` and nothing
     about which X is right;
   - **half**: the format start plus `zero_label.half_steps` of ordinary SFT, stopped while the policy
     half-solves its questions;
3. `grpo.steps` of GRPO from each start, with validation accuracy every `zero_label.eval_every` steps;
4. held-out test accuracy (with its 95% interval) of each start and of each final policy.

A finished run keeps its row in `<run_dir>/<start>_seed<seed>/result.json`; rerunning the command with the
same settings reuses it, so an interrupted experiment continues where it stopped.

It writes `zero_label.md` / `zero_label.json` (the table, mean and spread over seeds) and
`zero_label.png` (validation accuracy against steps and against seconds, reward, group spread, entropy).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from embodied.environment import stamped
from embodied.experiments.reuse import reuse_or_run
from embodied.experiments.zero_label_report import plot, summarise, zero_label_table


def _start(cfg, train, val, start: str, seed: int, out: Path, progress: bool):
    """The starting policy of one run: `(model, processor)` after the start's SFT stages."""
    from embodied.policy.model import load
    from embodied.train.common import seed_everything
    from embodied.train.sft import train_sft
    from embodied.train.state import Run

    zc = cfg.zero_label
    seed_everything(seed)
    model, processor = load(cfg.policy)
    stages = [("format", zc.format_steps)] + ([("answer", zc.half_steps)] if start == "half" else [])
    for targets, steps in stages:
        if steps <= 0:
            continue
        sft = dataclasses.replace(
            cfg.sft, steps=steps, targets=targets, eval_every=0, checkpoint_every=0, restart_every=0
        )
        train_sft(sft, Run(model, processor, train, out / f"sft_{targets}", cfg.video, val, seed, progress))
    return model, processor


def _run_key(cfg, start: str, seed: int) -> dict:
    """Everything one run depends on: a finished run with the same key is reused, not repeated."""
    zc = dataclasses.asdict(cfg.zero_label)
    keep = {k: v for k, v in zc.items() if k not in ("seeds", "starts")}
    parts = {"policy": cfg.policy, "data": cfg.data, "video": cfg.video, "sft": cfg.sft, "grpo": cfg.grpo}
    return {"start": start, "seed": seed, "zero_label": keep} | {
        k: dataclasses.asdict(v) for k, v in parts.items()
    }


def one_run(cfg, data: dict, start: str, seed: int, out: Path, progress: bool) -> dict:
    """One start and seed: SFT stages, evaluation, GRPO with validation curve, final evaluation."""
    run_out = out / f"{start}_seed{seed}"
    return reuse_or_run(
        run_out / "result.json",
        _run_key(cfg, start, seed),
        lambda: _one_run(cfg, data, start, seed, run_out, progress),
        f"{start} seed {seed}",
        cfg.policy,
    )


def _one_run(cfg, data: dict, start: str, seed: int, run_out: Path, progress: bool) -> dict:
    from embodied.eval.loop import MCQEval, evaluate
    from embodied.train.grpo import train_grpo
    from embodied.train.metrics import first_reaching, read_metrics, rl_curves
    from embodied.train.state import Run

    zc = cfg.zero_label
    (run_out / "metrics.jsonl").unlink(missing_ok=True)
    model, processor = _start(cfg, data["train"], data["val"], start, seed, run_out, progress)
    val = data["val"][: zc.eval_examples]
    quiet = MCQEval(choice=False, progress=False)
    before_val = evaluate(model, processor, val, cfg.video, quiet)["accuracy"]
    before = evaluate(model, processor, data["test"], cfg.video, quiet)
    grpo = dataclasses.replace(cfg.grpo, eval_every=zc.eval_every, eval_examples=len(val), checkpoint_every=0)
    t0 = time.perf_counter()
    train_grpo(grpo, Run(model, processor, data["train"], run_out, cfg.video, val, seed, progress))
    wall = time.perf_counter() - t0
    after = evaluate(model, processor, data["test"], cfg.video, quiet)
    curves = rl_curves(read_metrics(run_out / "metrics.jsonl"), before_val)
    step, seconds = first_reaching(curves["val"], zc.target)
    row = {
        "start": start,
        "seed": seed,
        "start_test": round(before["accuracy"], 4),
        "start_ci95": [round(x, 4) for x in before["ci95"]],
        "grpo_test": round(after["accuracy"], 4),
        "grpo_ci95": [round(x, 4) for x in after["ci95"]],
        "unparseable": round(after["unparseable"], 4),
        "steps_to_target": step,
        "seconds_to_target": seconds,
        "grpo_wall_s": round(wall, 1),
        "curves": curves,
    }
    print(
        f"[{start} seed {seed}] test {row['start_test']:.3f} -> {row['grpo_test']:.3f} "
        f"{row['grpo_ci95']} in {wall:.0f} s; {zc.target} at step {step}"
    )
    return row


def run(cfg, out: Path, progress: bool = True) -> dict:
    from embodied.data.build import ensure_dataset
    from embodied.data.load import load_split

    zc = cfg.zero_label
    t0 = time.perf_counter()
    ensure_dataset(cfg.data, progress)
    data = {s: load_split(cfg.data.root, s, cfg.video, progress) for s in ("train", "val", "test")}
    rows = [one_run(cfg, data, start, seed, out, progress) for start in zc.starts for seed in zc.seeds]
    result = {
        "grpo_steps": cfg.grpo.steps,
        "target": zc.target,
        "n_val": min(zc.eval_examples, len(data["val"])),
        "n_test": len(data["test"]),
        "policy": cfg.policy.path,
        "summary": summarise(rows, zc.starts),
        "runs": rows,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    (out / "zero_label.json").write_text(json.dumps(stamped(result), indent=2))
    (out / "zero_label.md").write_text(zero_label_table(result))
    plot(rows, out / "zero_label.png", zc.target)
    print(zero_label_table(result))
    return {k: v for k, v in result.items() if k != "runs"}
