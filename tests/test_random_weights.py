"""Real architectures without weights: `random:qwen2.5-vl-3b/7b` on the meta device (exact parameter counts,
the FSDP2 units `shard` wraps, the memory plan of `embodied bench memory`), and a shrunken copy of the
published config allocated for real and run end to end (prompt with video -> generate)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from embodied.bench.memory_plan import GIB, memory_plan
from embodied.policy.model import PolicyConfig, encode_prompts, generate, load, resolve_policy_path
from embodied.policy.random_weights import (
    ARCHITECTURES,
    architecture_file,
    instantiate,
    known_architectures,
    parameter_counts,
    random_config,
)
from embodied.train.distributed import fsdp_units
from embodied.video import Clip, VideoConfig

# Counted here on the meta device from the shipped configs (the published config.json files). Published:
# "3.75 B" for Qwen2.5-VL-3B-Instruct and "8.29 B" for Qwen2.5-VL-7B-Instruct, vision tower included.
EXACT = {
    "qwen2.5-vl-3b": {"total": 3_754_622_976, "vision": 668_684_288, "language": 3_085_938_688},
    "qwen2.5-vl-7b": {"total": 8_292_166_656, "vision": 676_550_144, "language": 7_615_616_512},
}
PUBLISHED_BILLIONS = {"qwen2.5-vl-3b": 3.75, "qwen2.5-vl-7b": 8.29}


@pytest.mark.parametrize("name", sorted(EXACT))
def test_real_size_on_the_meta_device(name):
    model = instantiate(random_config(f"random:{name}"), torch.bfloat16, "meta")
    assert all(p.device.type == "meta" for p in model.parameters())  # nothing was allocated
    counts = parameter_counts(model)
    assert counts == EXACT[name]
    assert round(counts["total"] / 1e9, 2) == PUBLISHED_BILLIONS[name]
    # the published architecture, not a default: 36 / 28 decoder layers, 32 vision blocks, tied 3B head
    text = model.config.get_text_config()
    assert (text.num_hidden_layers, model.config.vision_config.depth) == {"qwen2.5-vl-3b": (36, 32)}.get(
        name, (28, 32)
    )
    assert (model.lm_head.weight is model.get_input_embeddings().weight) == (name == "qwen2.5-vl-3b")


def test_fsdp_units_of_the_3b_are_its_blocks_tower_and_root():
    model = instantiate(random_config("random:qwen2.5-vl-3b"), torch.bfloat16, "meta")
    units = fsdp_units(model)
    kinds = [type(u).__name__ for u in units]
    assert kinds.count("Qwen2_5_VLDecoderLayer") == 36 and kinds.count("Qwen2_5_VLVisionBlock") == 32
    assert kinds[-2:] == ["Qwen2_5_VisionTransformerPretrainedModel", "Qwen2_5_VLForConditionalGeneration"]
    assert units[-1] is model and len(units) == 70


def test_memory_plan_of_the_real_sizes():
    plan = memory_plan("random:qwen2.5-vl-3b", [1, 2, 4, 8])
    n = EXACT["qwen2.5-vl-3b"]["total"]
    units = plan["fsdp_units"]
    assert units["params_covered"] == n and units["count"] == 70
    # the root unit (tied embedding/head 151936 x 2048 + final norm) is the largest all-gather
    assert units["largest"] == {"type": "Qwen2_5_VLForConditionalGeneration", "params": 151936 * 2048 + 2048}
    bf16, fp32 = plan["per_gpu_gib"]["bf16"], plan["per_gpu_gib"]["fp32_master"]
    assert bf16["bytes_per_param"]["total"] == 8 and fp32["bytes_per_param"]["total"] == 16
    assert bf16["ddp"]["1"]["total"] == round(8 * n / GIB, 2)  # one process: 27.97 GiB, nothing else
    assert bf16["ddp"]["8"]["ddp_buckets"] == round(2 * n / GIB, 2)  # DDP's second gradient copy
    for world in (2, 4, 8):
        shard = bf16["fsdp"][str(world)]
        # each process holds 1/world of the state (dim-0 padding adds < 0.1%) plus the transient gathers
        assert shard["weights"] == pytest.approx(2 * n / world / GIB, rel=2e-3, abs=0.01)
        assert shard["total"] < bf16["ddp"][str(world)]["total"]
    assert [bf16["fsdp"][str(w)]["total"] for w in (2, 4, 8)] == sorted(
        (bf16["fsdp"][str(w)]["total"] for w in (2, 4, 8)), reverse=True
    )
    assert plan["per_gpu_gib"]["bf16_fp32_moments"]["available_here"] is False


def test_unknown_architecture_lists_the_known_ones():
    assert known_architectures() == ["qwen2.5-vl-3b", "qwen2.5-vl-7b"]
    with pytest.raises(ValueError, match=r"random:qwen2\.5-vl-3b, random:qwen2\.5-vl-7b") as e:
        architecture_file("random:qwen2.5-vl-72b")
    assert str(ARCHITECTURES) in str(e.value)
    with pytest.raises(ValueError, match="has no folder"):
        resolve_policy_path("random:qwen2.5-vl-3b")


def test_random_policy_allocates_and_generates(tmp_path, monkeypatch):
    """A shrunken copy of the published 3B config, allocated for real through `policy.path=random:FILE`,
    with the tiny tokenizer and the published processor settings, answers a prompt with a video."""
    monkeypatch.setenv("EMBODIED_CACHE", str(tmp_path / "cache"))
    cfg = json.loads(architecture_file("random:qwen2.5-vl-3b").read_text())
    cfg |= {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4}
    cfg |= {"num_key_value_heads": 2, "vocab_size": 4096, "bos_token_id": 0, "eos_token_id": 2}
    cfg["rope_scaling"] = {"type": "mrope", "mrope_section": [2, 3, 3]}  # head_dim 16
    cfg["vision_config"] |= {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2}
    cfg["vision_config"] |= {"out_hidden_size": 64, "fullatt_block_indexes": [1]}
    path = tmp_path / "small.json"
    path.write_text(json.dumps(cfg))
    model, processor = load(PolicyConfig(path=f"random:{path}", device="cpu", tiny_seed=3))
    assert next(model.parameters()).device.type == "cpu"
    assert model.config.video_token_id == processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    assert processor.video_processor.temporal_patch_size == 2 and processor.image_processor.merge_size == 2
    frames = np.random.default_rng(0).integers(0, 256, (4, 112, 112, 3), dtype=np.uint8)
    record = {"video": "v.mp4", "question": "Forward or reversed?", "options": ["forward", "reversed"]}
    batch = encode_prompts(processor, [record], [Clip(frames, 2.0)], VideoConfig())
    # 4 frames of 112 px: 2 temporal patches x (8 x 8 patches of 14 px / 2 x 2 merge) = 32 tokens
    assert (batch["input_ids"] == model.config.video_token_id).sum() == 32
    ids, mask = generate(model, processor, batch, max_new_tokens=4, do_sample=False)
    assert ids.shape[0] == 1 and 0 < mask.sum() <= 4
    again, _ = load(PolicyConfig(path=f"random:{path}", device="cpu", tiny_seed=3))
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))  # seeded
