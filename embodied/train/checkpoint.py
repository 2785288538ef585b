"""Training state that survives crashes: atomic checkpoints, rotation, exact resume.

A checkpoint is a folder `<root>/step-00000040/` holding everything the loop needs to continue as if it
had never stopped:

    model.safetensors   the policy's weights
    optimizer.pt        optimizer (and LR scheduler) state, loaded with `torch.load(weights_only=True)`
    rng.pt              python, numpy and torch RNG states
    state.json          step, data position and the loop's own counters
    config.yaml         the run's config, for the record
    <name>.safetensors  modules trained next to the policy, if any (PPO's `value_head`)

It is written into a hidden temporary folder first and renamed into place only when every file is
flushed to disk: a crash mid-write leaves a `.tmp-*` folder that nothing reads, and the previous
checkpoint intact. Rotation deletes old checkpoints only after the new one is in place.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_model, save_file, save_model

FILES = ("model.safetensors", "optimizer.pt", "rng.pt", "state.json")
PREFIX = "step-"


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rng_state() -> dict:
    """Python, numpy and torch RNG states in types `torch.load(weights_only=True)` accepts."""
    _, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": pos, "gauss": (has_gauss, gauss)},
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: dict) -> None:
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], *n["gauss"]))
    torch.set_rng_state(state["torch"])


def save_checkpoint(
    root: str | Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler=None,
    state: dict | None = None,
    config_yaml: str = "",
    keep: int = 2,
    weights: dict | None = None,
    optim_state: dict | None = None,
    extra: dict[str, torch.nn.Module] | None = None,
) -> Path:
    """Write the checkpoint of `step` atomically under `root`, then keep only the newest `keep` (>= 1).

    `state` is the loop's JSON-serialisable bookkeeping (data position, running sums, ...). `weights` and
    `optim_state` replace the model's and optimizer's own state dicts (FSDP passes the gathered ones).
    `extra` names modules trained next to the model (their parameters in `optimizer`), each written to
    `<name>.safetensors` in the same folder.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step:08d}"
    tmp = root / f".tmp-{PREFIX}{step:08d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    if weights is None:
        save_model(model, str(tmp / "model.safetensors"))
    else:
        save_file(_unshared(weights), str(tmp / "model.safetensors"))
    for name, module in (extra or {}).items():
        save_model(module, str(tmp / f"{name}.safetensors"))
    optim = {
        "optimizer": (optimizer.state_dict() if optimizer is not None else {})
        if optim_state is None
        else optim_state,
        "scheduler": scheduler.state_dict() if scheduler else None,
    }
    torch.save(optim, tmp / "optimizer.pt")
    torch.save(rng_state(), tmp / "rng.pt")
    (tmp / "config.yaml").write_text(config_yaml)
    (tmp / "state.json").write_text(json.dumps({"step": step, **(state or {})}, indent=2))
    for f in tmp.iterdir():
        _fsync(f)
    if final.exists():  # the same step written again (a resumed run): replace it only now
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync(root)
    for old in list_checkpoints(root)[: -max(1, keep)]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints under `root`, oldest first (temporary folders of crashed writes are ignored)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.glob(f"{PREFIX}*") if p.is_dir() and all((p / f).is_file() for f in FILES)]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX) :]))


def set_aside(root: str | Path, main: bool = True) -> Path | None:
    """A run that starts fresh in a folder holding an earlier run's checkpoints moves them to
    `<root>.previous` (replacing an older one there) and says so: otherwise rotation would keep the earlier
    run's later steps over the new run's, and `resume=auto` would continue the wrong run. Returns where they
    went (None when there were none, or on a process other than the first)."""
    root = Path(root)
    if not main or not list_checkpoints(root):
        return None
    aside = root.with_name(root.name + ".previous")
    shutil.rmtree(aside, ignore_errors=True)
    os.replace(root, aside)
    print(f"starting fresh: the earlier run's checkpoints in {root} moved to {aside} (resume=auto continues)")
    return aside


def resolve_resume(resume: str, root: str | Path) -> Path | None:
    """`""` -> None (start fresh); `"auto"` -> the newest complete checkpoint under `root`, or None if
    there is none; anything else is a checkpoint folder that must exist and be complete."""
    if not resume:
        return None
    if resume == "auto":
        found = list_checkpoints(root)
        return found[-1] if found else None
    path = Path(resume)
    missing = [f for f in FILES if not (path / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"checkpoint {path} is missing {missing}; pass a complete step-* folder, or resume=auto "
            f"to pick the newest complete one under {root}"
        )
    return path


def load_checkpoint(
    path: str | Path,
    model: torch.nn.Module,
    optimizer=None,
    scheduler=None,
    extra: dict[str, torch.nn.Module] | None = None,
) -> dict:
    """Restore weights, optimizer, scheduler and RNG states from `path`; returns its `state.json`.
    `extra`: modules saved next to the model (see `save_checkpoint`), loaded from `<name>.safetensors`."""
    path = Path(path)
    load_model(model, str(path / "model.safetensors"), device=str(next(model.parameters()).device))
    load_extra(path, extra)
    optim, state = restore_state(path, scheduler)
    if optimizer is not None:
        optimizer.load_state_dict(optim["optimizer"])
    return state


def load_extra(path: str | Path, extra: dict[str, torch.nn.Module] | None) -> None:
    """Load each module of `extra` from `<name>.safetensors` in checkpoint `path`; a missing file is an
    error that names it (a checkpoint written without that module, e.g. by a run that was not PPO)."""
    for name, module in (extra or {}).items():
        f = Path(path) / f"{name}.safetensors"
        if not f.is_file():
            raise FileNotFoundError(
                f"checkpoint {path} has no {f.name}: it was written by a run without {name}"
            )
        load_model(module, str(f), device=str(next(module.parameters()).device))


def restore_state(path: str | Path, scheduler=None) -> tuple[dict, dict]:
    """Restore the scheduler and RNG states from checkpoint `path`; returns `(optimizer.pt's dict, state)`,
    leaving the weights and the optimizer to the caller (FSDP loads them into shards)."""
    path = Path(path)
    optim = torch.load(path / "optimizer.pt", weights_only=True)
    if scheduler is not None and optim["scheduler"] is not None:
        scheduler.load_state_dict(optim["scheduler"])
    set_rng_state(torch.load(path / "rng.pt", weights_only=True))
    return optim, json.loads((path / "state.json").read_text())


def _unshared(tensors: dict) -> dict:
    """Contiguous tensors none of which shares memory with another (safetensors' rule; tied weights)."""
    seen, out = set(), {}
    for k, v in tensors.items():
        v = v.contiguous()
        ptr = (v.untyped_storage().data_ptr(), v.storage_offset())
        out[k] = v.clone() if ptr in seen else v
        seen.add(ptr)
    return out
