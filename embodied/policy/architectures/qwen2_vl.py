"""Qwen2-VL and Qwen2.5-VL: 14 px patches merged 2 x 2 (a 28 px unit), one block of tokens per video.

The video processor reads `size` per frame (`shortest_edge` / `longest_edge` are a frame's smallest and
largest pixel area), with `cap_pixels_per_frame` as qwen-vl-utils does, so the framework's per-frame budget
passes through as it is.

The vision tower's attention runs in one call when its sequences are equally long (`patch_vision_attention`).
Qwen2.5-VL's vision blocks attend within windows (and, in some blocks, within whole frames). With a flash
kernel those packed sequences go in one call; with any other (`sdpa`, `eager`: every CPU run) transformers
splits them and calls attention once per sequence: at the quickstart's size 64 calls of 64 patches per block
per forward pass (32 clips, 2 temporal patches each, one 112 x 112 window per frame), and the backward pass
repeats the loop. When every sequence has the same length, as with frames of one size, the split is a
reshape: the same attention runs once over a batch of sequences, each sequence's output the same
computation on the same numbers, so outputs and gradients are bitwise those of the loop
(`tests/test_policy_attention.py`). Sequences of different lengths (images of several sizes in one batch)
and flash kernels take the original code.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from embodied.policy.architectures import Architecture, video_metadata_kwargs
from embodied.video import Clip, VideoConfig, frame_pixel_cap


class Qwen2VL(Architecture):
    name = "qwen2-vl"
    model_types = ("qwen2_vl", "qwen2_5_vl")
    processors = ("Qwen2VLProcessor", "Qwen2_5_VLProcessor")
    trains = True

    def video_inputs(self, clips: Sequence[Clip], video: VideoConfig) -> dict:
        longest = max(len(c.frames) for c in clips)
        kwargs = video_metadata_kwargs(clips)
        kwargs["size"] = {"shortest_edge": video.min_pixels, "longest_edge": frame_pixel_cap(longest, video)}
        return {"videos": [c.frames for c in clips], "videos_kwargs": kwargs}

    def patch_vision_attention(self, model) -> int:
        """Give every Qwen2.5-VL vision attention module of `model` the batched forward (`packed_attention`;
        Qwen2-VL's own vision attention is left as it is)."""
        stock, packed = packed_attention()
        changed = 0
        for module in model.modules():
            if type(module) is stock:
                module.__class__ = packed
                changed += 1
        return changed


@functools.cache
def packed_attention() -> tuple[type, type]:
    """`(Qwen2_5_VLVisionAttention, its subclass that attends equal-length sequences in one call)`."""
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


ARCHITECTURE = Qwen2VL()
