"""Scene-family throughput: episodes per second for reset + one arrow-of-time clip, per world.

`embodied bench worlds`: for each registered world, `reset(seed)` then `record` 8 frames at 2 fps
(128x128, the data engine's clip) from the start of its motion interval, in this one process (one
core). Reports episodes/s and the split between reset (model compile + physics rollout + renderer
rebind) and rendering. The data engine's target is >= 20 clips/s on 2 cores, i.e. <= ~80 ms per
clip on one core. Numbers are measured side by side in one run because the machines are shared.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

N_EPISODES = 20
WIDTH = HEIGHT = 128
CLIP = np.arange(8) / 2.0  # 8 frames at 2 fps


def measure(name: str, n: int = N_EPISODES, difficulty: str | None = None) -> dict[str, float]:
    """Time `n` episodes of world `name` (after one warm-up episode)."""
    from embodied.worlds import make_world

    kwargs = {} if difficulty is None else {"difficulty": difficulty}
    world = make_world(name, width=WIDTH, height=HEIGHT, **kwargs)
    world.reset(10_000)
    world.record(CLIP)
    t_reset = t_render = 0.0
    for seed in range(n):
        t0 = time.perf_counter()
        _, info = world.reset(seed)
        t1 = time.perf_counter()
        start = info.get("motion", [0.0, 0.0])[0]
        world.record(start + CLIP)
        t_render += time.perf_counter() - t1
        t_reset += t1 - t0
    world.close()
    total = t_reset + t_render
    return {
        "episodes_per_s": round(n / total, 2),
        "ms_per_episode": round(1e3 * total / n, 1),
        "ms_reset": round(1e3 * t_reset / n, 1),
        "ms_record": round(1e3 * t_render / n, 1),
    }


def run(cfg: Any, out: Path, progress: bool = True) -> dict:
    """Measure every registered world; `cfg` is unused (fixed clip: 8 frames, 2 fps, 128x128)."""
    del cfg, out
    from embodied.worlds import WORLDS

    result = {}
    for name in sorted(WORLDS):
        result[name] = measure(name)
        if progress:
            print(name, result[name], flush=True)
    return {"clip": {"frames": len(CLIP), "fps": 2, "size": [WIDTH, HEIGHT]}, "worlds": result}
