"""Block expansion (LLaMA Pro, Wu et al. 2024, section 3.1): a deeper language model that starts as the
loaded one.

Each new decoder layer is a copy of an existing one whose two output projections (attention's `o_proj` and
the MLP's `down_proj`) are zero, so it adds nothing to the residual stream: the expanded model computes
exactly what the loaded one did, token for token, and fine-tuning grows the new layers from there. The
copies' other weights are the source layer's, so a new layer starts from features the model already uses.

Why here: the tiny bases' language model has 2 layers. Choosing an option by its content (the order a
temporal puzzle's option lists, the arrangement a spatial puzzle's option shows) is an in-context look-up,
which needs layers that compose (docs/cosmos.md); pretraining a deeper base from scratch would lose what
the shipped one learned about the worlds.
"""

from __future__ import annotations

import copy

import torch


def expansion_sources(n_layers: int, n_new: int) -> list[int]:
    """The original layer each new layer copies and follows, spread evenly as LLaMA Pro does: with 2 layers
    and 2 new ones, [0, 1] (a new layer after each); with 36 and 4, [8, 17, 26, 35]; more new layers than
    old ones follow the same layers again, e.g. 2 and 4: [0, 0, 1, 1]."""
    if n_layers < 1 or n_new < 0:
        raise ValueError(f"cannot expand {n_layers} layers by {n_new}")
    return [((i + 1) * n_layers - 1) // n_new for i in range(n_new)]


def text_model(model) -> torch.nn.Module:
    """The language model (the decoder stack) of a Qwen-family vision-language model."""
    lm = getattr(getattr(model, "model", model), "language_model", None)
    if lm is None or not hasattr(lm, "layers"):
        raise ValueError(f"{type(model).__name__} has no language_model.layers to expand")
    return lm


def text_layers(model) -> torch.nn.ModuleList:
    """The decoder layers of a Qwen-family vision-language model's language model."""
    return text_model(model).layers


def _mixer(layer) -> torch.nn.Module:
    """A decoder layer's token mixer: its attention, or (Qwen3.5) its linear attention."""
    return layer.self_attn if hasattr(layer, "self_attn") else layer.linear_attn


def _output_projection(layer) -> torch.nn.Linear:
    mixer = _mixer(layer)
    return mixer.o_proj if hasattr(mixer, "o_proj") else mixer.out_proj


@torch.no_grad()
def expand_layers(model, n_new: int) -> list[int]:
    """Insert `n_new` identity-initialised decoder layers into `model`'s language model in place (see the
    module docstring); the config (`num_hidden_layers`, `layer_types`) and every layer's cache index follow,
    so the model saves and loads as an ordinary folder of the deeper architecture. Returns the index, in the
    expanded stack, of each new layer."""
    if n_new == 0:
        return []
    text = text_model(model)
    layers = text.layers
    sources = expansion_sources(len(layers), n_new)
    cfg = model.config.text_config if hasattr(model.config, "text_config") else model.config
    types = list(getattr(cfg, "layer_types", None) or ["full_attention"] * len(layers))
    stack, kinds, new_at = [], [], []
    for i, layer in enumerate(layers):
        stack.append(layer)
        kinds.append(types[i])
        for _ in range(sources.count(i)):
            twin = copy.deepcopy(layer)
            for proj in (_output_projection(twin), twin.mlp.down_proj):
                proj.weight.zero_()
                if proj.bias is not None:
                    proj.bias.zero_()
            new_at.append(len(stack))
            stack.append(twin)
            kinds.append(types[i])
    for i, layer in enumerate(stack):
        _mixer(layer).layer_idx = i  # the cache is indexed by layer
    text.layers = torch.nn.ModuleList(stack)
    for c in (cfg, text.config):  # often one object; setting it twice is harmless
        c.num_hidden_layers = len(stack)
        if getattr(c, "layer_types", None) is not None:
            c.layer_types = kinds
    return new_at
