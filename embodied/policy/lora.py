"""Memory switches for big checkpoints: LoRA adapters (peft) and gradient checkpointing.

LoRA is injected in place (`peft.inject_adapter_in_model`), so the policy stays the same
`Qwen2_5_VLForConditionalGeneration` object that every loop, `generate` and `completion_logprobs` already
handle; only the adapter weights train. Saving merges the adapters into the base weights one weight at a
time (`embodied.policy.saving.save_merged`) and writes an ordinary Hugging Face folder that loads with no
peft at all; the live model keeps its separate adapters, so training can go on after a save (the quickstart
saves mid-run). The KL reference of a LoRA run is the same model with its adapters off (`FrozenAdapters`),
not a second copy of the weights.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from embodied.policy.architectures import architecture_of
from embodied.policy.config import LORA_TARGETS_DEFAULT


def lora_target_regex(
    targets: Sequence[str], vision: bool = False, vision_prefixes: Sequence[str] = ("visual.",)
) -> str:
    """A peft `target_modules` regex (full match on module names) for the linear layers named `targets`.

    Vision towers reuse the names gate_proj/up_proj/down_proj (Qwen) or q_proj/k_proj/v_proj (SigLIP), so
    without `vision` the pattern excludes every module under one of the architecture's `vision_prefixes` (the
    vision tower and its merger stay frozen).
    """
    if not targets:
        raise ValueError("policy.lora_targets is empty; name at least one linear layer, e.g. [q_proj]")
    names = "|".join(re.escape(t) for t in targets)
    if vision:
        return rf"(.*\.)?({names})"
    towers = "|".join(re.escape(p) for p in vision_prefixes)
    return rf"(?!(.*\.)?({towers}))(.*\.)?({names})"


def apply_lora(
    model: torch.nn.Module,
    rank: int,
    alpha: float,
    dropout: float = 0.0,
    targets: Sequence[str] = LORA_TARGETS_DEFAULT,
    vision: bool = False,
) -> torch.nn.Module:
    """Inject LoRA adapters (rank `rank`, scale `alpha / rank`) into `model` in place and freeze the rest.

    Adapters are kept in float32 whatever the base dtype, as peft's `autocast_adapter_dtype` does, so
    that small bf16 updates are not rounded away. Returns `model` itself.
    """
    try:
        from peft import LoraConfig, inject_adapter_in_model
    except ImportError as e:
        raise ImportError("policy.lora_rank > 0 needs peft: pip install 'embodied[lora]'") from e

    if rank <= 0:
        raise ValueError(f"policy.lora_rank must be positive to apply LoRA, got {rank}")
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=lora_target_regex(targets, vision, architecture_of(model).vision_prefixes),
        bias="none",
    )
    try:
        model = inject_adapter_in_model(config, model)
    except ValueError as e:
        why = f"LoRA found no layer to adapt ({e})"
        raise ValueError(f"{why}; check policy.lora_targets={list(targets)}") from e
    for name, p in model.named_parameters():
        is_lora = "lora_" in name
        p.requires_grad_(is_lora)
        if is_lora and p.is_floating_point():
            p.data = p.data.float()
    return model


def has_lora(model: torch.nn.Module) -> bool:
    if "peft" not in sys.modules:  # only apply_lora imports peft: without it no adapter can exist
        return False
    from peft.tuners.lora import LoraLayer

    return any(isinstance(m, LoraLayer) for m in model.modules())


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """Recompute activations in the backward pass instead of storing them (vision and text blocks).

    Non-reentrant checkpointing: it needs no `requires_grad` inputs, so it also works when only LoRA
    adapters train. Active in `model.train()` only; generation (eval mode) is untouched.
    """
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(f"{type(model).__name__} does not support gradient checkpointing")
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x renamed it
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def is_checkpointing(model: torch.nn.Module) -> bool:
    """Whether gradient checkpointing is on (`is_activation_checkpointing` since transformers' rename,
    `is_gradient_checkpointing` before it: 5.19, which `.venv-vllm` runs). Under it transformers drops a
    training pass's cache, so the shared-prefix paths cannot be taken."""
    on = getattr(model, "is_activation_checkpointing", None)
    return bool(on if on is not None else getattr(model, "is_gradient_checkpointing", False))


def lora_layers(model: torch.nn.Module) -> list:
    """The modules of `model` that hold LoRA adapters (peft `LoraLayer`s), in module order."""
    if "peft" not in sys.modules:
        return []
    from peft.tuners.lora import LoraLayer

    return [m for m in model.modules() if isinstance(m, LoraLayer)]


@torch.no_grad()
def adapters_are_zero(layers: Sequence) -> bool:
    """Whether every active adapter of `layers` adds nothing (each `lora_B` is all zeros, as peft
    initialises it): the policy then equals its base model exactly."""
    for layer in layers:
        for name in layer.active_adapters:
            if name in layer.lora_B and bool(layer.lora_B[name].weight.any()):
                return False
    return True


class FrozenAdapters:
    """The base model of a LoRA policy, or the policy as it was when this was made, without a second copy
    of the base weights: a reference for the KL term that costs nothing (adapters off) or the adapters' size.

    `with frozen.active(): ...` runs the live `model` with every adapted layer either skipping its adapters
    (when they were all zero at construction, the start of a fresh LoRA run) or using frozen snapshots of
    them (adapters trained before, e.g. by an SFT stage in the same process), in eval mode. Adapter modules
    are swapped in the layers' `ModuleDict`s, never written in place, so tensors autograd saved for the
    policy's own backward stay untouched; everything is restored on exit.
    """

    def __init__(self, model: torch.nn.Module):
        import copy

        self.model, self.layers = model, lora_layers(model)
        if not self.layers:
            raise ValueError("FrozenAdapters needs a model with LoRA adapters (policy.lora_rank > 0)")
        self.snapshots = None
        if not adapters_are_zero(self.layers):
            self.snapshots = [
                {
                    name: (
                        copy.deepcopy(layer.lora_A[name]).requires_grad_(False),
                        copy.deepcopy(layer.lora_B[name]).requires_grad_(False),
                    )
                    for name in layer.active_adapters
                    if name in layer.lora_A
                }
                for layer in self.layers
            ]

    @contextmanager
    def active(self) -> Iterator[torch.nn.Module]:
        modes = [(m, m.training) for m in self.model.modules()]
        self.model.eval()
        undo = []
        try:
            for i, layer in enumerate(self.layers):
                if self.snapshots is None:
                    undo.append((layer, layer._disable_adapters))
                    layer._disable_adapters = True  # peft's own switch (read by every LoRA forward)
                    continue
                for name, (a, b) in self.snapshots[i].items():
                    undo.append((layer, name, layer.lora_A[name], layer.lora_B[name]))
                    layer.lora_A[name], layer.lora_B[name] = a, b
            yield self.model
        finally:
            for entry in reversed(undo):
                if len(entry) == 2:
                    entry[0]._disable_adapters = entry[1]
                else:
                    layer, name, a, b = entry
                    layer.lora_A[name], layer.lora_B[name] = a, b
            for m, training in modes:
                m.training = training
