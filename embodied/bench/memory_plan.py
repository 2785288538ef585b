"""The training-state memory plan of a real architecture per GPU count, from a meta-device model (no memory).

For `random:NAME` (embodied/policy/random_weights.py) this counts the parameters, lists the FSDP2 units that
`embodied.train.distributed.shard` would wrap (the same `fsdp_units`, so the plan cannot drift from the code),
and gives per-GPU bytes of weights, gradients and AdamW state under DDP (`distributed=ddp`: every process
holds everything) and FSDP2 full sharding (`distributed=fsdp`: each parameter split on dim 0 over the
processes, padded as FSDP2 pads), for three precision layouts:

- `bf16`: `policy.dtype=bfloat16` (configs/qwen2_5_vl_3b.yaml). Weights, gradients and both AdamW moments in
  bfloat16 (torch.optim.AdamW keeps its moments in the parameter's dtype): 8 bytes per parameter, no fp32
  master copy.
- `fp32_master`: `policy.dtype=float32 mixed_precision=bf16`: fp32 weights (the master copy), gradients and
  moments (16 bytes per parameter); compute in bf16 (FSDP2 all-gathers bf16 copies; DDP autocasts).
- `bf16_fp32_moments`: bf16 weights and gradients with fp32 moments (12 bytes per parameter), the layout
  some frameworks use; NOT available here (it needs an optimizer that keeps fp32 state for bf16 weights).

Not counted: activations (they depend on batch, tokens and checkpointing), the CUDA context (~0.5-1 GiB),
allocator fragmentation, and the rollout engine. The FSDP2 transient term is the all-gathered (compute
dtype) weights of the largest unit twice (the unit running and the one prefetched), plus that unit's
unsharded gradient in compute and reduce dtype. DDP adds its gradient buckets: a second copy of every
gradient (`gradient_as_bucket_view=False`, the default that accelerate keeps).
"""

from __future__ import annotations

import math

import torch

GIB = 2**30
SCHEMES = {
    "bf16": {"param": 2, "grad": 2, "adam": 4, "compute": 2, "reduce": 4, "available": True},
    "fp32_master": {"param": 4, "grad": 4, "adam": 8, "compute": 2, "reduce": 4, "available": True},
    "bf16_fp32_moments": {"param": 2, "grad": 2, "adam": 8, "compute": 2, "reduce": 4, "available": False},
}
"""Bytes per parameter: stored weight, gradient, AdamW state (two moments), compute copy, gradient reduce."""


def sharded_numel(p: torch.Tensor, world: int) -> int:
    """Elements one process stores of `p` under FSDP2 with `world` processes: dim 0 split into
    `ceil(dim0 / world)` rows (the last shards padded)."""
    if p.dim() == 0:
        return 1
    return math.ceil(p.shape[0] / world) * (p.numel() // p.shape[0])


def unit_plan(model: torch.nn.Module, units: list[torch.nn.Module]) -> list[dict]:
    """Each FSDP unit's own parameters (those not inside a nested unit), with its class and size; a
    parameter shared between modules (a tied head) counts once, in the outermost unit that holds it."""
    owner: dict[int, int] = {}
    for i, unit in enumerate(units):  # units are innermost first: the first unit to hold a tensor owns it
        for p in unit.parameters():
            owner.setdefault(id(p), i)
    out = []
    for i, unit in enumerate(units):
        own = [p for p in unit.parameters() if owner[id(p)] == i]
        out.append({"type": type(unit).__name__, "params": sum(p.numel() for p in own), "tensors": own})
    return out


def summarize_units(plan: list[dict]) -> dict:
    """Units grouped by class: how many, parameters each (min/max), and the largest unit."""
    by_type: dict[str, dict] = {}
    for u in plan:
        entry = by_type.setdefault(u["type"], {"count": 0, "params_min": u["params"], "params_max": 0})
        entry["count"] += 1
        entry["params_min"] = min(entry["params_min"], u["params"])
        entry["params_max"] = max(entry["params_max"], u["params"])
    largest = max(plan, key=lambda u: u["params"])
    return {
        "count": len(plan),
        "by_type": by_type,
        "largest": {"type": largest["type"], "params": largest["params"]},
        "params_covered": sum(u["params"] for u in plan),
    }


def per_gpu(plan: list[dict], scheme: dict, world: int, strategy: str) -> dict[str, float]:
    """GiB per GPU of weights, gradients, AdamW state and the transient buffers (see the module docstring)
    with `world` processes under `strategy` (`ddp` or `fsdp`; one process: no sharding either way)."""
    tensors = [p for u in plan for p in u["tensors"]]
    if strategy == "fsdp" and world > 1:
        numel = sum(sharded_numel(p, world) for p in tensors)
        largest = max(u["params"] for u in plan)
        transient = largest * (2 * scheme["compute"] + scheme["compute"] + scheme["reduce"])
        buckets = 0
    else:
        numel = sum(p.numel() for p in tensors)
        transient = 0
        buckets = numel * scheme["grad"] if (strategy == "ddp" and world > 1) else 0
    parts = {
        "weights": numel * scheme["param"],
        "grads": numel * scheme["grad"],
        "adamw": numel * scheme["adam"],
        "ddp_buckets": buckets,
        "fsdp_transient": transient,
    }
    out = {k: round(v / GIB, 2) for k, v in parts.items()}
    out["total"] = round(sum(parts.values()) / GIB, 2)
    out["grpo_reference"] = round(numel * scheme["param"] / GIB, 2)  # frozen copy when grpo.kl_coef > 0
    return out


def memory_plan(spec: str, gpus: list[int]) -> dict:
    """The whole plan of `random:NAME` (or `random:FILE.json`) for each GPU count in `gpus`, as JSON-ready
    data: parameter counts, the FSDP2 units, and per-GPU GiB per precision layout and strategy."""
    from embodied.policy.random_weights import instantiate, parameter_counts, random_config
    from embodied.train.distributed import fsdp_units

    model = instantiate(random_config(spec), torch.bfloat16, "meta")
    plan = unit_plan(model, fsdp_units(model))
    counts = parameter_counts(model)
    summary = summarize_units(plan)
    if summary["params_covered"] != counts["total"]:
        raise AssertionError(f"FSDP units hold {summary['params_covered']} of {counts['total']} parameters")
    layouts = {}
    for name, scheme in SCHEMES.items():
        per_byte = {k: scheme[k] for k in ("param", "grad", "adam")}
        layouts[name] = {
            "available_here": scheme["available"],
            "bytes_per_param": {**per_byte, "total": sum(per_byte.values())},
            "ddp": {str(n): per_gpu(plan, scheme, n, "ddp") for n in gpus},
            "fsdp": {str(n): per_gpu(plan, scheme, n, "fsdp") for n in gpus},
        }
    return {
        "architecture": spec,
        "parameters": counts,
        "fsdp_units": summary,
        "per_gpu_gib": layouts,
    }
