"""GRPO groups: G completions of one prompt share that prompt's computation.

A group's G sequences are identical up to the end of the prompt, so the vision tower and the language
model's pass over the prompt only need to run once per prompt, not once per sample. `repeat_batch`
(embodied/policy/model.py) returns a `GroupedBatch`: the repeated tensors that any code can use as a plain
batch, plus the batch before repeating. The functions here use the latter:

- `shared_visual_features`: vision features per prompt, repeated G times (`mm_encoder_outputs`);
- `shared_prefix_logits`: one pass over the prompts that keeps their KV cache (with gradients), the cache
  repeated G times, then one pass over the completions that attends to it. Gradients from the G
  completions add up in the shared prompt activations, exactly as separate passes' would.

On-policy GRPO runs that prompt pass twice with the same weights: to sample (without gradients), then in the
update (with them). Given a `PromptPass` (`GroupedBatch.prompt_pass`, set by the caller that owns it), the
sampler runs the pass once, with gradients, and leaves it there (`sampling_prefill`); it decodes from a
detached copy, and the caller hands the kept pass to the update's policy pass (`completion_outputs(...,
prefix=)`), which then does not recompute it. The numbers are the same either way; the caller asks for it
only when nothing changes the weights between the two (`embodied.train.grpo.keeps_prefix`).
"""

from __future__ import annotations

import copy

import torch

from embodied.policy.architectures import architecture_of, repeat_encoder_output

PROMPT_KEYS = ("input_ids", "attention_mask", "mm_token_type_ids")
VISUAL_KEYS = (
    "pixel_values_videos",
    "video_grid_thw",
    "second_per_grid_ts",
    "pixel_values",
    "image_grid_thw",
)


PIXEL_KEYS = ("pixel_values_videos", "pixel_values")


class GroupedBatch(dict):
    """The tensors of a prompt batch whose prompts are each repeated `group` times in a row (what the
    model sees), plus `unique`, the batch before repeating.

    The repeated pixels (`PIXEL_KEYS`, the bulk of the batch: G copies of every clip) are made only when
    something reads them (`pixels`, a function returning them, is called once then): the grouped passes use
    `unique`'s. Every dict view (`in`, iteration, `keys`, `items`, `dict(batch)`, `**batch`) shows them.
    """

    def __init__(self, tensors: dict, unique, group: int, pixels=None):
        super().__init__(tensors)
        self.unique, self.group, self._pixels = unique, group, pixels
        self.prompt_pass: PromptPass | None = None
        """Where the sampler leaves its pass over the prompts, run with gradients (`sampling_prefill`); set by
        the caller that owns it (GRPO's step); None: the sampler keeps nothing."""

    def _lazy(self) -> list[str]:
        return [k for k in PIXEL_KEYS if k in self.unique] if self._pixels is not None else []

    def materialize(self) -> GroupedBatch:
        if self._pixels is not None:
            fill, self._pixels = self._pixels, None
            super().update(fill())
        return self

    def __missing__(self, key):
        if key in self._lazy():
            return self.materialize()[key]
        raise KeyError(key)

    def __contains__(self, key) -> bool:
        return super().__contains__(key) or key in self._lazy()

    def __iter__(self):
        return iter(self.keys())

    def __len__(self) -> int:
        return super().__len__() + len(self._lazy())

    def keys(self):
        self.materialize()
        return super().keys()

    def items(self):
        self.materialize()
        return super().items()

    def values(self):
        self.materialize()
        return super().values()

    def get(self, key, default=None):
        return self[key] if key in self else default  # noqa: SIM401 - dict.get skips __missing__


class PromptPass:
    """A grouped batch's pass over its prompts (`shared_prefill`), run with gradients by the sampler and kept
    for an update at the same weights, which takes it instead of running it again (see the module
    docstring). It holds one pass at a time, of one model."""

    def __init__(self) -> None:
        self._model = None
        self._kept: tuple | None = None

    def keep(self, model, kept: tuple) -> None:
        """Hold `kept`, `shared_prefill(model, batch)` computed with gradients."""
        self._model, self._kept = model, kept

    def take(self, model) -> tuple | None:
        """The kept pass if `model` ran it (once: it is dropped as it is taken), else None."""
        if self._kept is None or self._model is not model:
            return None
        kept, self._model, self._kept = self._kept, None, None
        return kept


def is_grouped(batch) -> bool:
    """True for a `GroupedBatch` with more than one sample per prompt whose visual tokens can be located
    (the processor's `mm_token_type_ids`)."""
    return isinstance(batch, GroupedBatch) and batch.group > 1 and "mm_token_type_ids" in batch.unique


def shared_visual_features(model, batch: GroupedBatch) -> dict:
    """`mm_encoder_outputs` for the repeated batch, computed once per prompt on `batch.unique`.

    Each prompt's visual tokens (in text order, as the processor laid them out) are repeated `group` times.
    """
    u, n, out = batch.unique, batch.group, {}
    extras = architecture_of(model).encoder_extras  # e.g. Qwen3-VL's deepstack features, repeated alike
    for modality, pix, grid, type_id in (
        ("image", "pixel_values", "image_grid_thw", 1),
        ("video", "pixel_values_videos", "video_grid_thw", 2),
    ):
        if pix not in u:
            continue
        encode = model.get_image_features if modality == "image" else model.get_video_features
        encoded = encode(u[pix], u[grid], return_dict=True)
        rows = (u["mm_token_type_ids"] == type_id).sum(1).tolist()
        out[modality] = repeat_encoder_output(encoded, rows, n, extras)
    return out


def shared_prefill(model, batch: GroupedBatch):
    """One pass over each unique prompt, repeated for its group: `(cache, logits, attention, start)`.

    `cache` holds the prompts' keys and values repeated `group` times in a row, `logits (B*G, V)` predict
    each row's first completion token, `attention (B*G, L)` is the prompts' mask and `start (B*G, 1)` the
    position of the first completion token. The positions are the model architecture's
    (`Architecture.prompt_positions`; Qwen's: 3-D multimodal RoPE, text after the prompt at its unpadded
    length plus its rope delta).
    """
    u, n = batch.unique, batch.group
    prompt = {k: v for k, v in u.items() if k in PROMPT_KEYS or k in VISUAL_KEYS}
    positions, start = architecture_of(model).prompt_positions(model, u)
    first = model(**prompt, position_ids=positions, use_cache=True, logits_to_keep=1)
    cache = first.past_key_values
    repeat_cache(cache, n)
    start = start.repeat_interleave(n, dim=0)
    attention = u["attention_mask"].repeat_interleave(n, dim=0)
    return cache, first.logits[:, -1].repeat_interleave(n, dim=0), attention, start


def sampling_prefill(model, batch: GroupedBatch):
    """`shared_prefill` for the sampler (which runs without gradients). With a `batch.prompt_pass` the pass
    runs with gradients and is kept there for the update; the sampler then gets a detached copy."""
    if batch.prompt_pass is None:
        return shared_prefill(model, batch)
    with torch.enable_grad():
        kept = shared_prefill(model, batch)
    batch.prompt_pass.keep(model, kept)
    cache, logits, attention, start = kept
    return _detached_cache(cache), logits.detach(), attention, start


def _layer_states(layer) -> dict[str, dict]:
    """A linear-attention cache layer's per-state tensors (Qwen3.5's conv and recurrent states), by name."""
    return {
        k: v for k in ("conv_states", "recurrent_states") if isinstance(v := getattr(layer, k, None), dict)
    }


def repeat_cache(cache, n: int) -> None:
    """Repeat every row of a prompt cache `n` times in a row, in place: attention keys and values, and the
    conv and recurrent states of linear-attention layers (which transformers' `batch_repeat_interleave`
    does not cover), so that a group's completions continue from their prompt's state.

    Linear-attention layers also switch to storing new states instead of copying them into the old ones
    (`_store_states`): the completions' pass has to backpropagate into the prompt's states, which an
    in-place copy would overwrite."""
    for layer in cache.layers:
        if hasattr(layer, "batch_repeat_interleave"):  # keys and values (and any index a layer keeps)
            layer.batch_repeat_interleave(n)
        states = _layer_states(layer)
        for by_index in states.values():
            for i, t in by_index.items():
                if isinstance(t, torch.Tensor):
                    by_index[i] = t.repeat_interleave(n, dim=0)
        if states:
            _store_states(layer)


_STORING: dict[type, type] = {}


def _store_states(layer) -> None:
    """Make a linear-attention cache layer keep each update as a new tensor (differentiable through the
    prompt's states): conv states are kept whole (`record_past`, which also skips the single-token kernel
    that updates them in place) and the recurrent state is replaced, not copied into."""
    base = type(layer)
    if base not in _STORING:

        def update_recurrent_state(self, recurrent_states, state_idx: int = 0, **kwargs):
            self.recurrent_states[state_idx] = recurrent_states
            self.is_recurrent_states_initialized[state_idx] = True
            return recurrent_states

        _STORING[base] = type(
            f"Storing{base.__name__}", (base,), {"update_recurrent_state": update_recurrent_state}
        )
    if base not in _STORING.values():
        layer.__class__ = _STORING[base]
    layer.record_past = True


def _detached_cache(cache):
    """A copy of a KV cache whose tensors are detached; decoding appends to the copy, not to `cache`."""
    out = copy.copy(cache)
    out.layers = []
    for layer in cache.layers:
        twin = copy.copy(layer)
        for name, value in vars(layer).items():
            if isinstance(value, torch.Tensor):
                setattr(twin, name, value.detach())
        for name, states in _layer_states(layer).items():  # updated in place by decoding: copies
            detached = {
                i: t.detach().clone() if isinstance(t, torch.Tensor) else t for i, t in states.items()
            }
            setattr(twin, name, detached)
        out.layers.append(twin)
    return out


def shared_prefix_logits(
    model, batch: GroupedBatch, ids: torch.Tensor, mask: torch.Tensor, prefix: tuple | None = None
) -> torch.Tensor:
    """Logits `(B*G, T, V)` predicting completion `ids (B*G, T)`, with each prompt run once (the positions
    as in `shared_prefill`), or not at all when given that pass (`prefix`, a `PromptPass.take`)."""
    cache, head, prompt_mask, start = prefix or shared_prefill(model, batch)
    t = ids.shape[1]
    completion_pos = architecture_of(model).continued_positions(start, torch.arange(t, device=ids.device))
    attention = torch.cat([prompt_mask, mask.to(prompt_mask.dtype)], dim=1)
    rest = model(
        input_ids=ids,
        attention_mask=attention,
        past_key_values=cache,
        position_ids=completion_pos,
        use_cache=True,
        logits_to_keep=t,
    )
    # `head` predicts each completion's first token
    return torch.cat([head.unsqueeze(1), rest.logits[:, :-1]], dim=1)
