"""Save a LoRA policy as an ordinary Hugging Face folder, merging one weight at a time.

`save_pretrained(state_dict=...)` needs every tensor at once, so a merged save used to clone every adapted
weight (W + B A * scale) before writing: about 5 GiB on top of the weights for a 3B policy in bfloat16,
which took a 24 GiB machine past its memory (issue 58). Here the safetensors file is streamed instead: its
header is written from the shapes alone (a merged weight has its base weight's shape and dtype), then each
tensor is computed, written and dropped, so the save holds at most one merged weight beyond the model.

A family whose weights transformers converts on save (the MoE variants fuse their experts) cannot be
streamed tensor by tensor: it is merged in memory and written by `save_pretrained`, as before.

The keys and the file are the ones `save_pretrained` writes: tied weights are dropped by transformers' own
`remove_tied_weights_from_state_dict` and the names reverted by its `revert_weight_conversion` (Qwen-VL's
`model.language_model.*` -> `model.*`, `model.visual.*` -> `visual.*`), with the `{"format": "pt"}` metadata
transformers checks on load. tests/test_lora.py compares the folder with save_pretrained's, tensor by tensor.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from embodied.policy.lora import lora_layers

SAFETENSORS_DTYPES = {
    torch.float32: "F32",
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.float64: "F64",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def _merge(layer, base: torch.Tensor) -> Callable[[], torch.Tensor]:
    """The merged weight of one adapted layer, computed when called (`W + sum of its active deltas`)."""

    @torch.no_grad()
    def make() -> torch.Tensor:
        weight = base.detach().clone()
        for adapter in layer.active_adapters:
            if adapter in layer.lora_A:
                weight += layer.get_delta_weight(adapter).to(weight.dtype)
        return weight

    return make


def live_state(model: torch.nn.Module) -> tuple[dict[str, torch.Tensor], dict[int, Callable]]:
    """`model.state_dict()` as if its adapters were merged, under the live module names: an adapted layer's
    `weight` (and `bias`) entry is its base layer's tensor, the adapters' own entries are left out; the
    merged weight of entry `t` is `merges[id(t)]()` (`merges`, the second value)."""
    adapted = set(lora_layers(model))  # once: rebuilt per module it walked every module again (quadratic)
    layers = {name: m for name, m in model.named_modules() if m in adapted}
    state, merges = {}, {}
    for key, value in model.state_dict().items():
        owner = next((n for n in layers if key.startswith(f"{n}.")), None)
        if owner is None:
            state[key] = value
            continue
        rest = key[len(owner) + 1 :]
        if rest in ("base_layer.weight", "base_layer.bias"):
            field = rest.split(".")[-1]
            state[f"{owner}.{field}"] = value
            if field == "weight":
                merges[id(value)] = _merge(layers[owner], value)
    return state, merges


def merged_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Every weight of `model` with its adapters merged (W + B A * scale), under the live names, one merged
    weight computed at a time: what a colocated engine is sent after each step (`model`'s own tensors,
    detached, where nothing is adapted)."""
    state, merges = live_state(model)
    for key, value in state.items():
        yield key, merges[id(value)]() if id(value) in merges else value.detach()


def merged_layout(model: torch.nn.Module) -> tuple[dict[str, torch.Tensor], dict[int, Callable]]:
    """`(state, merges)`: the tensors `save_pretrained` would write for `model` with its adapters merged,
    under the names it would write them (tied weights dropped, conversions reverted), where an adapted layer's
    entry is its base weight standing in for the merged one; `merges[id(entry)]` computes the merged one."""
    from transformers.core_model_loading import revert_weight_conversion
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    state, merges = live_state(model)
    state = remove_tied_weights_from_state_dict(state, model)
    renamed = revert_weight_conversion(model, state)
    if {id(t) for t in renamed.values()} != {id(t) for t in state.values()}:
        raise Unstreamable(state, merges)
    return renamed, merges


class Unstreamable(Exception):
    """transformers converts (not only renames) this model's weights on save (an MoE's experts are fused
    and split): the tensors it writes are not the model's, so they cannot be streamed one by one. Carries the
    model-named state and the merges for the in-memory fallback."""

    def __init__(self, state: dict, merges: dict):
        super().__init__("weights are converted on save")
        self.state, self.merges = state, merges


def _bytes(t: torch.Tensor):
    """A zero-copy little-endian byte view of a contiguous CPU tensor."""
    t = t.detach().contiguous().cpu()
    return t.view(-1).view(torch.uint8).numpy() if t.numel() else b""


def write_safetensors(path: Path, state: dict[str, torch.Tensor], make: dict[int, Callable]) -> None:
    """Write `state` as one safetensors file, computing each tensor whose id is in `make` just before it is
    written (and dropping it after), so the file never exists whole in memory."""
    header, offset = {}, 0
    for name, t in state.items():
        if t.dtype not in SAFETENSORS_DTYPES:
            raise TypeError(f"{name}: dtype {t.dtype} has no safetensors code")
        size = t.numel() * t.element_size()
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for t in state.values():
            data = make[id(t)]() if id(t) in make else t
            f.write(_bytes(data))
            del data
        f.flush()
        os.fsync(f.fileno())


def save_merged(model: torch.nn.Module, folder: Path) -> None:
    """`model` (with LoRA adapters) saved into `folder` as `save_pretrained` would save it with its adapters
    merged: config.json, generation_config.json and model.safetensors, one merged weight at a time."""
    try:
        state, merges = merged_layout(model)
    except Unstreamable as e:  # merged all at once, as save_pretrained needs (MoE families only)
        merged = {k: e.merges[id(v)]() if id(v) in e.merges else v for k, v in e.state.items()}
        model.save_pretrained(folder, safe_serialization=True, state_dict=merged)
        return
    model.config.save_pretrained(folder)
    if getattr(model, "generation_config", None) is not None and model.can_generate():
        model.generation_config.save_pretrained(folder)
    write_safetensors(Path(folder) / "model.safetensors", state, merges)
