"""GRPO groups: G completions of one prompt share that prompt's computation.

A group's G sequences are identical up to the end of the prompt, so the vision tower and the language
model's pass over the prompt only need to run once per prompt, not once per sample. `repeat_batch`
(embodied/policy/model.py) returns a `GroupedBatch`: the repeated tensors that any code can use as a plain
batch, plus the batch before repeating. The functions here use the latter:

- `shared_visual_features`: vision features per prompt, repeated G times (`mm_encoder_outputs`);
- `shared_prefix_logits`: one pass over the prompts that keeps their KV cache (with gradients), the cache
  repeated G times, then one pass over the completions that attends to it. Gradients from the G
  completions add up in the shared prompt activations, exactly as separate passes' would.
- `PrefixCache`: a frozen model's prompt passes kept across steps (GRPO's reference policy meets the same
  prompts again every epoch, and its pass over a prompt never changes).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import torch

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


def is_grouped(batch) -> bool:
    """True for a `GroupedBatch` with more than one sample per prompt whose visual tokens can be located
    (the processor's `mm_token_type_ids`)."""
    return isinstance(batch, GroupedBatch) and batch.group > 1 and "mm_token_type_ids" in batch.unique


def shared_visual_features(model, batch: GroupedBatch) -> dict:
    """`mm_encoder_outputs` for the repeated batch, computed once per prompt on `batch.unique`.

    Each prompt's visual tokens (in text order, as the processor laid them out) are repeated `group` times.
    """
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    u, n, out = batch.unique, batch.group, {}
    for modality, pix, grid, type_id in (
        ("image", "pixel_values", "image_grid_thw", 1),
        ("video", "pixel_values_videos", "video_grid_thw", 2),
    ):
        if pix not in u:
            continue
        encode = model.get_image_features if modality == "image" else model.get_video_features
        feats = torch.cat(encode(u[pix], u[grid], return_dict=True).pooler_output)
        rows = feats.split((u["mm_token_type_ids"] == type_id).sum(1).tolist())
        repeated = torch.cat([r for r in rows for _ in range(n)])
        out[modality] = BaseModelOutputWithPooling(pooler_output=(repeated,))
    return out


def _prefill(model, u: dict):
    """The pass over the left-padded prompts `u`: `(KV cache, last logits (B, V), RoPE deltas (B, 1))`."""
    prompt = {k: v for k, v in u.items() if k in PROMPT_KEYS or k in VISUAL_KEYS}
    positions, deltas = model.model.get_rope_index(
        u["input_ids"],
        image_grid_thw=u.get("image_grid_thw"),
        video_grid_thw=u.get("video_grid_thw"),
        attention_mask=u["attention_mask"],
        second_per_grid_ts=u.get("second_per_grid_ts"),
        mm_token_type_ids=u["mm_token_type_ids"],
    )
    first = model(**prompt, position_ids=positions, use_cache=True, logits_to_keep=1)
    return first.past_key_values, first.logits[:, -1], deltas


class PrefixCache:
    """A frozen model's passes over prompts, kept across steps and reused: GRPO's reference policy.

    Each entry is one prompt's keys and values at its real (unpadded) tokens, the logits after its last
    token and its RoPE delta, keyed by a hash of its tokens and pixels (not by an id: a prompt is reused
    only when it is the same prompt). A batch is assembled from its entries, the padding's keys and values
    zero (the attention mask hides them), so the log-probs equal an uncached pass up to float summation
    order. Least recently used entries go first once the entries hold more than `max_mb` MiB. Only for a
    model that does not change and needs no gradient: it refuses to run with autograd on.
    """

    def __init__(self, max_mb: float = 256.0):
        self.max_bytes = int(max_mb * 2**20)
        self.entries: OrderedDict[bytes, tuple] = OrderedDict()
        self.bytes = self.hits = self.misses = 0

    @staticmethod
    def key(u: dict, row: int) -> bytes:
        """A digest of prompt `row` of the unique batch `u`: its real tokens and its visual inputs."""
        from embodied.policy.model import select_rows

        h = hashlib.blake2b(digest_size=16)
        real = u["attention_mask"][row].bool()
        visual = sorted((k, v) for k, v in select_rows(u, [row]).items() if k in VISUAL_KEYS)
        for name, t in [("input_ids", u["input_ids"][row][real]), *visual]:
            t = t.detach().contiguous()
            h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).cpu().numpy().tobytes())
        return h.digest()

    @staticmethod
    def _size(entry: tuple) -> int:
        kv, logits, _, _ = entry
        return sum(t.numel() * t.element_size() for pair in kv for t in pair) + logits.numel() * 4

    def _store(self, key: bytes, entry: tuple) -> None:
        self.entries[key] = entry
        self.bytes += self._size(entry)
        while self.bytes > self.max_bytes and len(self.entries) > 1:
            self.bytes -= self._size(self.entries.popitem(last=False)[1])

    def prefill(self, model, u: dict):
        """`(cache, logits (B, V), lengths (B, 1), deltas (B, 1))` for the unique batch `u`, running the
        model only on the prompts not seen before."""
        if torch.is_grad_enabled():
            raise RuntimeError("PrefixCache serves a frozen model: call it under torch.no_grad()")
        from transformers.cache_utils import DynamicCache

        from embodied.policy.model import select_rows

        mask = u["attention_mask"]
        lengths = mask.sum(1)
        keys = [self.key(u, i) for i in range(mask.shape[0])]
        found = {k: self.entries[k] for k in keys if k in self.entries}
        for k in found:
            self.entries.move_to_end(k)
        missing = list({k: i for i, k in enumerate(keys) if k not in found}.values())  # one row per prompt
        self.hits += len(keys) - len(missing)
        self.misses += len(missing)
        if missing:
            cache, logits, deltas = _prefill(model, select_rows(u, missing))
            for j, i in enumerate(missing):
                n = int(lengths[i])
                kv = [(lay.keys[j, :, -n:].clone(), lay.values[j, :, -n:].clone()) for lay in cache.layers]
                found[keys[i]] = (kv, logits[j].clone(), deltas[j].clone(), n)
                self._store(keys[i], found[keys[i]])
        width = mask.shape[1]
        entries = [found[k] for k in keys]
        layers = []
        for layer in range(len(entries[0][0])):
            pairs = []
            for which in (0, 1):
                first = entries[0][0][layer][which]
                full = first.new_zeros((len(entries), first.shape[0], width, first.shape[2]))
                for i, (kv, _, _, n) in enumerate(entries):
                    full[i, :, width - n :] = kv[layer][which]
                pairs.append(full)
            layers.append(tuple(pairs))
        logits = torch.stack([e[1] for e in entries])
        deltas = torch.stack([e[2] for e in entries])
        return DynamicCache(ddp_cache_data=layers), logits, lengths.unsqueeze(1), deltas

    def stats(self) -> dict[str, float]:
        """Hit rate and size so far (the GRPO log's `ref_cache/*`)."""
        seen = self.hits + self.misses
        return {
            "ref_cache/hit_rate": self.hits / seen if seen else 0.0,
            "ref_cache/mib": self.bytes / 2**20,
            "ref_cache/prompts": float(len(self.entries)),
        }


def shared_prefill(model, batch: GroupedBatch, prefix_cache: PrefixCache | None = None):
    """One pass over each unique prompt, repeated for its group: `(cache, logits, attention, start)`.

    `cache` holds the prompts' keys and values repeated `group` times in a row, `logits (B*G, V)` predict
    each row's first completion token, `attention (B*G, L)` is the prompts' mask and `start (B*G, 1)` the
    position of the first completion token. Qwen2-VL's multimodal RoPE gives the prompt 3-D positions; text
    after it continues at `L + t + rope_delta` on all three axes (L = the prompt's unpadded length). With
    `prefix_cache` (a frozen model under no_grad) prompts seen before are not run again.
    """
    u, n = batch.unique, batch.group
    if prefix_cache is not None:
        cache, logits, lengths, deltas = prefix_cache.prefill(model, u)
    else:
        cache, logits, deltas = _prefill(model, u)
        lengths = u["attention_mask"].sum(1, keepdim=True)
    cache.batch_repeat_interleave(n)
    start = (lengths + deltas).repeat_interleave(n, dim=0)
    attention = u["attention_mask"].repeat_interleave(n, dim=0)
    return cache, logits.repeat_interleave(n, dim=0), attention, start


def shared_prefix_logits(
    model, batch: GroupedBatch, ids: torch.Tensor, mask: torch.Tensor, prefix_cache: PrefixCache | None = None
) -> torch.Tensor:
    """Logits `(B*G, T, V)` predicting completion `ids (B*G, T)`, with each prompt run once (the positions
    as in `shared_prefill`; `prefix_cache` as there)."""
    cache, head, prompt_mask, start = shared_prefill(model, batch, prefix_cache)
    t = ids.shape[1]
    completion_pos = (start + torch.arange(t, device=ids.device)).unsqueeze(0).expand(3, -1, -1)
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
