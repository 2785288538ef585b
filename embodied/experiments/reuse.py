"""Finished runs of an experiment are kept and reused: rerunning with the same settings continues where
an interrupted run stopped instead of repeating it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path


def reuse_or_run(path: Path, key: dict, compute: Callable[[], dict], name: str) -> dict:
    """The row saved at `path` if it was made with these settings (`key`), else `compute()` saved there."""
    key = json.loads(json.dumps(key))  # JSON-normalised, as it is read back
    if path.is_file() and (saved := json.loads(path.read_text()))["key"] == key:
        print(f"[{name}] reusing {path}")
        return saved["row"]
    row = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"key": key, "row": row}, indent=1, default=float))
    return row
