"""GRPO's sampler/trainer correction (`grpo.is_correction`): the engine's log-probs weigh each token's
policy-gradient term as `rl.losses.engine_is_weights` says, nothing changes without them
(`rollout.engine=hf`), and settings that cannot act are named."""

from __future__ import annotations

import math

import pytest
import torch
from grpo_configs import grpo_config, grpo_step

from embodied.policy.model import load_policy
from embodied.policy.sampling import HFEngine, Samples
from embodied.rl.advantages import Estimate
from embodied.rl.rollout import rollout_logprobs, sample_groups
from embodied.train.distributed import Processes
from embodied.train.grpo import check_config, check_run, inert_correction, sampling_args, train_grpo
from embodied.train.metrics import read_metrics
from embodied.train.state import Run
from embodied.video import VideoConfig

BASE = dict(prompts_per_step=2, group_size=4, max_new_tokens=8, kl_coef=0.0)


def varied_reward(texts, records):
    """A reward with spread for an untrained policy: the text's length."""
    return [{"reward/total": float(len(t) % 3)} for t in texts]


def _grads(model, processor, cfg, ro, advantages) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    metrics = grpo_step(model, processor, cfg).update(ro, Estimate(advantages), torch.Generator())
    grads = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return grads, metrics


def _close(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) > 0 and all(torch.allclose(x, y, atol=1e-7, rtol=1e-4) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def rollout(tiny_policy, examples):
    """A Hugging Face rollout (one prompt, 4 answers) and the loss's own log-probs of it at these weights."""
    model, processor = tiny_policy
    torch.manual_seed(0)
    ro = sample_groups(
        model, processor, examples[:1], VideoConfig(), varied_reward, sampling_args(grpo_config(BASE))
    )
    return ro, rollout_logprobs(model, ro)


def test_the_weight_scales_each_tokens_gradient_as_the_formula_says(tiny_policy, rollout):
    """One update on the policy that sampled (every PPO ratio 1, no clip binds), kl 0: each token's gradient
    is -A w_t d log pi_t, so the corrected gradient with advantages A is the uncorrected one with advantages
    A w (per token, `(B, T)`). The engine's log-probs are the trainer's minus a synthetic gap."""
    model, processor = tiny_policy
    ro, trainer = rollout
    # log pi_old - log pi_engine per token: noise, and each row's first token set so that the rows' sums are
    # ln 5, ln 2, -ln 2 and 0 (sequence ratios 5, 2, 0.5 and 1)
    torch.manual_seed(1)
    gap = 0.3 * torch.randn(trainer.shape) * ro.mask
    gap[:, 0] = torch.tensor([math.log(5), math.log(2), -math.log(2), 0.0]) - gap[:, 1:].sum(1)
    adv = torch.linspace(-1.0, 1.0, ro.ids.shape[0])
    ro.engine_logprobs = (trainer - gap) * ro.mask
    try:
        # token_truncate, cap 3: w_t = min(exp(gap_t), 3)
        w_tok = gap.exp().clamp(max=3.0)
        got, m = _grads(model, processor, grpo_config(BASE, is_correction="token_truncate"), ro, adv)
        want, _ = _grads(model, processor, grpo_config(BASE, is_correction="off"), ro, adv[:, None] * w_tok)
        assert _close(got, want)
        real = ro.mask.bool()
        assert m["rollout/is_ratio_max"] == pytest.approx(float(gap.exp()[real].max()), rel=1e-5)
        assert m["rollout/is_ratio_mean"] == pytest.approx(float(gap.exp()[real].mean()), rel=1e-5)
        assert m["rollout/is_truncated_frac"] == pytest.approx(float((gap.exp()[real] > 3).float().mean()))
        assert m["rollout/is_truncated_frac"] > 0  # the cap acted
        # sequence_mask, cap 3 (the default): w = r = exp(sum_t gap_t) on every token of the row, 0 above 3
        r = gap.sum(1).exp()
        assert torch.allclose(r, torch.tensor([5.0, 2.0, 0.5, 1.0]))
        w_seq = torch.where(r <= 3, r, 0.0)
        got, m = _grads(model, processor, grpo_config(BASE), ro, adv)
        want, _ = _grads(model, processor, grpo_config(BASE, is_correction="off"), ro, adv * w_seq)
        assert _close(got, want)
        assert m["rollout/is_masked_frac"] == pytest.approx(0.25)  # the row at 5
        assert m["rollout/is_ratio_max"] == pytest.approx(float(r.max()), rel=1e-5)
        # micro-batches: the same gradient and statistics (a maximum over the parts)
        cfg = grpo_config(BASE, micro_batch_size=3)  # rows 0-2, then 3
        split, m3 = _grads(model, processor, cfg, ro, adv)
        assert _close(split, got) and m3 == pytest.approx(m, rel=1e-5, abs=1e-6)
    finally:
        ro.engine_logprobs = None


def test_no_engine_log_probs_leave_the_update_bit_for_bit(tiny_policy, rollout):
    """`rollout.engine=hf`: no engine log-probs, so under every mode the update is the uncorrected one
    exactly, and nothing is logged for it."""
    model, processor = tiny_policy
    ro, _ = rollout
    assert ro.engine_logprobs is None
    adv = torch.linspace(-1.0, 1.0, ro.ids.shape[0])
    off, m_off = _grads(model, processor, grpo_config(BASE, is_correction="off"), ro, adv)
    for mode in ("sequence_mask", "token_mask"):
        on, m_on = _grads(model, processor, grpo_config(BASE, is_correction=mode), ro, adv)
        assert all(torch.equal(a, b) for a, b in zip(off, on)) and m_on == m_off
        assert not any(k.startswith("rollout/is_") for k in m_on)


class OffsetEngine(HFEngine):
    """Hugging Face sampling on the policy, reporting as its own log-probs a constant per token: a stand-in
    for an engine whose numbers differ from the trainer's."""

    name = "offset"

    def sample(self, prompts, draw) -> Samples:
        out = super().sample(prompts, draw)
        out.logprobs = -2.0 * out.mask.float()
        return out


def test_a_run_with_engine_log_probs_logs_the_correction(tiny_path, examples, tmp_path):
    torch.manual_seed(0)
    model, processor = load_policy(tiny_path)
    cfg = grpo_config(BASE, steps=1, checkpoint_every=0, log_every=1)
    run = Run(model, processor, examples[:4], tmp_path, progress=False, reward_fn=varied_reward)
    run.engine = OffsetEngine(model, processor)
    train_grpo(cfg, run)
    row = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["stage"] == "grpo"][-1]
    assert 0 < row["rollout/is_ratio_mean"] <= row["rollout/is_ratio_max"] < math.exp(20)
    assert 0.0 <= row["rollout/is_masked_frac"] <= 1.0 and row["rollout/is_weight_mean"] >= 0
    assert "rollout/logprob_diff" in row  # the engine's gap, logged before the update as before


def test_settings_that_cannot_act_are_named_and_bad_bounds_refused():
    engine = object()
    assert inert_correction(grpo_config(), None) == []  # the defaults: quiet under hf
    assert inert_correction(grpo_config(), engine) == []
    named = inert_correction(grpo_config(is_correction="token_truncate", is_cap=2.0), None)
    assert [n.split(" ")[0] for n in named] == ["grpo.is_correction=token_truncate", "grpo.is_cap=2.0"]
    assert "rollout.engine=hf" in named[0]
    assert inert_correction(grpo_config(is_correction="off"), engine) == []
    assert inert_correction(grpo_config(is_correction="off", is_floor=0.5), engine)[0].startswith(
        "grpo.is_floor=0.5 (grpo.is_correction=off"
    )
    assert inert_correction(grpo_config(is_correction="token_truncate", is_floor=0.5), engine) == [
        "grpo.is_floor=0.5 (grpo.is_correction=token_truncate caps from above only)"
    ]
    assert inert_correction(grpo_config(is_correction="token_mask", is_floor=0.5), engine) == []
    with pytest.warns(UserWarning, match=r"grpo.is_correction=token_mask .*never acts"):
        check_run(grpo_config(is_correction="token_mask"), Run(None, None, (), "unused"), Processes())
    with pytest.raises(ValueError, match=r"grpo.is_correction='seq_mask' \(choose"):
        check_config(grpo_config(is_correction="seq_mask"))
    for bad in (dict(is_cap=0.5), dict(is_floor=1.5), dict(is_floor=-0.1)):
        with pytest.raises(ValueError, match="0 <= is_floor <= 1 <= is_cap"):
            check_config(grpo_config(**bad))
