"""The sampling seam (`embodied.policy.sampling`): the Hugging Face engine is exactly the `generate` every
call site ran before it, and `rollout.engine` is refused in one line where it is unknown or unread."""

from __future__ import annotations

import pytest
import torch

from embodied.config import Config
from embodied.policy.engines import check_vllm, make_engine
from embodied.policy.model import decode, encode_prompts, generate, repeat_batch
from embodied.policy.sampling import Draw, HFEngine, Prompts, group_prompts, repeat_prompts
from embodied.rl.rewards import mcq_rewards
from embodied.rl.rollout import Sampling, sample_groups, sampling_seed
from embodied.video import VideoConfig


def test_hf_engine_draws_what_generate_draws(tiny_policy, examples):
    """Greedy, seeded per-row temperatures and min-p: the same tokens, texts and truncation flags as a direct
    `generate` call, and the rows of a grouped prompt set carry their record and clip."""
    model, processor = tiny_policy
    video, ex = VideoConfig(), examples[:3]
    prompts = group_prompts(processor, [e.record for e in ex], [e.clip for e in ex], video, "cpu", 2)
    assert [r["id"] for r in prompts.records] == ["t-0", "t-0", "t-1", "t-1", "t-2", "t-2"]
    assert prompts.clips[3][0] is ex[1].clip
    engine = HFEngine(model, processor)
    greedy = engine.sample(prompts, Draw(12))
    ids, mask = generate(model, processor, prompts.batch, 12, do_sample=False)
    assert torch.equal(greedy.ids, ids) and greedy.texts == decode(processor, ids, mask)
    temps, seeds = torch.tensor([0.7, 1.3] * 3), [sampling_seed(5, i) for i in range(6)]
    drawn = engine.sample(prompts, Draw(12, temps, seeds, min_p=0.05))
    ids, mask = generate(model, processor, prompts.batch, 12, temps, seeds=seeds, min_p=0.05)
    assert torch.equal(drawn.ids, ids) and torch.equal(drawn.mask, mask)
    assert drawn.logprobs is None  # the trainer computes the Hugging Face engine's log-probs itself
    ended = (ids == processor.tokenizer.convert_tokens_to_ids("<|im_end|>")).any(1)
    assert torch.equal(drawn.truncated, ~ended) and drawn.truncated.any()  # 12 tokens: some never end


def test_rollouts_through_the_default_engine_equal_rollouts_through_an_explicit_one(tiny_policy, examples):
    model, processor = tiny_policy
    args = (model, processor, examples[:2], VideoConfig(), mcq_rewards(), Sampling(3, 10))
    a = sample_groups(*args, seeds=[1, 2])
    b = sample_groups(*args, seeds=[1, 2], engine=HFEngine(model, processor))
    assert torch.equal(a.ids, b.ids) and a.texts == b.texts and a.engine_logprobs is None


def test_repeat_prompts_repeats_every_row_field(tiny_policy, examples):
    model, processor = tiny_policy
    recs, clips = [e.record for e in examples[:2]], [e.clip for e in examples[:2]]
    batch = encode_prompts(processor, recs, clips, VideoConfig())
    out = repeat_prompts(Prompts(batch, recs, [[c] for c in clips], images=True), 3)
    assert [r["id"] for r in out.records] == ["t-0"] * 3 + ["t-1"] * 3 and out.images and out.history is None
    assert torch.equal(out.batch["input_ids"], repeat_batch(batch, 3)["input_ids"])


def test_engine_settings_are_refused_in_one_line():
    from embodied.run import refuse_unread

    cfg = Config()
    assert make_engine(cfg, None, None) is None  # hf: the model itself samples
    cfg.rollout.engine = "sglang"
    with pytest.raises(ValueError, match=r"rollout.engine='sglang'; choose one of"):
        make_engine(cfg, None, None)
    cfg.rollout.engine = "vllm"
    with pytest.raises(ValueError, match=r"`embodied sft` samples no rollouts"):
        refuse_unread(cfg, "sft")
    cfg.policy.lora_rank = 8
    check_vllm(cfg)  # LoRA is taken: the engine syncs the adapters merged (tests/test_vllm.py)
    cfg.policy.lora_rank, cfg.env.retry_min_p = 0, 0.1  # refused before vLLM is imported
    with pytest.raises(ValueError, match=r"cannot run with env.retry_min_p > 0"):
        make_engine(cfg, None, None)
