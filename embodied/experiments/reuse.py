"""Finished runs of an experiment are kept and reused: rerunning with the same settings continues where
an interrupted run stopped instead of repeating it.

A saved row is reused only when it was made by the same settings *and* the same producer: its key also
holds the package version, a hash of the package's Python source, a hash of the weights the row starts
from and the versions of the libraries that compute it (`provenance`), so a changed base, changed code or
another install recomputes the row instead of silently reusing it. (Runs of the same code and weights are
bit-identical on one install, but not across `transformers` releases or CPUs: docs/cosmos.md.)
"""

from __future__ import annotations

import functools
import hashlib
import json
import multiprocessing as mp
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import TYPE_CHECKING

from embodied.registry import carried, restore

if TYPE_CHECKING:
    from embodied.policy.model import PolicyConfig

PACKAGE = Path(__file__).resolve().parents[1]
"""The `embodied` package folder whose `.py` files make the code hash."""
PROVENANCE = ("version", "code", "weights", "stack")
"""The parts of a row's provenance, in the order a changed one is reported."""
STACK = ("torch", "transformers", "mujoco", "numpy")
"""The libraries whose versions make a row's `stack`: those that compute every number of a row."""
_CHUNK = 1 << 23  # 8 MiB reads: a multi-gigabyte checkpoint streams through the hash


def source_hash(root: str | Path) -> str:
    """SHA-256 (first 16 hex digits) of every `.py` file under `root`, with its relative path, in path order.
    Nothing else counts: editing docs, scenes or weights leaves it unchanged."""
    root, h = Path(root), hashlib.sha256()
    for f in sorted(root.rglob("*.py"), key=lambda f: f.relative_to(root).as_posix()):
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


@functools.cache
def code_hash() -> str:
    """`source_hash` of the `embodied` package, computed once per process (about 650 KB of source)."""
    return source_hash(PACKAGE)


_WEIGHTS: dict[str, tuple[tuple, str]] = {}
"""Weight hashes by folder: (the files' names, sizes, modification times and inodes; the hash). A folder
is read again only when one of those changed."""


def folder_weights_hash(folder: str | Path) -> str:
    """SHA-256 (first 16 hex digits) of a model folder's `*.safetensors` files (names and bytes), cached per
    folder until a file's size, modification time or inode changes. Raises `FileNotFoundError` when the folder
    holds no safetensors."""
    folder = Path(folder).resolve()
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder} holds no *.safetensors weights to hash")
    stats = [f.stat() for f in files]
    stamp = tuple((f.name, s.st_size, s.st_mtime_ns, s.st_ino) for f, s in zip(files, stats))
    cached = _WEIGHTS.get(str(folder))
    if cached is not None and cached[0] == stamp:
        return cached[1]
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0")
        with f.open("rb") as fh:
            while chunk := fh.read(_CHUNK):
                h.update(chunk)
    _WEIGHTS[str(folder)] = (stamp, h.hexdigest()[:16])
    return _WEIGHTS[str(folder)][1]


@functools.cache
def stack_versions() -> str:
    """The installed versions of `STACK`, e.g. `torch 2.14.1, transformers 5.24.0, mujoco 4.0.0, numpy 2.3.5`
    (`not installed` for a missing one), read from the package metadata without importing them."""
    from importlib.metadata import PackageNotFoundError, version

    def one(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return ", ".join(f"{name} {one(name)}" for name in STACK)


def weights_hash(path: str | Path, tiny_seed: int = 0) -> str:
    """What the weights at `policy.path` are: `tiny` (or empty) is built from a seed, so the hash of its
    `TinySpec` (`tiny:<key>`, nothing is built); `tiny-base` and any folder, the hash of its safetensors
    (`folder_weights_hash`), resolved as `policy.path` is (`embodied.policy.model.resolve_policy_path`)."""
    if not path or str(path) == "tiny":
        from embodied.policy.tiny import TinySpec

        return f"tiny:{TinySpec(seed=tiny_seed).key()}"
    from embodied.policy.model import resolve_policy_path

    return folder_weights_hash(resolve_policy_path(str(path), tiny_seed))


def provenance(policy: PolicyConfig | str | Path | None = None) -> dict[str, str]:
    """What produced a row: `version` (the package's), `code` (`code_hash`), `stack` (`stack_versions`) and,
    when the row starts from a policy (a `PolicyConfig`, or a `policy.path`), `weights` (`weights_hash`)."""
    import embodied

    out = {"version": embodied.__version__, "code": code_hash(), "stack": stack_versions()}
    if policy is not None:
        path, seed = getattr(policy, "path", policy), getattr(policy, "tiny_seed", 0)
        out["weights"] = weights_hash(path, seed)
    return out


def changed_provenance(saved: dict | None, now: dict) -> list[str]:
    """The parts of provenance (`PROVENANCE`) that differ between a saved row's and `now`."""
    saved = saved or {}
    return [k for k in PROVENANCE if saved.get(k) != now.get(k)]


def reuse_or_run(
    path: Path,
    key: dict,
    compute: Callable[[], dict],
    name: str,
    policy: PolicyConfig | str | Path | None = None,
) -> dict:
    """The row saved at `path` if it was made with these settings (`key`) and the same `provenance` (code,
    version and the weights of `policy`, the policy the row starts from), else `compute()` saved there. A
    row whose settings match but whose provenance does not is recomputed, saying which part changed."""
    if "provenance" in key:
        raise ValueError(f"[{name}] 'provenance' is reserved in a reuse key")
    now = provenance(policy)
    key = json.loads(json.dumps(key | {"provenance": now}))  # JSON-normalised, as it is read back
    if path.is_file():
        saved = json.loads(path.read_text())
        if saved["key"] == key:
            print(f"[{name}] reusing {path}")
            return saved["row"]
        settings = {k: v for k, v in saved["key"].items() if k != "provenance"}
        if settings == {k: v for k, v in key.items() if k != "provenance"}:
            old = saved["key"].get("provenance")
            why = f"{', '.join(changed_provenance(old, now))} changed" if old else "it records no provenance"
            print(f"[{name}] not reusing {path}: {why} since it was saved")
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


def start_and_arm_jobs(
    seeds: Sequence[int], arms: Sequence, start=None
) -> tuple[list[tuple], list[int | None]]:
    """`(jobs, needs)` for `run_jobs` when every seed has a start and arms that train from it: the jobs
    `(seed, start)` for every seed, then `(seed, arm)` for every arm and seed, in that order; each arm job
    needs its seed's start job, so a seed's arms start as soon as its own start is done."""
    jobs = [(seed, start) for seed in seeds] + [(seed, arm) for arm in arms for seed in seeds]
    needs = [None] * len(seeds) + [list(seeds).index(seed) for seed, _ in jobs[len(seeds) :]]
    return jobs, needs


def run_jobs(
    func: Callable,
    jobs: list[tuple],
    workers: int,
    serial: tuple = (),
    needs: Sequence[int | None] | None = None,
) -> list:
    """`func(*job)` for every job, in `workers` fresh processes when more than one (spawned: torch and GL
    state do not survive fork), else here as `func(*job, *serial)`; results in the order of `jobs`.

    `needs[i]`, when given, is the index of an earlier job that must finish before job `i` starts (None: no
    need), e.g. an arm and its seed's start. Whenever a worker is free it takes the first job in `jobs` whose
    need is done, so list the jobs in priority order: the ones others need, then the longest. A job's need
    finishing unblocks it at once, so no worker waits for a whole stage of jobs."""
    if needs is not None and any(n is not None and not 0 <= n < i for i, n in enumerate(needs)):
        raise ValueError(f"run_jobs: each need must be an earlier job's index, got {list(needs)}")
    if workers <= 1 or len(jobs) <= 1:
        return [func(*job, *serial) for job in jobs]  # in order: every need comes first
    spawn = {"initializer": restore, "initargs": (carried(),)}  # a worker registers the parent's plugins
    if needs is None:
        with mp.get_context("spawn").Pool(min(workers, len(jobs)), **spawn) as pool:
            return pool.starmap(func, jobs, chunksize=1)  # jobs differ in length: hand them out one by one
    results: list = [None] * len(jobs)
    waiting, done, running = list(range(len(jobs))), set(), {}
    with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=mp.get_context("spawn"), **spawn) as pool:
        while waiting or running:
            for i in [i for i in waiting if needs[i] is None or needs[i] in done][: workers - len(running)]:
                running[pool.submit(func, *jobs[i])] = i
                waiting.remove(i)
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                i = running.pop(future)
                results[i] = future.result()
                done.add(i)
    return results
