"""The dataset schema: what a generated dataset is (its config section), its splits and format version, and
the named seed streams every generator draws from. A leaf: it imports no other part of `embodied.data`.

Layout of a dataset root (see data/FORMAT.md)::

    manifest.json             generator, version, seeds, counts per split and family, content hash, config
    train.jsonl val.jsonl ... one record per line
    videos/<split>/<id>.mp4   the clips, referenced by each record's `video` field (relative path)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from embodied.questions import ClipSpec, FamilySpec, is_family

FORMAT_VERSION = 2
"""2: a question record names its family in `family` (1 called it `task`; `load_records` still reads 1)."""
SPLITS = ("train", "val", "test")
REQUIRED_FIELDS = ("id", "question", "options", "answer")
"""Besides `family` (a question) or `task` (an interactive episode), and `video` or `images`."""


def kind(record: dict, default: str | None = None) -> str:
    """What a record is an instance of: its question family (`record["family"]`) or, for an interactive
    episode, its interactive task (`record["task"]`). Code that handles both kinds of record reads this.
    A record with neither gives `default`, or a KeyError without one."""
    if "family" in record:
        return record["family"]
    return record["task"] if default is None or "task" in record else default


def upgrade(record: dict) -> dict:
    """A record as the current format has it: a format-1 question record (`task` naming a question family)
    gets that name under `family`, in the same place among its keys. Anything else is returned as it is.

    Any known family counts (`tasks.is_family`), not a list of the four that format 1 had: a family added
    since never wrote format 1, and a name is either a question family or an interactive task."""
    if "family" in record or not is_family(record.get("task")):
        return record
    return {("family" if k == "task" else k): v for k, v in record.items()}


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
    clip: ClipSpec = field(default_factory=ClipSpec)
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
    changes visibly between consecutive frames (`embodied.questions.changed_area`, at `clip.fps`): a still
    scene or a person standing still has no arrow of time and no order. Chosen at 2 fps on the shared clips
    (docs/data.md); lower it for a small object moving in a static shot, or at higher fps (frames closer in
    time change less)."""
    sheets: bool = True
    """Write a contact sheet PNG and an animated GIF per family under `<root>/sheets/`."""


def stream_code(name: str) -> int:
    """Integer key of a named seed stream: train/val/test are 0/1/2, any other name is hashed (>= 100)."""
    if name in SPLITS:
        return SPLITS.index(name)
    return 100 + int(hashlib.md5(name.encode()).hexdigest()[:6], 16)


def split_seeds(base_seed: int, stream: str, n: int) -> list[int]:
    """`n` per-record simulation seeds of the named `stream` (a split, or any other name): disjoint streams,
    reproducible per index."""
    seq = np.random.SeedSequence([base_seed, stream_code(stream)])
    return [int(s) for s in seq.generate_state(n, dtype=np.uint64) % (2**63)]
