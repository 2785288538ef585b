"""The vision tower's batched attention (Qwen2.5-VL's `patch_vision_attention`,
embodied/policy/architectures/qwen2_vl.py) gives bitwise the loop's numbers."""

from __future__ import annotations

import pytest
import torch

from embodied.policy.architectures import architecture_of
from embodied.policy.model import encode_prompts
from embodied.video import Clip, VideoConfig


def _vision_pass(model, batch):
    """The video features and every vision parameter's gradient of a scalar of them."""
    model.zero_grad()
    feats = torch.cat(
        model.model.get_video_features(
            batch["pixel_values_videos"], batch["video_grid_thw"], return_dict=True
        ).pooler_output
    )
    feats.pow(2).mean().backward()
    grads = {n: p.grad.clone() for n, p in model.model.visual.named_parameters() if p.grad is not None}
    model.zero_grad()
    return feats.detach(), grads


def _set(model, packed: bool) -> None:
    from embodied.policy.architectures.qwen2_vl import packed_attention

    stock, fast = packed_attention()
    for m in model.modules():
        if type(m) in (stock, fast):
            m.__class__ = fast if packed else stock


@pytest.mark.parametrize("sizes", [(112, 112), (112, 56)], ids=["equal-windows", "mixed-sizes"])
def test_packed_vision_attention_equals_the_loop_bitwise(tiny_policy, examples, sizes):
    model, processor = tiny_policy
    assert sum(type(m).__name__ == "PackedVisionAttention" for m in model.modules()) == 2  # load_policy packs
    clips = []
    for ex, side in zip(examples[:6], sizes * 3):
        frames = ex.clip.frames[:, :side, :side]  # 56 px: a smaller window, so sequence lengths differ
        clips.append(Clip(frames.copy(), ex.clip.fps))
    batch = encode_prompts(processor, [e.record for e in examples[:6]], clips, VideoConfig())
    model.train()
    try:
        _set(model, packed=False)
        loop_feats, loop_grads = _vision_pass(model, batch)
        _set(model, packed=True)
        feats, grads = _vision_pass(model, batch)
    finally:
        _set(model, packed=True)
        model.eval()
    assert torch.equal(feats, loop_feats)
    assert grads.keys() == loop_grads.keys() and grads
    for name in grads:
        assert torch.equal(grads[name], loop_grads[name]), name


def test_packing_leaves_other_models_alone():
    other = torch.nn.Sequential(torch.nn.Linear(2, 2))
    assert architecture_of(other).patch_vision_attention(other) == 0
