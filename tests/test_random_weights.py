"""Real architectures without weights: `random:NAME` on the meta device (exact parameter counts against the
published ones, the FSDP2 units `shard` wraps, the memory plan of `embodied bench memory`), and shrunken
copies of the published configs allocated for real and run end to end (prompt with video -> generate)."""

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
    build_random_policy,
    instantiate,
    known_architectures,
    parameter_counts,
    random_config,
    random_processor,
)
from embodied.train.distributed import fsdp_units
from embodied.video import Clip, VideoConfig

# Counted here on the meta device from the shipped configs (the published config.json files; where each one
# came from: embodied/assets/architectures/README.md).
EXACT = {
    "qwen2.5-vl-3b": {"total": 3_754_622_976, "vision": 668_684_288, "language": 3_085_938_688},
    "qwen2.5-vl-7b": {"total": 8_292_166_656, "vision": 676_550_144, "language": 7_615_616_512},
    "qwen3-vl-2b": {"total": 2_127_532_032, "vision": 406_957_056, "language": 1_720_574_976},
    "qwen3-vl-4b": {"total": 4_437_815_808, "vision": 415_347_712, "language": 4_022_468_096},
    "qwen3-vl-8b": {"total": 8_767_123_696, "vision": 576_388_336, "language": 8_190_735_360},
    "qwen3.5-0.8b": {"total": 852_985_920, "vision": 100_592_896, "language": 752_393_024},
    "qwen3.5-2b": {"total": 2_213_241_664, "vision": 331_416_576, "language": 1_881_825_088},
}
# Published, to two decimals: "3.75 B" for Qwen2.5-VL-3B-Instruct and "8.29 B" for Qwen2.5-VL-7B-Instruct.
PUBLISHED_BILLIONS = {"qwen2.5-vl-3b": 3.75, "qwen2.5-vl-7b": 8.29}
# Published exactly: the tensors in the released safetensors files (the Hub's `safetensors.total`; for the
# sharded 4B and 8B, `metadata.total_size` of model.safetensors.index.json over 2 bytes per bfloat16 weight:
# 8,875,631,616 B and 17,534,247,392 B). Qwen3-VL-4B's `model.visual.` tensors are 830,695,424 B.
PUBLISHED_TOTAL = {
    "qwen3-vl-2b": 2_127_532_032,
    "qwen3-vl-4b": 8_875_631_616 // 2,
    "qwen3-vl-8b": 17_534_247_392 // 2,
    "qwen3.5-0.8b": 873_438_784,
    "qwen3.5-2b": 2_274_069_824,
}
PUBLISHED_VISION = {"qwen3-vl-4b": 830_695_424 // 2}
# (decoder layers, vision blocks, deepstack layers, head tied to the embedding) of each published config.
SHAPE = {
    "qwen2.5-vl-3b": (36, 32, 0, True),
    "qwen2.5-vl-7b": (28, 32, 0, False),
    "qwen3-vl-2b": (28, 24, 3, True),
    "qwen3-vl-4b": (36, 24, 3, True),
    "qwen3-vl-8b": (36, 27, 3, False),
    "qwen3.5-0.8b": (24, 12, 0, True),
    "qwen3.5-2b": (24, 24, 0, True),
}


def mtp_parameters(model) -> int:
    """The multi-token-prediction head that Qwen3.5 checkpoints ship (`mtp.*` tensors,
    `mtp_num_hidden_layers` of them) and `transformers` does not build, counted by hand from the built model:
    each MTP layer is one more full-attention decoder layer, plus a 2h -> h projection of the concatenated
    embedding and hidden state (`mtp.fc`) and three RMSNorms of h (the two inputs', the output's). 0 for a
    model without one."""
    text = model.config.get_text_config()
    n = getattr(text, "mtp_num_hidden_layers", 0) or 0
    if not n:
        return 0
    layers = model.model.language_model.layers
    full = next(layer for layer, kind in zip(layers, text.layer_types) if kind == "full_attention")
    h = text.hidden_size
    return n * sum(p.numel() for p in full.parameters()) + 2 * h * h + 3 * h


@pytest.mark.parametrize("name", sorted(EXACT))
def test_real_size_on_the_meta_device(name):
    model = instantiate(random_config(f"random:{name}"), torch.bfloat16, "meta")
    assert all(p.device.type == "meta" for p in model.parameters())  # nothing was allocated
    counts = parameter_counts(model)
    assert counts == EXACT[name]
    if name in PUBLISHED_BILLIONS:
        assert round(counts["total"] / 1e9, 2) == PUBLISHED_BILLIONS[name]
    else:  # Qwen3.5's published total includes its MTP head (0.8B: 20,452,864; 2B: 60,828,160)
        assert counts["total"] + mtp_parameters(model) == PUBLISHED_TOTAL[name]
    assert counts["vision"] == PUBLISHED_VISION.get(name, counts["vision"])
    # the published architecture, not a default: its layers and blocks, deepstack layers and tied head
    config = model.config
    deepstack = len(getattr(config.vision_config, "deepstack_visual_indexes", None) or [])
    shape = (config.get_text_config().num_hidden_layers, config.vision_config.depth, deepstack)
    tied = model.lm_head.weight is model.get_input_embeddings().weight
    assert (*shape, tied) == SHAPE[name]


@pytest.mark.parametrize("name", ["qwen3.5-0.8b", "qwen3.5-2b"])
def test_qwen3_5_has_three_linear_attention_layers_to_each_full_one(name):
    model = instantiate(random_config(f"random:{name}"), torch.bfloat16, "meta")
    # the built modules, not the config's list: a gated-delta-net layer has `linear_attn`, a full one not
    layers = model.model.language_model.layers
    kinds = ["linear" if hasattr(layer, "linear_attn") else "full" for layer in layers]
    assert [i for i, k in enumerate(kinds) if k == "full"] == [3, 7, 11, 15, 19, 23]
    assert all(hasattr(layers[i], "self_attn") for i in (3, 7, 11, 15, 19, 23))


def test_fsdp_units_of_the_3b_are_its_blocks_tower_and_root():
    model = instantiate(random_config("random:qwen2.5-vl-3b"), torch.bfloat16, "meta")
    units = fsdp_units(model)
    kinds = [type(u).__name__ for u in units]
    assert kinds.count("Qwen2_5_VLDecoderLayer") == 36 and kinds.count("Qwen2_5_VLVisionBlock") == 32
    assert kinds[-2:] == ["Qwen2_5_VisionTransformerPretrainedModel", "Qwen2_5_VLForConditionalGeneration"]
    assert units[-1] is model and len(units) == 70


@pytest.mark.parametrize(
    ("name", "layer", "block", "tower"),
    [
        ("qwen3-vl-4b", ("Qwen3VLTextDecoderLayer", 36), ("Qwen3VLVisionBlock", 24), "Qwen3VLVisionModel"),
        ("qwen3.5-2b", ("Qwen3_5DecoderLayer", 24), ("Qwen3_5VisionBlock", 24), "Qwen3_5VisionModel"),
    ],
)
def test_fsdp_units_of_the_new_families(name, layer, block, tower):
    """`_no_split_modules` names the blocks; the vision tower (with its deepstack mergers) is one unit."""
    model = instantiate(random_config(f"random:{name}"), torch.bfloat16, "meta")
    kinds = [type(u).__name__ for u in fsdp_units(model)]
    assert (kinds.count(layer[0]), kinds.count(block[0])) == (layer[1], block[1])
    assert kinds[-2:] == [tower, type(model).__name__] and len(kinds) == layer[1] + block[1] + 2


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


def test_memory_plan_of_qwen3_vl_8b():
    """The untied 8B: its root unit holds the embedding and the head apart (151936 x 4096 each)."""
    plan = memory_plan("random:qwen3-vl-8b", [1, 8])
    n = EXACT["qwen3-vl-8b"]["total"]
    units = plan["fsdp_units"]
    assert units["params_covered"] == n and units["count"] == 36 + 27 + 2
    assert units["largest"] == {"type": "Qwen3VLForConditionalGeneration", "params": 2 * 151936 * 4096 + 4096}
    bf16 = plan["per_gpu_gib"]["bf16"]
    assert bf16["ddp"]["1"]["total"] == round(8 * n / GIB, 2)  # 65.32 GiB on one GPU
    assert bf16["fsdp"]["8"]["weights"] == pytest.approx(2 * n / 8 / GIB, rel=2e-3, abs=0.01)


def test_unknown_architecture_lists_the_known_ones():
    shipped = ["qwen2.5-vl-3b", "qwen2.5-vl-7b", "qwen3-vl-2b", "qwen3-vl-4b", "qwen3-vl-8b"]
    assert known_architectures() == [*shipped, "qwen3.5-0.8b", "qwen3.5-2b"]  # not the processor files
    with pytest.raises(
        ValueError, match=r"random:qwen2\.5-vl-3b, random:qwen2\.5-vl-7b, random:qwen3-vl-2b"
    ) as e:
        architecture_file("random:qwen2.5-vl-72b")
    assert str(ARCHITECTURES) in str(e.value)
    with pytest.raises(ValueError, match="unknown architecture 'qwen3-vl-preprocessor'"):
        architecture_file("random:qwen3-vl-preprocessor")
    with pytest.raises(ValueError, match="has no folder"):
        resolve_policy_path("random:qwen2.5-vl-3b")


def test_a_config_of_another_family_is_refused(tmp_path):
    path = tmp_path / "llava.json"
    path.write_text(json.dumps({"model_type": "llava_onevision"}))
    with pytest.raises(ValueError, match="model_type 'llava_onevision'; a random: config is one of qwen2_vl"):
        random_config(f"random:{path}")


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


def _shrunken(name: str) -> dict:
    """The published config of `name` with every size cut to a few thousand parameters, its structure kept:
    the layer kinds, deepstack layers, tied head, token ids and processor grid."""
    cfg = json.loads(architecture_file(f"random:{name}").read_text())
    text = cfg["text_config"]
    text |= {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4}
    text |= {"num_key_value_heads": 2, "head_dim": 16, "vocab_size": 4096}
    if cfg["model_type"] == "qwen3_5":  # head_dim 16 x partial rotary 0.25: 2 rotary frequencies
        text |= {"linear_num_key_heads": 2, "linear_num_value_heads": 4}
        text |= {
            "linear_key_head_dim": 16,
            "linear_value_head_dim": 16,
            "layer_types": text["layer_types"][:4],
        }
        text["rope_parameters"] = text["rope_parameters"] | {"mrope_section": [1, 1, 0]}
    else:
        text["rope_scaling"] = text["rope_scaling"] | {"mrope_section": [2, 3, 3]}
    vision = cfg["vision_config"]
    vision |= {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64}
    if vision["deepstack_visual_indexes"]:
        vision["deepstack_visual_indexes"] = [0, 1]
    return cfg


@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory):
    """One tiny tokenizer build for the tests below."""
    return tmp_path_factory.mktemp("cache")


@pytest.mark.parametrize("name", ["qwen3-vl-2b", "qwen3.5-0.8b"])
def test_qwen3_families_allocate_and_generate(name, tiny_cache, tmp_path, monkeypatch):
    """Shrunken Qwen3-VL and Qwen3.5 configs, allocated for real through `policy.path=random:FILE` with the
    tiny tokenizer and Qwen3-VL's published processor settings, answer a prompt with a video: one block of
    video tokens per temporal patch, each after its time in seconds."""
    monkeypatch.setenv("EMBODIED_CACHE", str(tiny_cache))
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(_shrunken(name)))
    model, processor = load(PolicyConfig(path=f"random:{path}", device="cpu", tiny_seed=3))
    assert type(processor).__name__ == "Qwen3VLProcessor"
    assert type(processor.video_processor).__name__ == "Qwen3VLVideoProcessor"
    assert (processor.video_processor.patch_size, processor.video_processor.merge_size) == (16, 2)
    assert (
        processor.image_processor.patch_size == 16 and list(processor.image_processor.image_mean) == [0.5] * 3
    )
    video_id = processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    assert model.config.video_token_id == video_id
    assert model.config.get_text_config().eos_token_id == processor.tokenizer.convert_tokens_to_ids(
        "<|im_end|>"
    )
    frames = np.random.default_rng(0).integers(0, 256, (4, 112, 112, 3), dtype=np.uint8)
    record = {"video": "v.mp4", "question": "Forward or reversed?", "options": ["forward", "reversed"]}
    batch = encode_prompts(processor, [record], [Clip(frames, 2.0)], VideoConfig())
    grid = batch["video_grid_thw"]
    assert grid[0, 0] == 2  # 4 frames, 2 per temporal patch
    assert (batch["input_ids"] == video_id).sum() == grid.prod(-1).sum() // 4 >= 16
    text = processor.tokenizer.decode(batch["input_ids"][0])
    assert text.count(" seconds>") == 2  # one timestamp per temporal patch
    ids, mask = generate(model, processor, batch, max_new_tokens=4, do_sample=False)
    assert ids.shape[0] == 1 and 0 < mask.sum() <= 4


def test_a_processor_folder_must_match_the_family(tiny_cache, tmp_path, monkeypatch):
    """`policy.processor=DIR` loads the folder's processor and keeps the published ids, so a tokenizer
    whose `<|video_pad|>` is not the config's id is refused, and a folder without a tokenizer is named."""
    monkeypatch.setenv("EMBODIED_CACHE", str(tiny_cache))
    random_processor("", "qwen3_vl").save_pretrained(tmp_path / "tiny")  # the tiny tokenizer's ids
    loaded = random_processor(str(tmp_path / "tiny"))
    assert type(loaded).__name__ == "Qwen3VLProcessor" and loaded.video_processor.patch_size == 16
    tiny_id = loaded.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    with pytest.raises(ValueError, match=rf"is id {tiny_id}, the config's video_token_id is 151656"):
        build_random_policy("random:qwen3-vl-2b", torch.bfloat16, "meta", str(tmp_path / "tiny"))
    with pytest.raises(FileNotFoundError, match="holds no tokenizer_config.json"):
        build_random_policy("random:qwen3-vl-2b", torch.bfloat16, "meta", str(tmp_path))


def test_a_random_policy_samples_only_ids_its_tokenizer_decodes(tiny_cache, tmp_path, monkeypatch):
    """`random:` with the tiny tokenizer masks the output layer past the tokenizer's length: sampled answers
    decode to text (without the mask almost every id would decode to ''), log-probs and entropies stay
    finite, the layer keeps its real size, and a saved folder is masked again when loaded."""
    from embodied.policy.model import (
        completion_logprobs,
        completion_outputs,
        decode,
        load_policy,
        save_policy,
    )
    from embodied.policy.random_weights import VOCAB_LIMIT

    monkeypatch.setenv("EMBODIED_CACHE", str(tiny_cache))
    cfg = _shrunken("qwen3.5-0.8b")
    cfg["text_config"]["vocab_size"] = 20_000
    path = tmp_path / "wide.json"
    path.write_text(json.dumps(cfg))
    model, processor = load(PolicyConfig(path=f"random:{path}", device="cpu", tiny_seed=1))
    limit = len(processor.tokenizer)
    assert getattr(model.config, VOCAB_LIMIT) == limit < model.get_output_embeddings().out_features == 20_000
    frames = np.random.default_rng(0).integers(0, 256, (4, 64, 64, 3), dtype=np.uint8)
    record = {"video": "v.mp4", "question": "Forward or reversed?", "options": ["forward", "reversed"]}
    batch = encode_prompts(processor, [record] * 4, [Clip(frames, 2.0)] * 4, VideoConfig())
    ids, mask = generate(model, processor, batch, max_new_tokens=12, seeds=[0, 1, 2, 3])
    assert int(ids[mask.bool()].max()) < limit
    assert all(text.strip() for text in decode(processor, ids, mask))
    logp, entropy, _ = completion_outputs(model, batch, ids, mask, entropy="detached")
    assert torch.isfinite(logp).all() and torch.isfinite(entropy).all()
    save_policy(model, processor, tmp_path / "saved")
    again, _ = load_policy(tmp_path / "saved")
    with torch.no_grad():
        torch.testing.assert_close(completion_logprobs(again, batch, ids, mask), logp)
    model.get_output_embeddings()._forward_hooks.clear()  # the failure this guards against
    raw, raw_mask = generate(model, processor, batch, max_new_tokens=12, seeds=[0, 1, 2, 3])
    assert (raw[raw_mask.bool()] >= limit).float().mean() > 0.5


def test_a_half_precision_head_gets_a_contiguous_input_on_the_cpu(tiny_cache, monkeypatch):
    """torch's CPU linear on a strided bfloat16 input holds a float32 copy of the whole weight (0.95 GiB
    for Qwen3.5-0.8B's head); the loops slice the hidden states before the head, so a bf16 head gets a
    pre-hook that makes its input contiguous (same logits), and a float32 head is left alone."""
    from embodied.policy.random_weights import _contiguous_input

    monkeypatch.setenv("EMBODIED_CACHE", str(tiny_cache))
    half, _ = load(PolicyConfig(path="tiny:qwen3.5", dtype="bfloat16"))
    full, _ = load(PolicyConfig(path="tiny:qwen3.5"))
    assert _contiguous_input in half.get_output_embeddings()._forward_pre_hooks.values()
    assert not full.get_output_embeddings()._forward_pre_hooks
    head = half.get_output_embeddings()
    hidden = torch.randn(2, 9, head.in_features, dtype=torch.bfloat16)
    seen = []
    head.register_forward_pre_hook(lambda m, a: seen.append(a[0].is_contiguous()))
    out = head(hidden[:, -3:])
    assert seen == [True] and torch.equal(
        out, torch.nn.functional.linear(hidden[:, -3:].contiguous(), head.weight)
    )
