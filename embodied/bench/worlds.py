"""Scene-family throughput: episodes per second for reset + one arrow-of-time clip, per world.

`embodied bench worlds`: for each registered world, `reset(seed)` then `record` 8 frames at 2 fps
(128x128, the data engine's clip) from the start of its motion interval, in this one process.
Reports CPU milliseconds per episode and their split between reset (model compile + physics rollout
+ renderer rebind) and record (state restores + rendering). The data engine's target is >= 20
clips/s on 2 cores, i.e. <= ~80 ms per clip on one core. Worlds are measured round-robin in one run
because the machines are shared and their load changes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

N_EPISODES = 20
WIDTH = HEIGHT = 128
CLIP = np.arange(8) / 2.0  # 8 frames at 2 fps


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def measure(names: list[str], n: int = N_EPISODES) -> dict[str, dict[str, float]]:
    """Time `n` episodes per world, round-robin (one episode of each world per round) so that all
    worlds see the same machine load; after one warm-up episode each.

    CPU time (this process, all threads: Mesa's software renderer may use several) is the number
    to compare with the per-core target; wall time is also reported.
    """
    from embodied.worlds import make_world

    worlds = {name: make_world(name, width=WIDTH, height=HEIGHT) for name in names}
    for w in worlds.values():
        w.reset(10_000)
        w.record(CLIP)
    acc = {name: np.zeros(4) for name in names}  # wall reset, cpu reset, wall record, cpu record
    for seed in range(n):
        for name, world in worlds.items():
            w0, c0 = _clock()
            _, info = world.reset(seed)
            w1, c1 = _clock()
            world.record(info.get("motion", [0.0, 0.0])[0] + CLIP)
            w2, c2 = _clock()
            acc[name] += [w1 - w0, c1 - c0, w2 - w1, c2 - c1]
    result = {}
    for name, (wr, cr, wc, cc) in acc.items():
        worlds[name].close()
        result[name] = {
            "episodes_per_cpu_s": round(float(n / (cr + cc)), 2),
            "cpu_ms_per_episode": round(float(1e3 * (cr + cc) / n), 1),
            "cpu_ms_reset": round(float(1e3 * cr / n), 1),
            "cpu_ms_record": round(float(1e3 * cc / n), 1),
            "wall_ms_per_episode": round(float(1e3 * (wr + wc) / n), 1),
        }
    return result


def run(cfg: Any, out: Path, progress: bool = True) -> dict:
    """Measure every registered world; `cfg` is unused (fixed clip: 8 frames, 2 fps, 128x128)."""
    del cfg, out
    from embodied.worlds import WORLDS

    result = measure(sorted(WORLDS))
    if progress:
        for name, row in result.items():
            print(name, row, flush=True)
    return {"clip": {"frames": len(CLIP), "fps": 2, "size": [WIDTH, HEIGHT]}, "worlds": result}
