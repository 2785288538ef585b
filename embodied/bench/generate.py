"""`embodied bench generate`: data-engine throughput against the raw renderer, and memory over a long run.

Measured side by side in one run (these machines are shared and noisy): the renderer's raw frames per
second on the drop scene (one process, `render()` alone, no physics, no encoding), then the whole pipeline
(`generate` with `data.workers` processes: physics, rendering of the sampled frames only, H.264 encoding,
JSONL), arrow-of-time clips of 8 frames at 2 fps, 128x128, then the raw renderer again. Clips per second,
the pipeline's frames per second over the raw renderer's (`pipeline_vs_raw`, all workers together; also
per worker), and the resident memory of the main process plus its workers sampled every 0.5 s (flat = no
growth from the first tenth of the run to the end).

Size: `data.n_train` clips (default 3000; `data.n_train=10000` for the memory check). Written to a
temporary folder under `run_dir`, deleted afterwards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np

from embodied.questions import FamilySpec

FRAMES, FPS, SIZE = 8, 2.0, 128
TARGETS = {"clips_per_s": 20, "pipeline_vs_raw": 0.8}
"""Issue targets on 2 cores: clips per second, and the whole pipeline's frames per second (all workers)
over the raw renderer's (one process): 0.5 at first, 0.8 since issue 25 (not met: docs/benchmarks.md)."""
RAW_SECONDS = 3.0
"""Seconds spent timing the raw renderer, before and after the pipeline."""


def raw_render_fps(seconds: float = RAW_SECONDS, seeds: int = 8) -> float:
    """Frames per second of `DropWorld.render()` alone at 128x128 on random drop scenes."""
    from embodied.worlds import DropWorld

    world = DropWorld(SIZE, SIZE)
    try:
        n, spent = 0, 0.0
        for s in range(seeds):
            world.reset(s)
            for _ in range(3):  # a few states per scene: objects in flight and at rest
                world.step()
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds / seeds:
                world.render()
                n += 1
            spent += time.perf_counter() - t0
        return n / spent
    finally:
        world.close()


def per_clip_ms(n: int = 20) -> dict:
    """Where one clip's time goes, in this process: scene reset (compile + renderer rebind), `record` of the
    8 sampled frames (physics from release plus rendering), and H.264 encoding."""
    import tempfile

    from embodied.video import write_video
    from embodied.worlds import DropWorld

    world = DropWorld(SIZE, SIZE)
    spent = {"reset": 0.0, "record": 0.0, "encode": 0.0}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(n):
                rng = np.random.default_rng(10_000 + i)
                t0 = time.perf_counter()
                world.reset(rng)
                t1 = time.perf_counter()
                frames = world.record(float(rng.uniform(0, 0.25)) + np.arange(FRAMES) / FPS)
                t2 = time.perf_counter()
                write_video(Path(tmp) / "clip.mp4", frames, FPS)
                t3 = time.perf_counter()
                for k, dt in zip(spent, (t1 - t0, t2 - t1, t3 - t2)):
                    spent[k] += dt
    finally:
        world.close()
    return {k: round(1000 * v / n, 1) for k, v in spent.items()}


class MemorySampler:
    """Resident set size (MB) of this process plus its children, sampled every `period` s in a thread."""

    def __init__(self, period: float = 0.5) -> None:
        import psutil

        self.proc, self.period, self.samples = psutil.Process(os.getpid()), period, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _rss(self) -> tuple[float, float]:
        """(this process, its children) in MB."""
        children = 0
        for child in self.proc.children(recursive=True):
            with contextlib.suppress(Exception):  # a worker may exit between listing and reading
                children += child.memory_info().rss
        return self.proc.memory_info().rss / 2**20, children / 2**20

    def _run(self) -> None:
        t0 = time.perf_counter()
        while not self._stop.is_set():
            self.samples.append((time.perf_counter() - t0, *self._rss()))
            self._stop.wait(self.period)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict:
        """Mean RSS over the 10-20% and 90-100% stretches of the run (after workers warmed up) and growth."""
        if len(self.samples) < 10:
            return {"samples": len(self.samples)}
        a = np.array(self.samples)
        t, end = a[:, 0], a[-1, 0]
        early, late = (t >= 0.1 * end) & (t <= 0.2 * end), t >= 0.9 * end
        out: dict = {"samples": len(a)}
        for name, col in (("main", a[:, 1]), ("workers", a[:, 2]), ("total", a[:, 1] + a[:, 2])):
            out[name] = {
                "rss_mb_10_20pct": round(float(col[early].mean()), 1),
                "rss_mb_90_100pct": round(float(col[late].mean()), 1),
                "rss_mb_max": round(float(col.max()), 1),
                "growth_mb": round(float(col[late].mean() - col[early].mean()), 1),
            }
        return out


def run(cfg, out: Path, progress: bool = True) -> dict:
    from embodied.data.build import generate_dataset

    n = cfg.data.n_train
    data = dataclasses.replace(
        cfg.data,
        root=str(out / "bench_data"),
        n_train=n,
        n_val=0,
        n_test=0,
        width=SIZE,
        height=SIZE,
        clip=dataclasses.replace(cfg.data.clip, fps=FPS, num_frames=FRAMES),
        families=[FamilySpec(family="arrow_of_time", scene="drop", num_frames=FRAMES)],
        benchmark=False,
        from_videos="",
        sheets=False,
    )
    raw_before = raw_render_fps(RAW_SECONDS)
    with MemorySampler() as mem:
        t0 = time.perf_counter()
        manifest = generate_dataset(data, progress=progress)
        wall = time.perf_counter() - t0
    raw_after = raw_render_fps(RAW_SECONDS)
    shutil.rmtree(data.root, ignore_errors=True)
    breakdown = per_clip_ms()
    breakdown["render_8_frames_at_raw_rate"] = round(1000 * FRAMES / raw_after, 1)
    raw = (raw_before + raw_after) / 2
    clips_s = n / wall
    workers = max(1, data.workers)
    return {
        "clips": n,
        "frames_per_clip": FRAMES,
        "fps": FPS,
        "resolution": [SIZE, SIZE],
        "workers": data.workers,
        "cpu_count": os.cpu_count(),
        "clips_per_s": round(clips_s, 2),
        "pipeline_frames_per_s": round(clips_s * FRAMES, 1),
        "raw_render_fps": round(raw, 1),
        "raw_render_fps_before_after": [round(raw_before, 1), round(raw_after, 1)],
        "pipeline_vs_raw": round(clips_s * FRAMES / raw, 3),
        "pipeline_vs_raw_per_worker": round(clips_s * FRAMES / workers / raw, 3),
        "wall_s": round(wall, 2),
        "per_clip_ms_one_process": breakdown,
        "skipped": manifest["skipped"]["count"],
        "memory": mem.summary(),
        "targets": TARGETS,
        "meets_targets": clips_s >= TARGETS["clips_per_s"]
        and clips_s * FRAMES / raw >= TARGETS["pipeline_vs_raw"],
    }
