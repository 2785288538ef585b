"""`embodied bench envs`: simulator-reward throughput per task and backend, and CPU/Warp parity.

The same answers to the same episodes go through `embodied.envs.reward.env_reward` on the CPU backend and on
the Warp backend (one batch per task); the JSON holds episodes/s for each (end to end: parse, build the
world, simulate, score; Warp without its one-off kernel compilation) and how often the two agree on the
success label. Settings: `env.tasks`, `env.difficulty`, `env.bench_episodes`, `seed`.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from embodied.envs.parity import parity


def run(cfg, out: Path, progress: bool = True) -> dict:
    result = parity(cfg.env.bench_episodes, cfg.seed, cfg.env.difficulty, tuple(cfg.env.tasks))
    result["machine"] = {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()}
    if progress:
        for name, r in result["per_task"].items():
            eps = r["episodes_per_s"]
            print(
                f"{name:6s} n={r['n']:4d} agree {r['agree_rate']:.1%}  episodes/s cpu {eps['cpu']:.1f}  "
                f"warp ({result['warp_device']}) {eps['warp']:.1f}"
            )
    return result
