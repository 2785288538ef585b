"""Trained env-feedback policies and the best constant answer on more held-out episodes than the default's.

    PYTHONPATH=. python docs/results/scripts/env_heldout.py MODEL [MODEL ...] --n 200 --out F.json \\
        [key=value ...]

The held-out episodes are the default's own stream (`env.seed`, `configs/experiment_env_feedback.yaml`
underneath, then the overrides) at `--n` episodes per task, generated into `--root` if it does not hold them
already. Per-record seeds are prefix-stable (`data.schema.split_seeds`), so the first `env.n_test` (60) of
them are the default's held-out episodes and the rest are new. Each MODEL (a saved policy folder, e.g.
`runs/env_feedback/seed0/expert/model`) is evaluated greedily, as the experiment does
(`eval.env_loop.evaluate_env`), and the best constant is chosen on the same episodes
(`eval.env_baselines.best_constant`). The JSON
holds, per model, its weights hash and per-task success with Wilson intervals, and whether each interval lies
wholly above the best constant's.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from embodied.config import load_config
from embodied.data.episodes import ensure_episodes
from embodied.data.load import load_examples
from embodied.envs import answer_examples
from embodied.eval.env_baselines import best_constant
from embodied.eval.env_loop import EnvEval, evaluate_env
from embodied.experiments.config import EnvFeedbackRun
from embodied.experiments.reuse import folder_weights_hash
from embodied.policy.model import load_policy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="+", help="policy folders, then any key=value overrides")
    ap.add_argument("--n", type=int, default=200, help="held-out episodes per task")
    ap.add_argument("--root", default="data/generated/env_heldout{n}")
    ap.add_argument("--out", required=True)
    a = ap.parse_intermixed_args()
    root = a.root.format(n=a.n)
    overrides = [m for m in a.models if "=" in m]
    models = [m for m in a.models if "=" not in m]
    cfg = load_config(
        "configs/experiment_env_feedback.yaml",
        [*overrides, f"env.root={root}", "env.n_train=0", f"env.n_test={a.n}"],
        schema=EnvFeedbackRun,
    )
    torch.set_num_threads(cfg.threads)
    ensure_episodes(cfg.env)
    examples = answer_examples(
        load_examples(root, "test", cfg.video.fps, cfg.video.max_frames)[0], cfg.env.answer
    )
    t = time.perf_counter()
    constant = best_constant([e.record for e in examples], cfg.env.backend, True, cfg.env_feedback.workers)
    out = {
        "root": root,
        "episodes_per_task": a.n,
        "env_seed": cfg.env.seed,
        "best_constant": constant,
        "best_constant_s": round(time.perf_counter() - t, 1),
        "models": {},
    }
    for path in models:
        t = time.perf_counter()
        model, processor = load_policy(path, cfg.policy.dtype, cfg.policy.device)
        how = EnvEval(cfg.env.backend, cfg.eval.batch_size, cfg.eval.max_new_tokens, cfg.env.format_weight)
        res = evaluate_env(model, processor, examples, cfg.video, how, progress=True)
        tasks = {
            name: {
                "success": r["success"],
                "ci95": r["ci95"],
                "above_constant": r["ci95"][0] > constant[name]["ci95"][1],
                "spread": r.get("spread"),
            }
            for name, r in res["per_task"].items()
        }
        out["models"][path] = {
            "weights": folder_weights_hash(path),
            "eval_s": round(time.perf_counter() - t, 1),
            "per_task": tasks,
        }
        print(path, {k: (round(v["success"], 3), v["above_constant"]) for k, v in tasks.items()}, flush=True)
    Path(a.out).write_text(json.dumps(out, indent=1, default=float))


if __name__ == "__main__":
    main()
