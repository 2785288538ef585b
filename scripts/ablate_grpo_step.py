"""Seconds per GRPO step with and without issue 25's two last cuts, side by side in one process.

The workload of `embodied bench grpo-vs-trl` (16 simulated arrow-of-time clips as 4 images each, 4 prompts x
G=8, 32 new tokens, KL 0.04; `bench.grpo_vs_trl.WORKLOAD`), four arms in interleaved blocks whose order
rotates every round, the first step of every block untimed:

- `base`: the patch embedding as the library's Conv3d, `grpo.ref_cache_mb=0`;
- `matmul`: the patch embedding as a matrix product (`policy.model.patch_embedding_as_matmul`);
- `cache`: the reference policy's prompt passes kept across steps (`grpo.ref_cache_mb`);
- `both`: the two together (the default).

    python scripts/ablate_grpo_step.py --rounds 3 --steps 5 --out runs/ablate_grpo_step.json
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

ARMS = ("base", "matmul", "cache", "both")


def conv_patch_embedding(model) -> None:
    """Undo `patch_embedding_as_matmul`: the library's own class (and Conv3d forward) again."""
    embed = model.model.visual.patch_embed
    embed.__class__ = type(embed).__mro__[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5, help="steps per block, the first one untimed")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="runs/ablate_grpo_step.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from embodied.bench.grpo_vs_trl import WORKLOAD, as_images, simulate_examples
    from embodied.config import load_config
    from embodied.policy.model import load_policy, resolve_policy_path
    from embodied.train.grpo import train_grpo

    cfg = load_config(None, ["policy.path=tiny"])
    grpo = dataclasses.replace(cfg.grpo, **WORKLOAD, steps=args.steps, log_every=1, eval_every=0)
    examples = as_images(simulate_examples(16, cfg.seed))
    model, processor = load_policy(resolve_policy_path(cfg.policy.path, cfg.policy.tiny_seed))
    models = {arm: copy.deepcopy(model) for arm in ARMS}
    for arm in ("base", "cache"):
        conv_patch_embedding(models[arm])
    cache_mb = {"base": 0.0, "matmul": 0.0, "cache": 256.0, "both": 256.0}
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for arm in ARMS[r % 4 :] + ARMS[: r % 4]:
                out = Path(tmp) / f"{arm}{r}"
                run = dataclasses.replace(grpo, ref_cache_mb=cache_mb[arm])
                t0 = time.perf_counter()
                train_grpo(models[arm], processor, examples, run, cfg.video, out, seed=r, progress=False)
                rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
                steps = [row["time/step"] for row in rows if "time/step" in row][1:]
                times[arm] += steps
                print(
                    f"round {r} {arm}: median {statistics.median(steps):.3f} s/step "
                    f"({time.perf_counter() - t0:.1f} s)",
                    flush=True,
                )
    medians = {arm: statistics.median(t) for arm, t in times.items()}
    result = {
        "workload": WORKLOAD | {"prompts": 16, "images_per_prompt": 4, "threads": args.threads},
        "rounds": args.rounds,
        "timed_steps_per_arm": len(times["base"]),
        "median_s": medians,
        "over_base": {arm: round(medians[arm] / medians["base"], 3) for arm in ARMS},
        "steps_s": times,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps({k: result[k] for k in ("median_s", "over_base")}, indent=2))


if __name__ == "__main__":
    main()
