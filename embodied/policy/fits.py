"""Refuse, before loading, a policy whose weights and optimizer state cannot fit the machine.

A 3B policy in float32 on a 24 GB CPU machine does not fail fast: it allocates, swaps or grows until the
machine stops answering (issue 53: 16.7 GB resident and growing before it was stopped). The commands that
train or generate (sft, grpo, expert, eval, quickstart, bench step) call `check_command` first. It counts
the policy's parameters without allocating them (the meta device for `random:NAME`, the safetensors
headers or `config.json` of a folder), multiplies by the bytes each parameter needs, and raises `TooBig`
with one line giving the estimate and the ways out when that exceeds the device's memory.

Bytes per parameter, `b` being the `policy.dtype` size (torch's AdamW keeps both moments in the
parameter's dtype): training 4b (weights, gradients, two moments), with LoRA b (frozen weights; the adapters
are negligible), plus b for GRPO's frozen reference when `grpo.kl_coef > 0`; generating only b. Under FSDP
with several processes the training state is divided among them. Activations, the CUDA context and
allocator slack are not counted, so this is a floor: a policy refused by it cannot run, one admitted may
still run out of memory.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

GIB = 2**30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
TINY_PATHS = ("", "tiny")
"""Paths of the built-in tiny model built on demand (1.6 M parameters): nothing to check, nothing to build."""
TRAINING = {"sft": True, "grpo": True, "expert": True, "quickstart": True, "bench step": True, "eval": False}
"""Whether each checked command trains (else it only generates)."""


class TooBig(ValueError):
    """The policy's weights (and training state) exceed the device's memory; the message is one line."""


def safetensors_numel(folder: Path) -> int | None:
    """Parameters stored in `folder`'s safetensors files, read from their headers (no tensor is loaded);
    None when it has none."""
    total, files = 0, sorted(folder.glob("*.safetensors"))
    for path in files:
        with path.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        for name, entry in header.items():
            if name != "__metadata__":
                n = 1
                for d in entry["shape"]:
                    n *= d
                total += n
    return total if files else None


def meta_numel(config) -> int:
    """Parameters of the model of a `transformers` config, built on the meta device (no memory)."""
    import torch

    from embodied.policy.random_weights import instantiate

    return sum(p.numel() for p in instantiate(config, torch.bfloat16, "meta").parameters())


def parameter_count(path: str, tiny_seed: int = 0) -> int | None:
    """Parameters of `policy.path` without loading weights; None for the built-in tiny model or a folder
    whose architecture transformers cannot build."""
    from embodied.policy.random_weights import is_random, random_config

    if path in TINY_PATHS:
        return None
    if is_random(path):
        return meta_numel(random_config(path))
    from embodied.policy.model import resolve_policy_path

    folder = resolve_policy_path(path, tiny_seed)
    n = safetensors_numel(folder)
    if n is not None:
        return n
    from transformers import AutoConfig

    try:  # no safetensors (a .bin checkpoint): the architecture on the meta device
        return meta_numel(AutoConfig.from_pretrained(folder, local_files_only=True))
    except (ValueError, OSError, KeyError):
        return None  # not countable here: the load itself says what is wrong with the folder


def device_memory(device: str) -> tuple[int, str] | None:
    """`(bytes, what)` of the memory a policy on `device` lives in; None for meta or an absent GPU (the
    load itself then says what is wrong)."""
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            return None
        index = torch.device(device).index or 0
        props = torch.cuda.get_device_properties(index)
        return props.total_memory, f"{props.name} (cuda:{index})"
    if device == "cpu":
        import psutil

        return psutil.virtual_memory().total, "this machine's RAM"
    return None


def estimate(
    n: int, dtype: str, train: bool, lora: bool, reference: bool, shards: int = 1
) -> tuple[int, str]:
    """`(bytes, what they are)` of `n` parameters' weights and training state (module docstring)."""
    b = DTYPE_BYTES.get(dtype, 4)
    if not train:
        return n * b, "weights"
    state = (1 if lora else 4) * n * b // max(shards, 1)
    parts = "weights" if lora else "weights + gradients + AdamW state"
    if reference:
        return state + n * b, parts + " + GRPO reference"
    return state, parts


def check_fits(policy, command: str, train: bool, reference: bool = False, shards: int = 1) -> dict | None:
    """Raise `TooBig` when `policy` (a `PolicyConfig`) cannot fit its device for `command`; else return
    the estimate (None when there is nothing to check: the tiny model, meta, no GPU)."""
    memory = device_memory(policy.device)
    if memory is None:
        return None
    n = parameter_count(policy.path, policy.tiny_seed)
    if n is None:
        return None
    need, what = estimate(n, policy.dtype, train, policy.lora_rank > 0, reference, shards)
    have, where = memory
    if need > have:
        raise TooBig(
            f"{command} with policy.path={policy.path} ({n / 1e9:.2f} B parameters, {policy.dtype}) needs "
            f"~{need / GIB:.1f} GiB for {what} before activations, more than the {have / GIB:.1f} GiB of "
            f"{where}; use a GPU (policy.device=cuda policy.dtype=bfloat16), LoRA (policy.lora_rank=16), a "
            "smaller policy (policy.path=tiny-base), or for the memory plan alone "
            "bench.memory_quickstart=false"
        )
    return {"parameters": n, "estimate_gib": round(need / GIB, 2), "memory_gib": round(have / GIB, 2)}


def check_command(cfg, command: str) -> dict | None:
    """`check_fits` for one of the commands in `TRAINING`, with its training state and GRPO reference
    (sft and expert train without one), sharded under FSDP over `WORLD_SIZE` processes."""
    train = TRAINING[command]
    reference = command in ("grpo", "quickstart", "bench step") and cfg.grpo.kl_coef > 0
    world = int(os.environ.get("WORLD_SIZE", "1"))
    shards = world if cfg.distributed == "fsdp" else 1
    return check_fits(cfg.policy, command, train, reference, shards)
