"""Prompts with frames given as images (records with `images`): batching, grouping, scoring."""

import numpy as np
import pytest
import torch

from embodied.policy.architectures import visual_items
from embodied.policy.model import (
    completion_logprobs,
    encode_prompts,
    generate,
    repeat_batch,
)
from embodied.video import Clip, VideoConfig

Q = {"question": "Is this video playing forward or reversed in time?", "options": ["forward", "reversed"]}


@pytest.fixture
def tiny(tiny_policy):
    return tiny_policy  # the session's tiny model (conftest.py): these tests leave it as they found it


def _mixed():
    rng = np.random.default_rng(0)
    clips = [Clip(rng.integers(0, 256, (n, 112, 112, 3), dtype=np.uint8), 2.0) for n in (4, 2, 3)]
    records = [
        {**Q, "images": ["a0", "a1", "a2", "a3"]},
        {**Q, "video": "b.mp4"},
        {"question": "Which way?", "options": ["up", "down", "left"], "images": ["c0", "c1", "c2"]},
    ]
    return records, clips


def test_image_records_get_one_image_per_frame(tiny):
    _, processor = tiny
    records, clips = _mixed()
    batch = encode_prompts(processor, records, clips, VideoConfig())
    assert visual_items(batch, "image_grid_thw", 1) == [4, 0, 3]
    # a 112 x 112 image is one 8 x 8 patch grid (16 merged tokens); the 2-frame video one temporal patch
    assert batch["image_grid_thw"].tolist() == [[1, 8, 8]] * 7
    assert batch["video_grid_thw"].tolist() == [[1, 8, 8]]
    assert (batch["mm_token_type_ids"] == 1).sum(1).tolist() == [64, 0, 48]


def test_repeat_batch_with_images_equals_encoding_repeated_records(tiny):
    model, processor = tiny
    records, clips = _mixed()
    grouped = repeat_batch(encode_prompts(processor, records, clips, VideoConfig()), 3)
    direct = encode_prompts(
        processor, [r for r in records for _ in range(3)], [c for c in clips for _ in range(3)], VideoConfig()
    )
    assert grouped.keys() == set(direct.keys())
    for k in direct:
        assert torch.equal(grouped[k], direct[k]), k
    torch.manual_seed(0)
    ids, mask = generate(model, processor, grouped, 6)
    with torch.no_grad():
        a = completion_logprobs(model, grouped, ids, mask)
        b = completion_logprobs(model, direct, ids, mask)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)  # grouped: prompt run once, float order differs


def test_image_count_must_match_the_clip(tiny):
    _, processor = tiny
    clip = Clip(np.zeros((2, 112, 112, 3), np.uint8), 2.0)
    with pytest.raises(ValueError, match="3 images but its clip has 2 frames"):
        encode_prompts(processor, [{**Q, "id": "x", "images": ["0", "1", "2"]}], [clip], VideoConfig())
