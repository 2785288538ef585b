"""The data engine: every dataset on disk is made here, whatever its source.

A source (simulated question families, the quickstart's arrow of time, user videos, interactive episodes)
plans its jobs up front and makes one job at a time; the engine runs the jobs in spawned worker processes
(or in this one), and streams what they made into the split files through one writer. Every dataset gets
the same manifest (counts and answer letters per family and tier, versions, a content hash of raw frames and
records, the config) and the same dataset card and contact sheets.

A job's records are stored where they are made (the worker encodes the mp4), so the main process holds
only what the manifest needs: memory stays flat however many clips.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing as mp
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from embodied.data.schema import FORMAT_VERSION, kind
from embodied.registry import carried, restore
from embodied.video import write_video

GENERATOR = "embodied.data.engine"

Made = tuple[dict | None, str]
"""One result of a job: `(record, content digest)` once stored, or `(None, why it could not be made)`."""


class Source:
    """What a dataset is made from. A subclass sets the attributes, plans `jobs()` and makes one job in
    `make(job)` (in a worker process: it must be picklable before its first `make`)."""

    name = ""
    """Manifest `source`: families | quickstart | from_videos | episodes."""
    chunksize = 8
    """Jobs handed to a worker at a time."""

    def __init__(self, cfg: Any, root: str, splits: list[str], workers: int, sheets: bool = False) -> None:
        self.cfg, self.root, self.splits = cfg, Path(root), splits
        self.workers, self.sheets = workers, sheets
        self.worlds: dict[str, Any] = {}  # per process: one world (and GL context) per scene, reused

    def jobs(self) -> list:
        raise NotImplementedError

    def make(self, job: Any) -> list[Made]:
        raise NotImplementedError

    def versions(self, kinds: list[str]) -> dict[str, int]:
        """Generator version of each question family in the dataset (bumped whenever a seed makes something
        else)."""
        from embodied.questions import family

        return {f: family(f).VERSION for f in kinds}

    def extra(self) -> dict:
        """Source-specific manifest fields (seed streams, families, refusals ...)."""
        return {}

    def world(self, scene: str, width: int, height: int, **kwargs: Any):
        """This process's world for `scene`, built on first use."""
        if scene not in self.worlds:
            from embodied.worlds import make_world

            self.worlds[scene] = make_world(scene, width=width, height=height, **kwargs)
        return self.worlds[scene]

    def close(self) -> None:
        for world in self.worlds.values():
            world.close()
        self.worlds.clear()


# --- running jobs ---------------------------------------------------------------------------------------

_WORKER: dict = {}  # in a worker process: the source it makes jobs of


def _start_worker(source: Any, registered: list) -> None:
    """A fresh worker knows only the shipped plugins: it registers again what the parent registered."""
    restore(registered)
    _WORKER["source"] = source


def _make_in_worker(job: Any) -> Any:
    return _WORKER["source"].make(job)


@contextlib.contextmanager
def light_spawn():
    """Start spawned workers without re-importing the parent's `__main__`.

    `spawn` re-runs the main module in every child (as `__mp_main__`). Under `embodied generate` that is
    `embodied.cli`, whose imports pull in torch and transformers: ~700 MB and seconds of start-up per
    worker that only simulates and renders. The workers' functions live in importable modules, so hiding
    the main module's origin while the pool starts is safe."""
    main = sys.modules.get("__main__")
    saved = {k: getattr(main, k) for k in ("__spec__", "__file__") if main is not None and hasattr(main, k)}
    try:
        for k in saved:
            setattr(main, k, None) if k == "__spec__" else delattr(main, k)
        yield
    finally:
        for k, v in saved.items():
            setattr(main, k, v)


def make_all(source: Any, jobs: list, workers: int, progress: bool, desc: str = "generate") -> Iterator:
    """`source.make(job)` for every job, in order, as they are made: `workers` spawned processes (fresh ones:
    GL contexts do not survive fork), or this process when 0."""
    from tqdm.auto import tqdm  # here: the config (`embodied show-config`) imports this module

    bar = tqdm(total=len(jobs), desc=desc, unit="job", disable=not progress)
    if workers > 0:
        ctx = mp.get_context("spawn")
        with light_spawn():
            pool = ctx.Pool(workers, initializer=_start_worker, initargs=(source, carried()))
        with pool:
            for res in pool.imap(_make_in_worker, jobs, chunksize=source.chunksize):
                bar.update()
                yield res
    else:
        try:
            for job in jobs:
                res = source.make(job)
                bar.update()
                yield res
        finally:
            source.close()
    bar.close()


def store(root: Path, rid: str, split: str, record: dict, frames: np.ndarray, fps: float) -> Made:
    """Write the clip (and the PNG of a still) under `root`; returns the full record and its content digest.

    The digest hashes the raw frames and the record, not the encoded file, so it does not depend on the
    video encoder's build."""
    rel = f"videos/{split}/{rid}.mp4"
    write_video(root / rel, frames, fps)
    key = "family" if "family" in record else "task"  # a question's family, an episode's interactive task
    full = {"id": rid, key: record[key], "video": rel}
    if record["meta"].get("still"):
        from PIL import Image

        img = f"images/{split}/{rid}.png"
        (root / img).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(frames[0]).save(root / img)
        full["images"] = [img]
    full |= {k: v for k, v in record.items() if k != key}
    h = hashlib.sha256(json.dumps(full, sort_keys=True).encode())
    h.update(np.ascontiguousarray(frames).tobytes())
    return full, h.hexdigest()


# --- writing ----------------------------------------------------------------------------------------------


def write_dataset(source: Source, progress: bool = True) -> dict:
    """Make every job of `source`, write its split files, manifest, card and sheets; returns the manifest."""
    source.root.mkdir(parents=True, exist_ok=True)
    jobs = source.jobs()
    t0 = time.perf_counter()
    writer = SplitWriter(source.root, source.splits)
    skipped: list[str] = []
    with writer:  # records go to disk as they are made
        for made in make_all(source, jobs, source.workers, progress):
            for record, digest in made:
                if record is None:
                    skipped.append(digest)  # for a record that could not be made, the reason
                else:
                    writer.add(record, digest)
    wall = time.perf_counter() - t0
    timing = {
        "wall_s": round(wall, 2),
        "clips_per_s": round((writer.made + len(skipped)) / wall, 2) if wall > 0 else None,
    }
    return finish(source, writer, {"skipped": {"count": len(skipped), "items": skipped}, **timing})


class SplitWriter:
    """Streams records into `<root>/<split>.jsonl` (via `.tmp` files, renamed when all went well) and keeps
    only what the manifest needs: per split a running hash of the record digests and the tallies.

    A record belongs to the split its id starts with (`train-000012`).
    """

    def __init__(self, root: Path, splits: list[str]):
        self.root, self.splits = Path(root), splits
        self.hash = {s: hashlib.sha256() for s in splits}
        self.counts: dict = {s: {} for s in splits}
        self.answers: dict = {s: {} for s in splits}
        self.kinds: set[str] = set()
        self.made = 0
        self.files: dict = {}

    def __enter__(self) -> SplitWriter:
        self.files = {s: (self.root / f"{s}.jsonl.tmp").open("w") for s in self.splits}
        return self

    def add(self, record: dict, digest: str) -> None:
        split = next((s for s in self.splits if record["id"].startswith(f"{s}-")), None)
        if split is None:
            raise ValueError(f"record id {record['id']!r} names none of the splits {self.splits}")
        self.files[split].write(json.dumps(record) + "\n")
        self.hash[split].update(digest.encode())
        count(record, self.counts[split], self.answers[split])
        self.kinds.add(kind(record))
        self.made += 1

    def __exit__(self, exc_type, *exc) -> None:
        for f in self.files.values():
            f.close()
        for s in self.splits:
            tmp = self.root / f"{s}.jsonl.tmp"
            if exc_type is None:
                tmp.replace(self.root / f"{s}.jsonl")
            else:  # a failed run leaves the previous split files as they were
                tmp.unlink(missing_ok=True)


def finish(source: Source, splits: SplitWriter, extra: dict) -> dict:
    """Write the manifest (counts, answers, versions, content hash), the dataset card and contact sheets
    for the split files `splits` wrote."""
    root, cfg = source.root, source.cfg
    content = hashlib.sha256()
    counts: dict = {}
    answers: dict = {}
    hashes: dict = {}
    for split in splits.splits:
        hashes[split] = splits.hash[split].hexdigest()
        content.update(hashes[split].encode())
        counts[split], answers[split] = sort_tally(splits.counts[split], splits.answers[split])
    kinds = sorted(splits.kinds)
    manifest = {
        "generator": GENERATOR,
        "source": source.name,
        "generator_version": {"embodied": package_version(), **source.versions(kinds)},
        "format_version": FORMAT_VERSION,
        "benchmark": getattr(cfg, "benchmark", False),
        "kinds": kinds,
        "seed": cfg.seed,
        "counts": counts,
        "answers": answers,
        "content_hash": {"sha256": content.hexdigest(), "splits": hashes},
        **source.extra(),
        **extra,
        "config": asdict(cfg),
    }
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2))
    write_card(root, [s for s in splits.splits if sum(sum(t.values()) for t in counts[s].values())])
    if source.sheets and splits.made:
        from embodied.data.sheets import write_sheets

        manifest["sheets"] = [str(p) for p in write_sheets(root, splits.splits)]
    return manifest


def family_label(record: dict) -> str:
    """`family`, or `family/variant` for families whose variants ask different questions (an episode: its
    `task`)."""
    variant = record["meta"].get("variant")
    return f"{kind(record)}/{variant}" if variant else kind(record)


def count(r: dict, counts: dict, answers: dict) -> None:
    """Add record `r` to the counts per family (`family` or `family/variant`) and tier, and to the
    answer-letter counts per family and tier."""
    name, tier = family_label(r), r["meta"].get("difficulty", "easy")
    counts.setdefault(name, {}).setdefault(tier, 0)
    counts[name][tier] += 1
    letters = answers.setdefault(name, {}).setdefault(tier, {})
    letters[r["answer"]] = letters.get(r["answer"], 0) + 1


def sort_tally(counts: dict, answers: dict) -> tuple[dict, dict]:
    """The tallies with families, tiers and letters in sorted order (stable manifests)."""
    answers = {name: dict(per_tier) for name, per_tier in answers.items()}
    for per_tier in answers.values():
        for tier, letters in per_tier.items():
            per_tier[tier] = dict(sorted(letters.items()))
    return dict(sorted(counts.items())), dict(sorted(answers.items()))


def write_card(root: Path, splits: list[str]) -> None:
    """A dataset card whose YAML header lets `datasets.load_dataset(str(root))` find the split files."""
    files = "\n".join(f"    - split: {s}\n      path: {s}.jsonl" for s in splits)
    (root / "README.md").write_text(
        f"---\nconfigs:\n- config_name: default\n  data_files:\n{files}\n---\n\n"
        "Generated by `embodied generate`; see `manifest.json` for how, and the project's data/FORMAT.md.\n"
    )


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("embodied")
    except PackageNotFoundError:
        return "unknown"
