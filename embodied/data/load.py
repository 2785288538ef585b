"""Reading datasets on disk (the layout is in `embodied.data.schema` and data/FORMAT.md): records, their
decoded clips, and whether a folder already holds what a config would generate.

The same files load with Hugging Face `datasets`: `load_dataset("json", data_files=...)`.
"""

from __future__ import annotations

import json
import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from embodied.data.schema import REQUIRED_FIELDS, upgrade
from embodied.video import Clip, VideoError, read_video


def load_records(root: str | Path, split: str) -> list[dict]:
    """Read `<root>/<split>.jsonl`, checking each line; errors name the file, the line and the fix.

    Records of format 1 (a question's family under `task`) come back as format 2 has them (`family`):
    the one place where old datasets are mapped (`schema.upgrade`)."""
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
        rec = upgrade(rec)
        missing = [k for k in REQUIRED_FIELDS if k not in rec]
        if "family" not in rec and "task" not in rec:
            missing.append("family (or task)")
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
    history: tuple = ()
    """A later turn of a multi-turn episode (`embodied.rl.episodes`): the earlier `(answer, words)` pairs;
    empty for a plain prompt."""
    outcomes: tuple = ()
    """One outcome clip (`Clip`) per entry of `history`, shown after it."""


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

    def read(rec: dict) -> Clip | VideoError:
        try:
            return read_video(Path(root) / rec["video"], fps=fps, max_frames=max_frames)
        except VideoError as e:
            return e

    from tqdm.auto import tqdm  # here: the config (`embodied show-config`) imports this module

    # PyAV decodes without the GIL: threads decode several clips at once (same clips, same order). Two per
    # core: a thread also waits on the file and on the GIL between frames (3,000 small clips on 2 cores:
    # 7.1-7.5 s with 2 threads, 5.8 s with 4, 5.9-6.0 s with 6)
    with ThreadPoolExecutor(max(1, min(8, 2 * (os.cpu_count() or 1)))) as pool:
        clips = pool.map(read, records)
        for rec, clip in tqdm(
            zip(records, clips), total=len(records), desc=f"load {split}", unit="clip", disable=not progress
        ):
            if isinstance(clip, VideoError):
                skipped.append(str(clip))
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
    root: str | Path,
    split: str,
    video,
    progress: bool = False,
    limit: int | None = None,
    skipped: list[str] | None = None,
) -> list[Example]:
    """`load_examples` at `video`'s (a `VideoConfig`) fps and frame cap; an error if no clip is readable.
    The unreadable videos' reasons are appended to `skipped` when it is given (an evaluation reports them)."""
    examples, unread = load_examples(root, split, video.fps, video.max_frames, limit, progress)
    if skipped is not None:
        skipped += unread
    if not examples:
        raise ValueError(f"{root}/{split}.jsonl has no readable examples ({len(unread)} skipped)")
    return examples


def manifest_matches(root: str | Path, config: dict, ignore: set[str] | frozenset = frozenset()) -> bool:
    """True if `root/manifest.json` records the same `config` (keys in `ignore` aside): reuse the data."""
    path = Path(root) / "manifest.json"
    if not path.is_file():
        return False
    old = upgrade_config(json.loads(path.read_text()).get("config", {}))
    return {k: v for k, v in old.items() if k not in ignore} == {
        k: v for k, v in config.items() if k not in ignore
    }


def upgrade_config(config: dict) -> dict:
    """A manifest's data config as today's schema has it: before issue 23 a `data.families` item named its
    family `task`. The records of such a dataset load through `schema.upgrade`, so it is reused as it is."""
    families = config.get("families")
    if not isinstance(families, list):
        return config
    fams = [
        {("family" if k == "task" else k): v for k, v in f.items()} if isinstance(f, dict) else f
        for f in families
    ]
    return config | {"families": fams}
