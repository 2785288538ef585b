"""Datasets on disk: generation (parallel workers), the JSONL + video format, and loading.

Layout of a dataset root (see data/FORMAT.md)::

    manifest.json             generator, version, seeds, counts per split and task, clip settings
    train.jsonl val.jsonl ... one record per line
    videos/<split>/<id>.mp4   the clips, referenced by each record's `video` field (relative path)

The same files load with Hugging Face `datasets`: `load_dataset("json", data_files=...)`.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from embodied.tasks import FamilySpec, arrow_of_time
from embodied.video import Clip, VideoError, read_video, write_video

FORMAT_VERSION = 1
SPLITS = ("train", "val", "test")
REQUIRED_FIELDS = ("id", "task", "question", "options", "answer")


@dataclass
class DataConfig:
    """A generated dataset: where it goes, how big, and what its clips look like."""

    root: str = "data/generated/arrow_of_time"
    """Dataset folder (created; relative paths are relative to the working directory)."""
    seed: int = 0
    """Base seed; every split draws from its own disjoint seed stream derived from it."""
    n_train: int = 3000
    n_val: int = 200
    n_test: int = 400
    width: int = 112
    height: int = 112
    clip: arrow_of_time.ClipSpec = field(default_factory=arrow_of_time.ClipSpec)
    workers: int = 2
    """Worker processes for simulation and rendering (0 = in this process)."""
    families: list[FamilySpec] = field(default_factory=list)
    """Question families to generate (see docs/data.md). Empty: the arrow-of-time dataset of the quickstart,
    made exactly as before from `clip` and the drop world."""
    benchmark: bool = False
    """Write a benchmark: one `test` split of `n_test` records from the seed stream reserved for benchmarks,
    which training splits (train/val/test of any dataset) never draw from."""
    from_videos: str = ""
    """Folder of user videos: build arrow-of-time, spatial and temporal puzzles from them instead of
    simulating (`embodied generate --from-videos DIR`)."""
    from_videos_split: str = "train"
    """Split that the records made from videos go to (`test` when `benchmark` is set)."""
    min_moving_area: float = 0.25
    """Arrow of time and temporal puzzles refuse video windows where less than this share of the picture
    changes visibly between consecutive frames (`embodied.tasks.changed_area`, at `clip.fps`): a still scene
    or a person standing still has no arrow of time and no order. Chosen at 2 fps on the shared clips
    (docs/data.md); lower it for a small object moving in a static shot, or at higher fps (frames closer in
    time change less)."""
    sheets: bool = True
    """Write a contact sheet PNG and an animated GIF per family under `<root>/sheets/`."""


def split_seeds(base_seed: int, split: str, n: int) -> list[int]:
    """Per-record simulation seeds of `split`: disjoint streams per split, reproducible per index."""
    code = (
        SPLITS.index(split) if split in SPLITS else 100 + int(hashlib.md5(split.encode()).hexdigest()[:6], 16)
    )
    seq = np.random.SeedSequence([base_seed, code])
    return [int(s) for s in seq.generate_state(n, dtype=np.uint64) % (2**63)]


# --- generation -------------------------------------------------------------------------------------

_WORLD = None  # one world (and GL context) per worker process, reused for every clip


def _init_worker(width: int, height: int) -> None:
    global _WORLD
    from embodied.worlds import DropWorld

    _WORLD = DropWorld(width=width, height=height)


def _make_one(job: tuple) -> dict:
    root, split, index, seed, reverse, clip_spec = job
    record, frames = arrow_of_time.make_example(_WORLD, seed, reverse, clip_spec)
    rid = f"{split}-{index:06d}"
    rel = f"videos/{split}/{rid}.mp4"
    write_video(Path(root) / rel, frames, clip_spec.fps)
    return {
        "id": rid,
        "task": record["task"],
        "video": rel,
        **{k: v for k, v in record.items() if k != "task"},
    }


def generate_dataset(cfg: DataConfig, progress: bool = True) -> dict:
    """Write the train/val/test splits of `cfg` under `cfg.root`; returns the manifest."""
    if cfg.families or cfg.from_videos or cfg.benchmark:
        from embodied.generate import generate

        return generate(cfg, progress)
    root = Path(cfg.root)
    root.mkdir(parents=True, exist_ok=True)
    sizes = {"train": cfg.n_train, "val": cfg.n_val, "test": cfg.n_test}
    seeds = {s: split_seeds(cfg.seed, s, n) for s, n in sizes.items()}
    all_seeds = [x for v in seeds.values() for x in v]
    if len(set(all_seeds)) != len(all_seeds):
        raise RuntimeError("seed collision between splits; choose another data.seed")
    jobs = []
    for split, n in sizes.items():
        rev = arrow_of_time.balanced_directions(
            n, np.random.default_rng([cfg.seed, 7919, SPLITS.index(split)])
        )
        jobs += [(str(root), split, i, seeds[split][i], bool(rev[i]), cfg.clip) for i in range(n)]
    t0 = time.perf_counter()
    bar = tqdm(total=len(jobs), desc="generate", unit="clip", disable=not progress)
    records: list[dict] = []
    if cfg.workers > 0:
        from embodied.generate import light_spawn

        ctx = mp.get_context("spawn")  # fresh processes: GL contexts do not survive fork
        with light_spawn():  # workers skip the CLI's torch imports
            pool = ctx.Pool(cfg.workers, initializer=_init_worker, initargs=(cfg.width, cfg.height))
        with pool:
            for rec in pool.imap(_make_one, jobs, chunksize=16):
                records.append(rec)
                bar.update()
    else:
        _init_worker(cfg.width, cfg.height)
        for job in jobs:
            records.append(_make_one(job))
            bar.update()
    bar.close()
    wall = time.perf_counter() - t0
    for split in sizes:
        _write_jsonl(root / f"{split}.jsonl", [r for r in records if r["id"].startswith(f"{split}-")])
    manifest = {
        "generator": "embodied.datasets.generate_dataset",
        "format_version": FORMAT_VERSION,
        "tasks": [arrow_of_time.NAME],
        "seed": cfg.seed,
        "seed_streams": {s: [cfg.seed, SPLITS.index(s)] for s in sizes},
        "counts": {s: {arrow_of_time.NAME: n} for s, n in sizes.items()},
        "answers": {s: _answer_counts(r for r in records if r["id"].startswith(f"{s}-")) for s in sizes},
        "config": asdict(cfg),
        "wall_s": round(wall, 2),
        "clips_per_s": round(len(jobs) / wall, 2) if wall > 0 else None,
    }
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2))
    from embodied.contact_sheet import write_sheets
    from embodied.generate import write_card

    write_card(root, [s for s, n in sizes.items() if n])
    if cfg.sheets and records:
        write_sheets(root, list(sizes))
    return manifest


def _answer_counts(records) -> dict:
    counts: dict[str, int] = {}
    for r in records:
        counts[r["answer"]] = counts.get(r["answer"], 0) + 1
    return dict(sorted(counts.items()))


def _write_jsonl(path: Path, records: list[dict]) -> None:
    tmp = path.with_suffix(".jsonl.tmp")
    with tmp.open("w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    tmp.replace(path)


# --- loading ----------------------------------------------------------------------------------------


def load_records(root: str | Path, split: str) -> list[dict]:
    """Read `<root>/<split>.jsonl`, checking each line; errors name the file, the line and the fix."""
    path = Path(root) / f"{split}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no such split. Generate it with `embodied generate data.root={root}`."
        )
    records = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{lineno}: not valid JSON ({e})") from e
        missing = [k for k in REQUIRED_FIELDS if k not in rec]
        if missing or ("video" not in rec and "images" not in rec):
            raise ValueError(
                f"{path}:{lineno}: record lacks {missing or ['video or images']}; see data/FORMAT.md"
            )
        records.append(rec)
    return records


@dataclass
class Example:
    record: dict
    clip: Clip


def load_examples(
    root: str | Path,
    split: str,
    fps: float = 2.0,
    max_frames: int = 32,
    limit: int | None = None,
    progress: bool = False,
) -> tuple[list[Example], list[str]]:
    """Records of `split` with their decoded clips. Unreadable videos are skipped and returned as a list
    of `path: reason` strings (also warned about), so one bad file never stops a run."""
    records = load_records(root, split)[:limit]
    examples, skipped = [], []
    for rec in tqdm(records, desc=f"load {split}", unit="clip", disable=not progress):
        try:
            clip = read_video(Path(root) / rec["video"], fps=fps, max_frames=max_frames)
        except VideoError as e:
            skipped.append(str(e))
            continue
        examples.append(Example(rec, clip))
    if skipped:
        warnings.warn(
            f"{len(skipped)} of {len(records)} videos in {root}/{split} could not be read and were skipped; "
            f"first: {skipped[0]}",
            stacklevel=2,
        )
    return examples, skipped


def load_split(
    root: str | Path, split: str, video, progress: bool = False, limit: int | None = None
) -> list[Example]:
    """`load_examples` at `video`'s (a `VideoConfig`) fps and frame cap; an error if no clip is readable."""
    examples, skipped = load_examples(root, split, video.fps, video.max_frames, limit, progress)
    if not examples:
        raise ValueError(f"{root}/{split}.jsonl has no readable examples ({len(skipped)} skipped)")
    return examples


def manifest_matches(root: str | Path, config: dict, ignore: set[str] | frozenset = frozenset()) -> bool:
    """True if `root/manifest.json` records the same `config` (keys in `ignore` aside): reuse the data."""
    path = Path(root) / "manifest.json"
    if not path.is_file():
        return False
    old = json.loads(path.read_text()).get("config", {})
    return {k: v for k, v in old.items() if k not in ignore} == {
        k: v for k, v in config.items() if k not in ignore
    }


def dataset_matches(cfg: DataConfig) -> bool:
    """True if `cfg.root` holds a dataset generated with the same settings (worker count aside)."""
    return manifest_matches(cfg.root, asdict(cfg), {"workers"})


def ensure_dataset(cfg: DataConfig, progress: bool = True) -> None:
    """Generate `cfg`'s dataset unless `cfg.root` already holds it."""
    if dataset_matches(cfg):
        print(f"reusing the dataset in {cfg.root} (same config)")
    else:
        generate_dataset(cfg, progress=progress)
