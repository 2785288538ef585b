"""The tiny Qwen2.5-VL: deterministic build, save/load, batching that padding cannot change."""

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from embodied.policy.model import (
    completion_logprobs,
    completion_mask,
    count_parameters,
    encode_completions,
    encode_prompts,
    generate,
    load_policy,
    repeat_batch,
    resolve_policy_path,
    save_policy,
    vision_token_ids,
)
from embodied.policy.tiny import TinySpec, build_tiny_policy
from embodied.video import Clip, VideoConfig


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = build_tiny_policy(tmp_path_factory.mktemp("tiny") / "model", TinySpec(seed=0))
    return load_policy(path)


def _clips(n, seed=0):
    rng = np.random.default_rng(seed)
    return [Clip(rng.integers(0, 256, (4, 112, 112, 3), dtype=np.uint8), 2.0) for _ in range(n)]


def _records():
    return [
        {
            "question": "Is this video playing forward or reversed in time?",
            "options": ["forward", "reversed"],
            "video": "a.mp4",
        },
        {"question": "Which way?", "options": ["up", "down", "left"], "video": "b.mp4"},
    ]


def test_build_is_deterministic_and_seeded(tmp_path):
    a = build_tiny_policy(tmp_path / "a", TinySpec(seed=0))
    b = build_tiny_policy(tmp_path / "b", TinySpec(seed=0))
    c = build_tiny_policy(tmp_path / "c", TinySpec(seed=1))
    wa, wb, wc = (load_file(p / "model.safetensors") for p in (a, b, c))
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert any(not torch.equal(wa[k], wc[k]) for k in wa)
    assert (a / "tokenizer.json").read_text() == (b / "tokenizer.json").read_text()


def test_tiny_model_is_a_real_qwen2_5_vl(tiny):
    model, processor = tiny
    assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    assert type(processor).__name__ == "Qwen2_5_VLProcessor"
    assert 0.5e6 < count_parameters(model) < 3e6
    tok = processor.tokenizer
    # tags are whole tokens, so generation and parsing never split them
    assert tok.tokenize("<think>x</think><answer>A</answer>")[:1] == ["<think>"]
    assert "<answer>" in tok.tokenize("<answer>A</answer>")


def test_save_load_round_trip(tiny, tmp_path):
    model, processor = tiny
    save_policy(model, processor, tmp_path / "saved")
    save_policy(model, processor, tmp_path / "saved")  # overwriting an existing folder works
    model2, _ = load_policy(tmp_path / "saved")
    batch = encode_prompts(processor, _records()[:1], _clips(1), VideoConfig())
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, model2(**batch).logits)


def test_missing_checkpoint_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        resolve_policy_path(str(tmp_path / "nowhere"))


def test_batched_logprobs_equal_one_by_one(tiny):
    """Left padding, the video inputs and M-RoPE positions must not change any sequence's log-probs."""
    model, processor = tiny
    records, clips = _records(), _clips(2)
    batch = encode_prompts(processor, records, clips, VideoConfig())
    assert (
        batch["attention_mask"][1].sum() < batch["attention_mask"].shape[1]
        or batch["attention_mask"][0].sum() < batch["attention_mask"].shape[1]
    )  # padding is exercised
    ids, mask = encode_completions(
        processor, ["<think>a b c</think><answer>A</answer>", "<answer>B</answer>"]
    )
    with torch.no_grad():
        together = completion_logprobs(model, batch, ids, mask)
        for i in range(2):
            single = encode_prompts(processor, records[i : i + 1], clips[i : i + 1], VideoConfig())
            n = int(mask[i].sum())
            alone = completion_logprobs(model, single, ids[i : i + 1, :n], mask[i : i + 1, :n])
            assert torch.allclose(together[i, :n], alone[0], atol=1e-5)


def test_repeat_batch_makes_identical_groups(tiny):
    model, processor = tiny
    batch = encode_prompts(processor, _records(), _clips(2), VideoConfig())
    grouped = repeat_batch(batch, 3)
    assert grouped["input_ids"].shape[0] == 6
    assert grouped["pixel_values_videos"].shape[0] == 3 * batch["pixel_values_videos"].shape[0]
    ids, mask = encode_completions(processor, ["<answer>A</answer>"] * 6)
    with torch.no_grad():
        lp = completion_logprobs(model, grouped, ids, mask)
    assert torch.allclose(lp[0], lp[2], atol=1e-6) and torch.allclose(lp[3], lp[5], atol=1e-6)
    assert not torch.allclose(lp[0], lp[3], atol=1e-6)  # different prompt and video


def test_completion_mask_stops_after_first_eos():
    ids = torch.tensor([[5, 6, 9, 7, 9], [9, 1, 1, 1, 1], [1, 2, 3, 4, 5]])
    expected = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]])
    assert torch.equal(completion_mask(ids, [9]), expected)


def test_generation_never_emits_vision_placeholders(tiny):
    model, processor = tiny
    batch = repeat_batch(encode_prompts(processor, _records(), _clips(2), VideoConfig()), 4)
    torch.manual_seed(0)
    ids, mask = generate(model, processor, batch, max_new_tokens=24, temperature=1.5)
    assert ids.shape[0] == 8
    assert not torch.isin(ids, torch.tensor(vision_token_ids(processor))).any()
