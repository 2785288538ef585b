"""A second look (issue 22): GRPO or expert iteration with multi-turn episodes (`env.turns`) on one task,
from existing starts, evaluated as success after turn 1 and after turn 2 against single-turn best-of-2 at the
same number of simulator calls.

    PYTHONPATH=. python docs/results/scripts/env_multiturn.py STARTS OUT [--stages start,multiturn,single] \\
        key=value ...

STARTS holds `seed<S>/start/model` (the format-only starts of an env-feedback run made with the same
`env.answer`); every seed of `env_feedback.seeds` is trained with GRPO on the training episodes of
`env.tasks` with `env.turns` turns (`configs/experiment_env_feedback.yaml` underneath, then the overrides)
and evaluated on the held-out episodes: greedy turns (success after each turn, Wilson intervals over
episodes), `env_feedback.test_time_samples` sampled trajectories per episode, and single-turn best-of-k from
as many single-turn samples (pass@k, t intervals over episodes), with the paired differences per seed:
sampled turn 2 minus turn 1 and minus best-of-2 (`eval.env_stats.turn_summary`'s `paired`, t intervals over
episodes). STARTS'
`seed<S>/sim/model`, when present, is evaluated the same way (`--stages single`: the single-turn-trained
policy asked twice). `--stages expert` runs multi-turn expert iteration (`expert:`,
`train.expert_targets.select_turns`) from the start instead of GRPO. `--stages start` on a STARTS folder whose
`seed<S>/start/model` links to trained policies evaluates them (e.g. on a larger held-out set: `env.root`).
With `env.turns=1` the stages train and evaluate single-turn (greedy success is `success@1`; e.g. `--stages
expert` measures an `expert.*` setting from the same starts).
Writes `OUT/seed<S>/<stage>/` (metrics, model, predictions) and `OUT/summary.json`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from embodied.config import load_config
from embodied.data.load import load_examples
from embodied.envs import answer_examples
from embodied.envs.config import Turns
from embodied.eval.env_loop import EnvEval, evaluate_env
from embodied.eval.stats import seed_interval
from embodied.experiments.config import EnvFeedbackRun
from embodied.policy.model import load_policy, save_policy
from embodied.rl.rewards import rewards_for
from embodied.train.common import seed_everything
from embodied.train.expert import train_expert_config
from embodied.train.grpo import train_grpo
from embodied.train.state import Run


def evaluate(model, processor, test, cfg) -> dict:
    fb = cfg.env_feedback
    t = time.perf_counter()
    res = evaluate_env(
        model,
        processor,
        test,
        cfg.video,
        EnvEval(
            cfg.env.backend, cfg.eval.batch_size, cfg.eval.max_new_tokens, cfg.env.format_weight,
            samples=fb.test_time_samples, k=list(range(1, cfg.env.turns + 1)), seed=cfg.seed,
            turns=Turns.of(cfg.env),
        ),
    )  # fmt: skip
    res["eval_s"] = round(time.perf_counter() - t, 1)
    if "turns" not in res:  # env.turns=1 (single-turn expert or GRPO): the greedy success is turn 1's
        res["turns"] = {"greedy": {"success@1": {"rate": res["success"], "ci95": res["ci95"]}, "calls": 1.0}}
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("starts")
    ap.add_argument("out")
    ap.add_argument("--stages", default="start,multiturn,single")
    ap.add_argument(
        "--resume",
        action="store_true",
        help="expert: continue OUT/seed<S>/expert from its last round (a finished expert stage too, e.g. "
        "with more expert.rounds); without it a stage already in OUT/summary.json is skipped",
    )
    ap.add_argument("overrides", nargs="*")
    a, rest = ap.parse_known_args()
    a.overrides = a.overrides + rest
    cfg = load_config("configs/experiment_env_feedback.yaml", a.overrides, schema=EnvFeedbackRun)
    Turns.of(cfg.env)  # invalid turn settings fail here, before any work
    torch.set_num_threads(cfg.threads)
    out, starts, stages = Path(a.out), Path(a.starts), a.stages.split(",")
    fps, mf = cfg.video.fps, cfg.video.max_frames
    load = lambda split: [  # noqa: E731
        e
        for e in answer_examples(load_examples(cfg.env.root, split, fps, mf)[0], cfg.env.answer)
        if e.record["task"] in cfg.env.tasks
    ]
    train, test = load("train"), load("test")
    summary_path = out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {"runs": {}}
    summary["config"] = {
        "overrides": a.overrides,
        "starts": str(starts),
        "train": len(train),
        "test": len(test),
        "threads": torch.get_num_threads(),
    }
    for seed in cfg.env_feedback.seeds:
        c = dataclasses.replace(cfg, seed=seed)
        for stage in stages:
            key = f"seed{seed}/{stage}"
            if key in summary["runs"] and not (a.resume and stage == "expert"):
                continue
            folder = {"start": "start", "multiturn": "start", "expert": "start", "single": "sim"}[stage]
            src = starts / f"seed{seed}" / folder / "model"
            if not src.exists():
                print(f"{key}: no {src}, skipped")
                continue
            seed_everything(seed)
            model, processor = load_policy(src, cfg.policy.dtype, cfg.policy.device)
            stage_dir = out / f"seed{seed}" / stage
            stage_dir.mkdir(parents=True, exist_ok=True)
            row = {"model": str(src)}
            if stage in ("multiturn", "expert"):  # train from the start, then evaluate below
                t = time.perf_counter()
                if stage == "expert":  # a fresh run drops the folder's earlier rows and checkpoints itself
                    resume = "auto" if a.resume else ""
                    row["expert"] = train_expert_config(
                        c, Run(model, processor, train, stage_dir, resume=resume)
                    )
                else:
                    (stage_dir / "metrics.jsonl").unlink(missing_ok=True)
                    grpo = dataclasses.replace(cfg.grpo, checkpoint_every=0)
                    how = {"reward_fn": rewards_for(cfg), "turns": Turns.of(cfg.env)}
                    train_grpo(grpo, Run(model, processor, train, stage_dir, cfg.video, seed=seed, **how))
                row["train_s"] = round(time.perf_counter() - t, 1)
                save_policy(model, processor, stage_dir / "model")
            res = evaluate(model, processor, test, c)
            (stage_dir / "predictions.json").write_text(json.dumps(res, indent=1, default=float))
            row |= {"turns": res["turns"], "eval_s": res["eval_s"], "success": res["success"]}
            if "paired" in res["turns"]:
                row["paired"] = res["turns"]["paired"]
            summary["runs"][key] = row
            summary_path.write_text(json.dumps(summary, indent=1, default=float))
            g = res["turns"]["greedy"]
            print(key, {k: v for k, v in g.items()}, res["turns"].get("sampled"), res["turns"].get("best_of"))
    # over seeds: mean with a 95% t interval of each figure
    over = {}
    for stage in stages:
        rows = [summary["runs"].get(f"seed{s}/{stage}") for s in cfg.env_feedback.seeds]
        rows = [r for r in rows if r]
        if not rows:
            continue
        figs = {}
        for part in ("greedy", "sampled", "best_of"):
            for name in rows[0]["turns"].get(part, {}):
                if name == "calls":
                    figs[f"{part}/calls"] = sum(r["turns"][part]["calls"] for r in rows) / len(rows)
                    continue
                vals = [r["turns"][part][name]["rate"] for r in rows]
                figs[f"{part}/{name}"] = {"per_seed": vals, "mean_ci95": list(seed_interval(vals))}
        for name in rows[0].get("paired", {}):
            vals = [r["paired"][name][0] for r in rows]
            figs[f"paired/{name}"] = {"per_seed": vals, "mean_ci95": list(seed_interval(vals))}
        over[stage] = {"seeds": len(rows), **figs}
    summary["over_seeds"] = over
    summary_path.write_text(json.dumps(summary, indent=1, default=float))


if __name__ == "__main__":
    main()
