"""The vision tower's attention in one call when its sequences are equally long.

Qwen2.5-VL's vision blocks attend within windows (and, in some blocks, within whole frames). With a flash
kernel those packed sequences go in one call; with any other (`sdpa`, `eager`: every CPU run) `transformers`
splits them and calls attention once per sequence. At the quickstart's size that is 64 calls of 64 patches
per block per forward pass (32 clips, 2 temporal patches each, one 112 x 112 window per frame), and the
backward pass repeats the loop.

When every sequence has the same length, as with frames of one size, the split is a reshape: the same
attention runs once over a batch of sequences. Each sequence's output is the same computation on the same
numbers, so outputs and gradients are bitwise those of the loop (`tests/test_policy_attention.py`). Sequences
of different lengths (images of several sizes in one batch) and flash kernels go through the original code.
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def _packed_class():
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as qwen

    class PackedVisionAttention(qwen.Qwen2_5_VLVisionAttention):
        """`Qwen2_5_VLVisionAttention` with equal-length sequences attended in one batched call."""

        def forward(self, hidden_states, cu_seqlens, position_embeddings=None, max_seqlen=None, **kwargs):
            lengths = cu_seqlens[1:] - cu_seqlens[:-1]
            n = lengths.numel()
            if (
                n < 2
                or qwen.is_flash_attention_requested(self.config)
                or self.config._attn_implementation != "sdpa"
                or kwargs.get("output_attentions")
                or not bool((lengths == lengths[0]).all())
            ):
                return super().forward(hidden_states, cu_seqlens, position_embeddings, max_seqlen, **kwargs)
            size, length = hidden_states.shape[0], int(lengths[0])
            qkv = self.qkv(hidden_states).reshape(size, 3, self.num_heads, -1).permute(1, 0, 2, 3)
            q, k, v = qkv.unbind(0)
            cos, sin = position_embeddings
            q, k = qwen.apply_rotary_pos_emb_vision(q, k, cos, sin)
            # (patches, heads, dim) -> (sequences, heads, length, dim): the loop's slices, stacked
            q, k, v = (t.reshape(n, length, self.num_heads, -1).transpose(1, 2) for t in (q, k, v))
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=self.scaling)
            return self.proj(out.transpose(1, 2).reshape(size, -1))

    return qwen.Qwen2_5_VLVisionAttention, PackedVisionAttention


def pack_vision_attention(model) -> int:
    """Give every Qwen2.5-VL vision attention module of `model` the batched forward (in place; weights,
    state dict and saved files are unchanged). Returns how many modules changed (0 for other models)."""
    try:
        stock, packed = _packed_class()
    except ImportError:  # a transformers without Qwen2.5-VL: nothing to pack
        return 0
    changed = 0
    for module in model.modules():
        if type(module) is stock:
            module.__class__ = packed
            changed += 1
    return changed
