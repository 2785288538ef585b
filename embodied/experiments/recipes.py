"""The recipe comparison: GRPO, DAPO, Dr. GRPO, GSPO, REINFORCE++, PAPO and PPO from a start that half-solves
its questions, three seeds each.

`embodied experiment recipes -c configs/experiment_recipes.yaml` runs:

1. the dataset (the quickstart's unless `data` says otherwise; generated unless `data.root` holds it);
2. per seed in `recipes.seeds`, a start that half-solves it (`recipes.start` if given): `policy.path`, then
   `recipes.format_steps` of format-only SFT (random letters), then labelled SFT at `recipes.half_lr` that
   stops at the first validation at or above `recipes.half_at`. The number of labelled steps is chosen per
   seed by validation because the tiny policy finds the cue suddenly: a fixed count lands at 0.5 on one
   seed and 0.8 on another (docs/perception.md). When that step overshoots `recipes.half_high`, the start
   is the point between the last two iterates whose validation lies in the band (bisection);
3. per seed and preset in `recipes.arms` (YAML layered on this config): `recipes.steps` RL steps from that
   seed's start with that seed, validation accuracy every `recipes.eval_every` steps, entropy and group
   spread from the training log, held-out test accuracy at the end;
4. per arm, over seeds: test accuracy with its 95% Student-t interval, steps and seconds to
   `recipes.target`, and for PAPO the greedy accuracy on masked against real input.

Every finished start and run is kept (`start_seed<S>/result.json`, `seed<S>/<arm>/result.json`) and reused
when the settings match. `recipes.workers` runs go at once in separate processes.

It writes `recipes.md`, `recipes.json` and `recipes.png` (accuracy against steps and against seconds,
entropy, group spread: mean over seeds with the min-max band).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from embodied.environment import stamped
from embodied.experiments.recipes_report import (
    critic_curves,
    critic_end,
    plot_recipes,
    recipes_table,
    summarise,
)
from embodied.experiments.reuse import process_data, reuse_or_run, run_jobs, start_and_arm_jobs


def _load_data(cfg, progress: bool) -> dict:
    """The train, val and test splits (once per process)."""
    from embodied.data.load import load_split

    def load() -> dict:
        return {s: load_split(cfg.data.root, s, cfg.video, progress) for s in ("train", "val", "test")}

    key = {"data": dataclasses.asdict(cfg.data), "video": dataclasses.asdict(cfg.video)}
    return process_data(key, load, cfg.threads)


def _sft(cfg, **changes):
    keep = {"eval_every": 0, "checkpoint_every": 0, "restart_every": 0}
    return dataclasses.replace(cfg.sft, **(keep | changes))


def _half_solving(model, processor, cfg, data: dict, seed: int, folder: Path, progress: bool) -> dict:
    """Format-only SFT, then labelled SFT until validation reaches `half_at`. The tiny policy finds the cue
    within one step (a measured seed: validation 0.500 after 21 labelled steps, 0.925 after 22), so when
    the first step at or above `half_at` lands above `half_high`, the start is the point between the last
    two iterates, theta_prev + alpha (theta_last - theta_prev), whose validation lies in [half_at,
    half_high], found by bisection on alpha."""
    from embodied.train.sft import train_sft
    from embodied.train.state import Run

    rc = cfg.recipes
    fmt = _sft(cfg, steps=rc.format_steps, targets="format")
    run = Run(model, processor, data["train"], folder / "sft_format", cfg.video, seed=seed, progress=progress)
    train_sft(fmt, run)
    half = _sft(
        cfg,
        steps=rc.half_max_steps,
        lr=rc.half_lr,
        targets="answer",
        eval_every=1,
        eval_examples=rc.half_eval_examples,
        stop_at=rc.half_at,
    )
    snaps = [(None, _snapshot(model))]  # (validation accuracy, weights) of the last two validations

    def keep(step: int, acc: float) -> None:
        snaps[:] = [snaps[-1], (acc, _snapshot(model))]

    sel = data["val"][: rc.half_eval_examples]
    done = train_sft(half, dataclasses.replace(run, out_dir=folder / "sft_half", val=sel), on_validate=keep)
    made = {"labelled_steps": done["steps"], "interpolation": None}
    if snaps[-1][0] is not None and snaps[-1][0] > rc.half_high:
        made["interpolation"] = _bisect(model, processor, snaps[0][1], snaps[-1][1], sel, cfg)
    return made


def _snapshot(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _blend(prev: dict, last: dict, alpha: float) -> dict:
    return {k: v + alpha * (last[k] - v) if v.is_floating_point() else last[k] for k, v in prev.items()}


def _bisect(model, processor, prev: dict, last: dict, val: list, cfg, iters: int = 8) -> dict:
    """Load the point of the segment prev -> last whose validation accuracy lies in [half_at, half_high]
    (bisection on alpha; validation is below the band at prev and above it at last), or else the closest
    one tried. Returns alpha, its validation accuracy and every (alpha, accuracy) tried."""
    from embodied.eval.loop import MCQEval, evaluate

    rc = cfg.recipes
    lo, hi, tried = 0.0, 1.0, []
    for _ in range(iters):
        alpha = (lo + hi) / 2
        model.load_state_dict(_blend(prev, last, alpha))
        acc = evaluate(model, processor, val, cfg.video, MCQEval(choice=False, progress=False))["accuracy"]
        tried.append((alpha, acc))
        if rc.half_at <= acc <= rc.half_high:
            break
        lo, hi = (alpha, hi) if acc < rc.half_at else (lo, alpha)
    alpha, acc = min(tried, key=lambda t: max(rc.half_at - t[1], t[1] - rc.half_high, 0.0))
    model.load_state_dict(_blend(prev, last, alpha))
    return {"alpha": alpha, "val_accuracy": acc, "tried": tried}


def build_start(cfg, out: Path, seed: int, progress: bool = False) -> dict:
    """One seed's half-solving start, saved in `out/start_seed<seed>/model` (or its saved row)."""
    rc = cfg.recipes
    folder = out / f"start_seed{seed}"
    key = {
        "seed": seed,
        "policy": dataclasses.asdict(cfg.policy),
        "data": dataclasses.asdict(cfg.data),
        "video": dataclasses.asdict(cfg.video),
        "sft": dataclasses.asdict(cfg.sft),
        "recipes": {
            k: getattr(rc, k)
            for k in (
                "start",
                "format_steps",
                "half_at",
                "half_high",
                "half_lr",
                "half_max_steps",
                "half_eval_examples",
            )
        },
    }

    def compute() -> dict:
        from embodied.eval.loop import MCQEval, evaluate
        from embodied.policy.model import load, load_policy, save_policy
        from embodied.train.common import seed_everything

        data = _load_data(cfg, progress)
        t0 = time.perf_counter()
        made = {"labelled_steps": 0, "interpolation": None}
        if rc.start:
            model, processor = load_policy(rc.start, cfg.policy.dtype, cfg.policy.device)
        else:
            seed_everything(seed)
            model, processor = load(cfg.policy)
            made = _half_solving(model, processor, cfg, data, seed, folder, progress)
        save_policy(model, processor, folder / "model")
        quiet = MCQEval(choice=False, progress=False)
        val = evaluate(model, processor, data["val"][: rc.eval_examples], cfg.video, quiet)
        test = evaluate(model, processor, data["test"], cfg.video, quiet)
        print(
            f"[start seed {seed}] {made['labelled_steps']} labelled steps: val {val['accuracy']:.3f}, "
            f"test {test['accuracy']:.3f}"
        )
        return {
            "seed": seed,
            "policy": str(folder / "model"),
            **made,
            "val_accuracy": round(val["accuracy"], 4),
            "test_accuracy": round(test["accuracy"], 4),
            "test_ci95": [round(x, 4) for x in test["ci95"]],
            "wall_s": round(time.perf_counter() - t0, 1),
        }

    return reuse_or_run(folder / "result.json", key, compute, f"start seed {seed}", rc.start or cfg.policy)


def start_or_arm(cfg, out: Path, seed: int, arm_path: str | None, progress: bool = False) -> dict:
    """One job of `run`: seed `seed`'s start (`arm_path` None), or one arm from that start, whose saved row
    `build_start` reads back (the start job ran first)."""
    start = build_start(cfg, out, seed, progress)
    return start if arm_path is None else run_arm(cfg, out, seed, arm_path, start, progress)


def run_arm(cfg, out: Path, seed: int, arm_path: str, start: dict, progress: bool = False) -> dict:
    """`recipes.steps` RL steps of one preset from one seed's start (or the saved row)."""
    from embodied.config import load_config

    rc = cfg.recipes
    name = Path(arm_path).stem
    arm = load_config(arm_path, base=dataclasses.replace(cfg, seed=seed))
    grpo = dataclasses.replace(
        arm.grpo, steps=rc.steps, eval_every=rc.eval_every, eval_examples=rc.eval_examples, checkpoint_every=0
    )
    folder = out / f"seed{seed}" / name
    key = {"start": start, "grpo": dataclasses.asdict(grpo), "video": dataclasses.asdict(cfg.video)}

    def compute() -> dict:
        from embodied.eval.loop import MCQEval, evaluate
        from embodied.policy.model import load_policy
        from embodied.train.common import seed_everything
        from embodied.train.grpo import train_grpo
        from embodied.train.metrics import first_reaching, read_metrics, rl_curves
        from embodied.train.state import Run

        data = _load_data(cfg, progress)
        val = data["val"][: rc.eval_examples]
        (folder / "metrics.jsonl").unlink(missing_ok=True)
        seed_everything(seed)
        model, processor = load_policy(start["policy"], cfg.policy.dtype, cfg.policy.device)
        t0 = time.perf_counter()
        train_grpo(grpo, Run(model, processor, data["train"], folder, cfg.video, val, seed, progress))
        wall = time.perf_counter() - t0
        test = evaluate(model, processor, data["test"], cfg.video, MCQEval(choice=False, progress=False))
        logged = read_metrics(folder / "metrics.jsonl")
        curves = rl_curves(logged, start["val_accuracy"]) | critic_curves(logged)
        reached = first_reaching(curves["val"], rc.target)
        print(
            f"[{name} seed {seed}] test {test['accuracy']:.3f} in {wall:.0f} s; "
            f"{rc.target} at step {reached[0]}"
        )
        return {
            "arm": name,
            "seed": seed,
            "test_accuracy": round(test["accuracy"], 4),
            "test_ci95": [round(x, 4) for x in test["ci95"]],
            "test_unparseable": round(test["unparseable"], 4),
            "steps_to_target": reached[0],
            "seconds_to_target": reached[1],
            "wall_s": round(wall, 1),
            **critic_end(curves),
            "curves": curves,
        }

    return reuse_or_run(folder / "result.json", key, compute, f"{name} seed {seed}", start["policy"])


def run(cfg, out: Path, progress: bool = True) -> dict:
    from embodied.data.build import ensure_dataset

    rc = cfg.recipes
    t0 = time.perf_counter()
    out = Path(out)
    ensure_dataset(cfg.data, progress)
    data = _load_data(cfg, progress)
    serial = (progress,)  # runs in this process show their bars; worker processes stay quiet
    # a seed's arms start as soon as its start is saved, so no worker waits for the other seeds' starts
    jobs, needs = start_and_arm_jobs(rc.seeds, rc.arms)
    done = run_jobs(start_or_arm, [(cfg, out, seed, arm) for seed, arm in jobs], rc.workers, serial, needs)
    starts, rows = done[: len(rc.seeds)], done[len(rc.seeds) :]
    result = {
        "policy": cfg.policy.path,
        "steps": rc.steps,
        "target": rc.target,
        "n_val": min(rc.eval_examples, len(data["val"])),
        "n_test": len(data["test"]),
        "starts": starts,
        "summary": summarise(rows, [Path(a).stem for a in rc.arms], rc.steps),
        "runs": rows,
        "wall_s": round(time.perf_counter() - t0, 1),
        "threads": cfg.threads,
        "workers": rc.workers,
    }
    (out / "recipes.json").write_text(json.dumps(stamped(result), indent=1))
    (out / "recipes.md").write_text(recipes_table(result))
    plot_recipes(rows, out / "recipes.png", rc.target)
    print(recipes_table(result))
    return {k: v for k, v in result.items() if k != "runs"}
