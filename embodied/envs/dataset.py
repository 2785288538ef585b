"""Interactive episodes on disk, in the MCQ dataset format (JSONL records + mp4 clips).

Layout under ``env.root``: ``manifest.json``, ``train.jsonl``, ``test.jsonl``, ``videos/<split>/<id>.mp4``.
``embodied.datasets.load_examples(root, split)`` loads them like any generated dataset; the records
carry no label (``answer`` is "") and ``meta`` holds what is needed to rebuild the world.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from dataclasses import asdict
from pathlib import Path

from tqdm.auto import tqdm

from embodied.datasets import _write_jsonl, manifest_matches, split_seeds
from embodied.envs import task
from embodied.envs.config import EnvConfig
from embodied.video import write_video

SPLITS = ("train", "test")


def _make(job: tuple) -> dict:
    root, split, name, index, seed, difficulty, width, height, num_frames, fps = job
    record, frames = task(name).make_episode(seed, difficulty, width, height, num_frames, fps)
    rid = f"{split}-{name}-{index:05d}"
    rel = f"videos/{split}/{rid}.mp4"
    write_video(Path(root) / rel, frames, fps)
    return {"id": rid, "task": name, "video": rel, **{k: v for k, v in record.items() if k != "task"}}


def episode_jobs(cfg: EnvConfig) -> list[tuple]:
    """One job per episode: every task and split draws seeds from its own stream."""
    jobs = []
    for split, n in (("train", cfg.n_train), ("test", cfg.n_test)):
        for name in cfg.tasks:
            task(name)  # fail early on an unknown task name
            seeds = split_seeds(cfg.seed, f"env-{name}-{split}", n)
            args = (cfg.difficulty, cfg.width, cfg.height, cfg.num_frames, cfg.fps)
            jobs += [(cfg.root, split, name, i, s, *args) for i, s in enumerate(seeds)]
    return jobs


def generate_episodes(cfg: EnvConfig, progress: bool = True) -> dict:
    """Write the train and test episodes of ``cfg`` under ``cfg.root``; returns the manifest."""
    root = Path(cfg.root)
    root.mkdir(parents=True, exist_ok=True)
    jobs = episode_jobs(cfg)
    t0 = time.perf_counter()
    records = []
    bar = tqdm(total=len(jobs), desc="episodes", unit="clip", disable=not progress)
    if cfg.workers > 0:
        with mp.get_context("spawn").Pool(cfg.workers) as pool:  # GL contexts do not survive fork
            for rec in pool.imap(_make, jobs, chunksize=8):
                records.append(rec)
                bar.update()
    else:
        for job in jobs:
            records.append(_make(job))
            bar.update()
    bar.close()
    for split in SPLITS:
        _write_jsonl(root / f"{split}.jsonl", [r for r in records if r["id"].startswith(f"{split}-")])
    wall = time.perf_counter() - t0
    manifest = {
        "generator": "embodied.envs.dataset.generate_episodes",
        "tasks": list(cfg.tasks),
        "counts": {
            s: {t: sum(r["id"].startswith(f"{s}-{t}-") for r in records) for t in cfg.tasks} for s in SPLITS
        },
        "config": asdict(cfg),
        "wall_s": round(wall, 2),
    }
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return manifest


def matches(cfg: EnvConfig) -> bool:
    """Whether ``cfg.root`` already holds episodes generated with this config (so they can be reused)."""
    return manifest_matches(cfg.root, asdict(cfg), {"workers", "backend", "format_weight", "feedback"})
