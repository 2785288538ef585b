"""Model FLOPs of an SFT or GRPO step and the device's peak, for the MFU of `embodied bench step`.

The count follows PaLM (Chowdhery et al. 2022, appendix B): a forward pass costs 2 FLOPs per parameter per
token that the parameter touches, plus 4 x d_attn FLOPs per (query, key) pair per attention layer (QK^T and
the weighted sum of V); training (forward + backward) costs 3 forward passes. No causal discount (the usual
convention), no rematerialisation (gradient checkpointing's extra forward is not model work). The terms:

- language model: `N_lm` = its parameters less the embedding table, plus the output head (counted even when
  tied to the embedding, because the head is a matrix product and the lookup is not);
- vision tower: `N_vis` per patch, the merger at a quarter of its parameters per patch (it runs once per
  2 x 2 merged patches); attention over each clip's or image's patches in the full-attention blocks and
  within `window_size` windows in the others (Qwen2.5-VL), or over all patches where a tower has no windows;
- a GRPO group is one prompt of length p and G completions c_g: the prompt (with its clip) counts once per
  pass, each completion token attends to the prompt and its own earlier tokens, so one forward pass over
  the group is `2 N_lm (p + sum c_g) + 4 L d (p^2 + sum c_g (p + c_g)) + V`.

A GRPO step is the sampling pass (forward), the reference pass when `kl_coef > 0` (forward), the old-policy
pass when `updates_per_rollout > 1` (forward) and `updates_per_rollout` policy updates (3 forwards each).
PAPO's masked-input pass is not counted. Sharing the prompt across a group is part of the algorithm's work
here, so an implementation that recomputes each prompt G times (TRL's) does more hardware FLOPs than model
FLOPs: compare trainers by time per step, which this count turns into MFU identically for both.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch

GPU_BF16_TFLOPS: list[tuple[tuple[str, ...], str, float]] = [
    (("GH200",), "GH200", 989.0),
    (("H200", "NVL"), "H200 NVL", 835.0),
    (("H200",), "H200 SXM", 989.0),
    (("H100", "PCIE"), "H100 PCIe", 756.0),
    (("H100", "NVL"), "H100 NVL", 835.0),
    (("H100",), "H100 SXM", 989.0),
    (("H800",), "H800 SXM", 989.0),
    (("A100",), "A100 (SXM or PCIe)", 312.0),
    (("A800",), "A800", 312.0),
    (("L40S",), "L40S", 362.0),
    (("L4",), "L4", 121.0),
    (("B200",), "B200", 2250.0),
]
"""Dense bf16 tensor-core peaks (TFLOP/s, no sparsity) from NVIDIA's datasheets, matched on the upper-case
`torch.cuda.get_device_name()` in this order (all substrings must occur): the first match wins, so the
specific variants come before the family name."""


@dataclass(frozen=True)
class Shape:
    """What the FLOP count needs of a model: parameter counts and attention sizes."""

    n_lm: int
    """Language-model parameters that multiply per token (embedding table out, output head in)."""
    n_vis: float
    """Vision-tower parameters per patch (the merger at a quarter)."""
    layers: int
    d_attn: int
    vis_layers: int
    vis_d_attn: int
    vis_full: tuple[int, ...]
    """Vision blocks with full attention over a clip (all blocks when the tower has no windows)."""
    vis_window: int
    """Patches per attention window in the other vision blocks (0: no windows)."""


def model_shape(model: torch.nn.Module) -> Shape:
    """The `Shape` of a Qwen2-VL / Qwen2.5-VL style model (config names of transformers)."""
    named = dict(model.named_parameters())
    vision = sum(p.numel() for n, p in named.items() if ".visual." in f".{n}")
    merger = sum(p.numel() for n, p in named.items() if ".visual.merger." in f".{n}")
    language = sum(p.numel() for p in model.parameters()) - vision
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    n_lm = language - emb.numel() + (head.numel() if head is emb else 0)
    text = model.config.get_text_config()
    heads = text.num_attention_heads
    vc = getattr(model.config, "vision_config", None)
    depth = getattr(vc, "depth", 0) if vc is not None else 0
    vis_d = getattr(vc, "hidden_size", 0) if vc is not None else 0
    window = getattr(vc, "window_size", 0) or 0
    patch = getattr(vc, "patch_size", 14) if vc is not None else 14
    full = tuple(getattr(vc, "fullatt_block_indexes", None) or ()) if window else tuple(range(depth))
    return Shape(
        n_lm=n_lm,
        n_vis=vision - 0.75 * merger,
        layers=text.num_hidden_layers,
        d_attn=heads * (getattr(text, "head_dim", None) or text.hidden_size // heads),
        vis_layers=depth,
        vis_d_attn=vis_d,
        vis_full=full,
        vis_window=(window // patch) ** 2 if window else 0,
    )


def vision_forward(shape: Shape, items: Sequence[Sequence[int]]) -> float:
    """Forward FLOPs of the vision tower over visual items given as grids `(t, h, w)` in patches."""
    flops = 0.0
    for t, h, w in items:
        n = t * h * w
        flops += 2 * shape.n_vis * n
        full = len(shape.vis_full)
        windowed = shape.vis_layers - full
        per_window = min(shape.vis_window, h * w) if shape.vis_window else n
        flops += 4 * shape.vis_d_attn * (full * n * n + windowed * n * per_window)
    return flops


def group_forward(shape: Shape, prompt: int, completions: Sequence[int]) -> float:
    """Forward FLOPs of the language model over one prompt of `prompt` tokens (counted once) and its
    completions (each attending to the prompt and its own earlier tokens); a plain sequence is a prompt
    with no completion."""
    tokens = prompt + sum(completions)
    pairs = prompt * prompt + sum(c * (prompt + c) for c in completions)
    return 2 * shape.n_lm * tokens + 4 * shape.layers * shape.d_attn * pairs


def sft_step(shape: Shape, lengths: Sequence[int], items: Sequence[Sequence[int]]) -> float:
    """Training FLOPs of one SFT step: every row (prompt + target, `lengths`) and every visual item,
    forward and backward (3 forwards)."""
    return 3 * (sum(group_forward(shape, n, ()) for n in lengths) + vision_forward(shape, items))


def rollout_forward(
    shape: Shape, prompts: Sequence[int], completions: Sequence[Sequence[int]], items: Sequence[Sequence[int]]
) -> float:
    """FLOPs of one forward pass over a rollout: P prompts (`prompts` lengths, their visual `items`, each
    counted once) with their groups' completion lengths."""
    lm = sum(group_forward(shape, p, c) for p, c in zip(prompts, completions))
    return lm + vision_forward(shape, items)


def update_forwards(kl: bool, updates: int = 1) -> int:
    """Forward-pass equivalents of GRPO's update of one rollout: the reference pass per update when `kl`,
    the old policy's pass when `updates` > 1, and 3 per policy update (forward + backward). The sampling
    pass is the rollout's own forward (`rollout_forward`, once per rollout drawn)."""
    return (updates if kl else 0) + (1 if updates > 1 else 0) + 3 * updates


def cpu_peak_flops(threads: int | None = None) -> tuple[float, str]:
    """An upper estimate of this CPU's dense fp32 peak (FLOP/s) for `threads` cores, and how it was made:
    FLOPs per cycle per core from the vector ISA (AVX-512: two 512-bit FMA pipes, 64; AVX2 with FMA: 32;
    else 8) times the clock in /proc/cpuinfo. Generous on purpose (many AVX-512 cores have one pipe, or
    split 512-bit work in two), so a CPU MFU is a floor."""
    threads = threads or torch.get_num_threads()
    flags, mhz = set(), 0.0
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
                elif line.startswith("cpu MHz"):
                    mhz = max(mhz, float(line.split(":", 1)[1]))
    except OSError:
        pass
    mhz = mhz or 3000.0  # no /proc/cpuinfo (not Linux): assume 3 GHz
    per_cycle = 64 if "avx512f" in flags else 32 if {"avx2", "fma"} <= flags else 8
    cores = min(threads, os.cpu_count() or threads)
    how = f"{cores} cores x {mhz / 1000:.2f} GHz x {per_cycle} fp32 FLOP/cycle (estimate)"
    return cores * mhz * 1e6 * per_cycle, how


def gpu_peak(name: str) -> tuple[str, float] | None:
    """`(label, dense bf16 TFLOP/s)` of the GPU called `name` (`torch.cuda.get_device_name`), or None."""
    upper = name.upper()
    for needles, label, tflops in GPU_BF16_TFLOPS:
        if all(s in upper for s in needles):
            return label, tflops
    return None


def device_peak(device: torch.device, override_tflops: float = 0.0) -> dict:
    """The peak MFU is measured against: `{"flops", "source", "name"}`; `flops` None (with the reason in
    `source`) for a GPU not in `GPU_BF16_TFLOPS` and no `override_tflops`."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    if override_tflops > 0:
        return {"name": name, "flops": override_tflops * 1e12, "source": "bench.step_peak_tflops"}
    if device.type == "cuda":
        found = gpu_peak(name)
        if found is None:
            reason = f"{name!r} is not in embodied.bench.flops.GPU_BF16_TFLOPS: set bench.step_peak_tflops"
            return {"name": name, "flops": None, "source": reason}
        label, tflops = found
        return {"name": name, "flops": tflops * 1e12, "source": f"{label}: dense bf16 {tflops} TFLOP/s"}
    flops, how = cpu_peak_flops()
    return {"name": name, "flops": flops, "source": how}


def cpu_name() -> str:
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
