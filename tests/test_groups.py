"""GRPO groups share their prompt's work: same log-probs and gradients as separate sequences."""

import numpy as np
import pytest
import torch

from embodied.policy.groups import GroupedBatch, is_grouped
from embodied.policy.model import (
    completion_logprobs,
    encode_completions,
    encode_prompts,
    generate,
    repeat_batch,
)
from embodied.video import Clip, VideoConfig

Q = {"question": "Is this video playing forward or reversed in time?", "options": ["forward", "reversed"]}


@pytest.fixture
def tiny(tiny_policy):
    return tiny_policy  # the session's tiny model (conftest.py): these tests leave it as they found it


def _grouped(processor, n=3):
    """Mixed prompts (images, a video, a longer text) of different padded lengths, each repeated n times."""
    rng = np.random.default_rng(0)
    clips = [Clip(rng.integers(0, 256, (k, 112, 112, 3), dtype=np.uint8), 2.0) for k in (4, 2, 3)]
    records = [
        {**Q, "images": ["a0", "a1", "a2", "a3"]},
        {**Q, "video": "b.mp4"},
        {
            "question": "Which way does the ball roll after it hits the wall?",
            "options": ["up", "down", "left"],
            "images": ["c0", "c1", "c2"],
        },
    ]
    return repeat_batch(encode_prompts(processor, records, clips, VideoConfig()), n)


def _completions(processor, rows):
    # Different lengths: right padding with mask 0, as after an early end-of-turn.
    texts = ["<think></think><answer>A</answer>", "<answer>B</answer>", "x", "<answer>C</answer> y z"]
    return encode_completions(processor, [texts[i % len(texts)] for i in range(rows)])


def _logp_and_grads(model, batch, ids, mask):
    model.zero_grad(set_to_none=True)
    logp = completion_logprobs(model, batch, ids, mask)
    ((logp * mask).sum() / mask.sum()).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return logp.detach() * mask, grads


def test_shared_prompt_pass_matches_separate_sequences(tiny):
    model, processor = tiny
    grouped = _grouped(processor)
    assert isinstance(grouped, GroupedBatch) and is_grouped(grouped)
    plain = dict(grouped)  # same tensors, no group structure: every sequence runs on its own
    assert not is_grouped(plain)
    ids, mask = _completions(processor, grouped["input_ids"].shape[0])
    model.train()
    try:
        lp_shared, g_shared = _logp_and_grads(model, grouped, ids, mask)
        lp_plain, g_plain = _logp_and_grads(model, plain, ids, mask)
    finally:
        model.eval()
    torch.testing.assert_close(lp_shared, lp_plain, atol=1e-5, rtol=0)
    assert g_shared.keys() == g_plain.keys() and any("visual" in k for k in g_plain)
    for k in g_plain:
        torch.testing.assert_close(g_shared[k], g_plain[k], atol=1e-5, rtol=1e-4, msg=k)


def test_grouped_generation_samples_each_prompt_group_times(tiny):
    model, processor = tiny
    grouped = _grouped(processor, n=4)
    # top_k=1 sampling is greedy: one encoding per prompt expanded 4x must equal greedy on the repeats
    torch.manual_seed(0)
    ids, mask = generate(model, processor, grouped, 8)
    assert ids.shape == (12, 8)
    from embodied.policy.model import eos_token_ids, vision_token_ids

    kw = dict(
        max_new_tokens=8,
        eos_token_id=eos_token_ids(model, processor),
        pad_token_id=processor.tokenizer.pad_token_id,
        suppress_tokens=vision_token_ids(processor),
    )
    once = model.generate(**grouped.unique, do_sample=True, top_k=1, num_return_sequences=4, **kw)
    each = model.generate(**dict(grouped), do_sample=False, **kw)
    assert torch.equal(once, each)


def test_select_rows_keeps_whole_groups_grouped(tiny):
    from embodied.policy.model import select_rows

    model, processor = tiny
    grouped = _grouped(processor, n=2)  # 3 prompts x 2
    whole = select_rows(grouped, [2, 3, 4, 5])  # groups 1 and 2: the video prompt and the 3-image one
    assert is_grouped(whole) and whole.unique["input_ids"].shape[0] == 2
    assert whole["image_grid_thw"].shape[0] == 2 * 3 and whole["video_grid_thw"].shape[0] == 2
    assert not is_grouped(select_rows(grouped, [1, 2]))  # splits groups: plain rows
    ids, mask = _completions(processor, 4)
    with torch.no_grad():
        a = completion_logprobs(model, whole, ids, mask)
        b = completion_logprobs(model, dict(whole), ids, mask)
    torch.testing.assert_close(a * mask, b * mask, atol=1e-5, rtol=0)


@pytest.mark.parametrize("max_new_tokens", [1, 12])
def test_shared_prompt_sampling_draws_the_same_tokens_as_generate(tiny, max_new_tokens):
    """The grouped sampler (each prompt prefilled once, its cache repeated) picks exactly the tokens of
    Hugging Face's `generate` over the repeated rows: seeds, temperatures, suppression, padding, width."""
    model, processor = tiny
    grouped = _grouped(processor, n=4)
    rows = grouped["input_ids"].shape[0]
    seeds = list(range(100, 100 + rows))
    temps = torch.tensor([0.7, 1.0, 1.5, 3.0] * (rows // 4))
    model.eval()
    fast = generate(model, processor, grouped, max_new_tokens, temps, seeds=seeds)
    slow = generate(model, processor, grouped, max_new_tokens, temps, seeds=seeds, share_prompt=False)
    assert fast[0].shape == slow[0].shape
    assert torch.equal(fast[0], slow[0]) and torch.equal(fast[1], slow[1])


def test_kept_prompt_pass_gives_the_update_the_same_numbers(examples, tiny_path, tmp_path, monkeypatch):
    """GRPO with the sampler's prompt pass kept for the update (`keeps_prefix`) ends with bitwise the
    parameters of the run that recomputes it, and the update really took the kept pass."""
    from embodied.config import GRPOConfig
    from embodied.policy import groups
    from embodied.policy.model import load_policy
    from embodied.train import grpo
    from embodied.train.state import Run

    cfg = GRPOConfig(steps=3, prompts_per_step=4, group_size=4, max_new_tokens=8, kl_coef=0.04, log_every=1)
    decide, taken, passes, final = grpo.keeps_prefix, [], [], {}
    take, prefill = groups.PromptPass.take, groups.shared_prefill

    def spy(self, model):
        kept = take(self, model)
        taken.append(kept is not None)
        return kept

    def counted(*args):
        passes.append(1)
        return prefill(*args)

    monkeypatch.setattr(groups.PromptPass, "take", spy)
    monkeypatch.setattr(groups, "shared_prefill", counted)
    for keep in (False, True):
        monkeypatch.setattr(grpo, "keeps_prefix", lambda *a, keep=keep: keep and decide(*a))
        taken.clear()
        passes.clear()
        model, processor = load_policy(tiny_path)
        grpo.train_grpo(cfg, Run(model, processor, examples, tmp_path / str(keep), progress=False))
        final[keep] = {k: v.detach().clone() for k, v in model.named_parameters()}
        # per step: the update's policy pass takes the kept pass, so it runs the sampler's and the
        # reference's prompt passes only, not its own
        assert taken == ([True] * 3 if keep else [])
        assert len(passes) == (2 * 3 if keep else 3 * 3)
    assert all(torch.equal(final[True][k], final[False][k]) for k in final[True])


def test_keeps_prefix_only_where_the_update_sees_the_same_weights(tiny):
    from embodied.config import GRPOConfig
    from embodied.envs.config import Turns
    from embodied.train.distributed import Processes
    from embodied.train.grpo import keeps_prefix

    model, procs, one = tiny[0], Processes(), Turns()
    assert keeps_prefix(model, model, GRPOConfig(), procs, None, one)
    for change in ({"updates_per_rollout": 2}, {"dynamic_sampling": True}, {"micro_batch_size": 4}):
        assert not keeps_prefix(model, model, GRPOConfig(**change), procs, None, one), change
    assert not keeps_prefix(model, model, GRPOConfig(), procs, None, Turns(n=2))  # multi-turn episodes
    assert not keeps_prefix(torch.nn.Identity(), model, GRPOConfig(), procs, None, one)  # a wrapper
