"""Memory switches for big checkpoints: LoRA adapters (peft) and gradient checkpointing.

LoRA is injected in place (`peft.inject_adapter_in_model`), so the policy stays the same
`Qwen2_5_VLForConditionalGeneration` object that every loop, `generate` and `completion_logprobs` already
handle; only the adapter weights train. Saving merges the adapters into the base weights on the fly
(`merged_state_dict`) and writes an ordinary Hugging Face folder that loads with no peft at all; the live
model keeps its separate adapters, so training can go on after a save (the quickstart saves mid-run).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence

import torch

from embodied.policy.config import LORA_TARGETS_DEFAULT
from embodied.policy.families import family_of


def lora_target_regex(
    targets: Sequence[str], vision: bool = False, vision_prefixes: Sequence[str] = ("visual.",)
) -> str:
    """A peft `target_modules` regex (full match on module names) for the linear layers named `targets`.

    Vision towers reuse the names gate_proj/up_proj/down_proj (Qwen) or q_proj/k_proj/v_proj (SigLIP), so
    without `vision` the pattern excludes every module under one of the family's `vision_prefixes` (the
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
        target_modules=lora_target_regex(targets, vision, family_of(model).vision_prefixes),
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


@torch.no_grad()
def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict of `model` with every LoRA adapter merged into its base weight (W + B A * scale),
    under the base model's own key names; `model` is left unchanged."""
    from peft.tuners.lora import LoraLayer

    state = {}
    lora_prefixes = set()
    for name, module in model.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        lora_prefixes.add(name)
        base = module.get_base_layer()
        weight = base.weight.detach().clone()
        for adapter in module.active_adapters:
            if adapter in module.lora_A:
                weight += module.get_delta_weight(adapter).to(weight.dtype)
        state[f"{name}.weight"] = weight
        if getattr(base, "bias", None) is not None:
            state[f"{name}.bias"] = base.bias.detach()
    for key, value in model.state_dict().items():
        if any(key.startswith(f"{p}.") for p in lora_prefixes):
            continue  # base_layer.* and lora_* entries of an adapted layer: merged above
        state[key] = value
    return state


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
