"""The reference policy's passes over prompts, kept across GRPO steps (`grpo.ref_cache_mb`).

GRPO's KL term needs the frozen initial policy's log-probs of every sampled answer, and its pass over a
prompt (the vision tower and the prompt's keys and values) never changes; the same prompts come back every
epoch. `PrefixCache` keeps those passes and `policy.groups.shared_prefill` reuses them.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import torch

from embodied.policy.groups import VISUAL_KEYS, prefill
from embodied.policy.model import select_rows


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
            cache, logits, deltas = prefill(model, select_rows(u, missing))
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
