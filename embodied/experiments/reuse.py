"""Finished runs of an experiment are kept and reused: rerunning with the same settings continues where
an interrupted run stopped instead of repeating it."""

from __future__ import annotations

import json
import multiprocessing as mp
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


_DATA: dict = {}  # this process's data: {key: data}, one entry at a time


def process_data(key: dict, load: Callable[[], dict], threads: int) -> dict:
    """The data an experiment's jobs share, loaded by `load()` once per process and per `key` (the settings
    it depends on, so a second experiment in the same process never gets the first one's examples). The
    first load in a pool worker also sets its torch threads to `threads` (1 when 0): `run_jobs` starts
    workers with one job's worth of cores each."""
    name = json.dumps(key, sort_keys=True, default=str)
    if name not in _DATA:
        if mp.current_process().name != "MainProcess":
            import torch

            torch.set_num_threads(threads if threads > 0 else 1)
        _DATA.clear()
        _DATA[name] = load()
    return _DATA[name]


def run_jobs(func: Callable, jobs: list[tuple], workers: int, serial: tuple = ()) -> list:
    """`func(*job)` for every job, in `workers` fresh processes when more than one (spawned: torch and GL
    state do not survive fork), else here as `func(*job, *serial)`; results in the order of `jobs`."""
    if workers > 1 and len(jobs) > 1:
        with mp.get_context("spawn").Pool(min(workers, len(jobs))) as pool:
            return pool.starmap(func, jobs, chunksize=1)  # jobs differ in length: hand them out one by one
    return [func(*job, *serial) for job in jobs]
