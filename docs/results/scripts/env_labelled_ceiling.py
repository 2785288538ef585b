"""How far does the tiny policy get on an interactive task when SFT gives it the physics' own answer?

Reinforcement learning can only find what the policy can express and see. This control fine-tunes a
format-only start (an env-feedback `start`) on one task's training episodes with the task's calibrated
answer as the target (`good_action`: computed from the scene, the label no RL arm ever gets), then executes
its greedy answers to the held-out episodes in MuJoCo, against the best constant answer. If labelled SFT
cannot beat the constant, the task is out of reach at this scale whatever the reward
(docs/results/env_feedback.md, "Expert iteration against GRPO")::

    python docs/results/scripts/env_labelled_ceiling.py -c configs/experiment_env_feedback.yaml --task push \\
        --start runs/env_feedback/seed{seed}/start/model --seeds 0 1 2 --steps 300 --out ceiling.json

With ``env.answer=grid`` the task is asked as lettered options and the target is the option that scores the
highest ``reward/total`` when MuJoCo executes every option of the episode (the grid's own best answer), and
the best constant is recomputed over numbers and letters on the held-out episodes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import time
from pathlib import Path

import torch

from embodied.config import load_config
from embodied.data.load import load_examples
from embodied.envs import answer_examples, answer_text, grid_action, task
from embodied.envs.reward import env_reward
from embodied.eval.env_baselines import best_constant
from embodied.eval.env_loop import EnvEval, evaluate_env
from embodied.experiments.config import EnvFeedbackRun
from embodied.experiments.reuse import code_hash, folder_weights_hash
from embodied.policy.model import load_policy
from embodied.train.common import seed_everything
from embodied.train.sft import train_sft
from embodied.train.state import Run


def label(name: str, mod, record: dict) -> str:
    """The SFT target: the calibrated action, or in grid form the option MuJoCo scores highest."""
    grid = record["meta"].get("answer_grid")
    if grid is None:
        return answer_text(name, mod.good_action(record))
    texts = [answer_text(name, grid_action(a), record) for a in grid]
    totals = [t["reward/total"] for t in env_reward(texts, [record] * len(texts))]
    return texts[max(range(len(texts)), key=totals.__getitem__)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-c", "--config", action="append", required=True)
    p.add_argument("--task", required=True, help="the interactive task (its module must define good_action)")
    p.add_argument("--start", required=True, help="the start's model folder; {seed} is replaced per seed")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--out", required=True)
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    cfg = load_config(args.config, args.overrides, schema=EnvFeedbackRun)
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    mod = task(args.task)
    if not hasattr(mod, "good_action"):
        raise SystemExit(f"task {args.task} defines no good_action(record): no label to fine-tune on")
    fps, mf = cfg.video.fps, cfg.video.max_frames
    form = cfg.env.answer
    train, test = (
        [
            e
            for e in answer_examples(load_examples(cfg.env.root, split, fps, mf)[0], form)
            if e.record["task"] == args.task
        ]
        for split in ("train", "test")
    )
    if not train or not test:
        raise SystemExit(f"{cfg.env.root}: no {args.task} episodes in train or test; generate them first")
    labels = {e.record["id"]: label(args.task, mod, e.record) for e in train}
    saved = json.loads((Path(cfg.env.root) / "best_constant.json").read_text())
    if saved["key"].get("env", {}).get("answer", "number") == form:
        constant = saved["row"][args.task]
    else:  # made for the other answer form: the constant letter must be tried too
        constant = best_constant([e.record for e in test], cfg.env.backend)[args.task]
    sft = dataclasses.replace(cfg.sft, steps=args.steps, eval_every=0, checkpoint_every=0, targets="answer")
    rows = []
    for seed in args.seeds:
        seed_everything(seed)
        start = Path(args.start.format(seed=seed))
        model, processor = load_policy(start, cfg.policy.dtype, cfg.policy.device)
        t0 = time.perf_counter()
        out = Path(args.out).with_suffix("") / f"seed{seed}"
        train_sft(
            sft, Run(model, processor, train, out, cfg.video, seed=seed), target_fn=lambda r: labels[r["id"]]
        )
        wall = time.perf_counter() - t0
        how = EnvEval(cfg.env.backend, cfg.eval.batch_size, cfg.eval.max_new_tokens)
        res = evaluate_env(model, processor, test, cfg.video, how)
        fig = res["per_task"][args.task]
        rows.append(
            {
                "seed": seed,
                "start_weights": folder_weights_hash(start),
                "success": fig["success"],
                "ci95": fig["ci95"],
                "unparseable": fig["unparseable"],
                "spread": fig["spread"],
                "above_constant": fig["ci95"][0] > constant["ci95"][1],
                "sft_s": round(wall, 1),
            }
        )
        print(json.dumps(rows[-1]))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
    summary = {
        "task": args.task,
        "what": "labelled SFT (targets: the task's good_action, or in grid form the option MuJoCo scores "
        "highest) from the format-only start, greedy, held out",
        "answer": form,
        "steps": args.steps,
        "n_train": len(train),
        "n_test": len(test),
        "best_constant": {k: constant[k] for k in ("answer", "success", "ci95")},
        "code": {"commit": commit.strip(), "code_hash": code_hash()},
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(summary, indent=1, default=float))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
