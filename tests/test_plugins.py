"""What plugs into GRPO's update: an advantage estimator and a loss term written from docs/training.md alone,
in a module of their own, train a step; misspelt names fail before any work; drift gauges and `target_kl`."""

from __future__ import annotations

import importlib.util
import textwrap

import pytest
import torch
from grpo_configs import grpo_config, grpo_step

from embodied.policy.model import load_policy
from embodied.rl.advantages import unregister_estimator
from embodied.rl.losses import unregister_loss
from embodied.rl.rollout import sample_groups
from embodied.train.grpo import sampling_args, train_grpo
from embodied.train.metrics import read_metrics
from embodied.train.state import Run
from embodied.video import VideoConfig

# what docs/training.md ("A new advantage estimator or loss") shows, as a user would write it
PLUGIN = '''
import torch

from embodied.rl.advantages import Estimate, Estimator, register_estimator
from embodied.rl.losses import register_loss


class Median(Estimator):
    """Each answer's reward minus its group's median."""

    def estimate(self, ro, ctx):
        r = ro.rewards  # (N, G)
        return Estimate(ctx.per_row(r - r.median(1, keepdim=True).values))


register_estimator("median", lambda cfg, model: Median())


@register_loss("logp_l2")
def logp_l2(x):
    """Keeps the sampled tokens' log-probs near 0 (a toy term: the mean squared log-prob)."""
    return x.mean(x.logprobs**2)
'''


def varied_reward(texts, records):
    """A reward with spread for an untrained policy (its answers are unparseable): the text's length."""
    return [{"reward/total": float(len(t) % 3)} for t in texts]


@pytest.fixture
def plugin(tmp_path):
    path = tmp_path / "my_plugin.py"
    path.write_text(textwrap.dedent(PLUGIN))
    spec = importlib.util.spec_from_file_location("my_plugin", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    unregister_estimator("median")
    unregister_loss("logp_l2")


def test_a_new_estimator_and_loss_from_the_docs_train_one_step(plugin, tiny_path, examples, tmp_path):
    torch.manual_seed(0)
    model, processor = load_policy(tiny_path)
    before = [p.detach().clone() for p in model.parameters()]
    cfg = grpo_config(
        dict(steps=1, prompts_per_step=2, group_size=4, max_new_tokens=8, checkpoint_every=0, kl_coef=0.0),
        advantage="median",
        loss_terms={"logp_l2": 0.5},
    )
    run = Run(model, processor, examples[:4], tmp_path, progress=False, reward_fn=varied_reward)
    train_grpo(cfg, run)
    row = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["stage"] == "grpo"][-1]
    assert row["loss/logp_l2"] > 0  # the term was computed and logged
    assert row["reward/group_spread"] > 0  # the median baseline had something to weigh
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_the_new_loss_term_adds_its_weighted_gradient(plugin, tiny_policy, examples):
    """The loss with the term is the loss without it plus weight * term, micro-batch for micro-batch."""
    from embodied.rl.advantages import Estimate

    model, processor = tiny_policy
    torch.manual_seed(0)
    base = dict(prompts_per_step=2, group_size=4, max_new_tokens=8, kl_coef=0.0)
    plain, weighted = grpo_config(base), grpo_config(base, loss_terms={"logp_l2": 2.0})
    ro = sample_groups(model, processor, examples[:2], VideoConfig(), varied_reward, sampling_args(plain))
    est = Estimate(torch.linspace(-1, 1, ro.ids.shape[0]))
    a = grpo_step(model, processor, plain).update(ro, est, torch.Generator())
    model.zero_grad(set_to_none=True)
    b = grpo_step(model, processor, weighted).update(ro, est, torch.Generator())
    model.zero_grad(set_to_none=True)
    assert b["loss/total"] == pytest.approx(a["loss/total"] + 2.0 * b["loss/logp_l2"], rel=1e-5)


def test_misspelt_estimators_and_loss_terms_fail_naming_what_is_registered(tiny_path, examples, tmp_path):
    model, processor = load_policy(tiny_path)
    run = Run(model, processor, examples[:4], tmp_path, progress=False)
    with pytest.raises(ValueError, match=r"grpo.advantage='median' \(choose \('grpo'.*'gae'\)"):
        train_grpo(grpo_config(advantage="median"), run)
    with pytest.raises(ValueError, match=r"grpo.loss_terms: \['nope'\] are not registered"):
        train_grpo(grpo_config(loss_terms={"nope": 1.0}), run)


def test_drift_gauges_and_the_target_kl_stop(tiny_path, examples):
    """With several updates per rollout: `drift/approx_kl` (k3 of the sampling policy against the current
    one, before each step) and the clip fraction over the updates; `target_kl` stops the rollout's updates
    after the first that drifted past it. The first update's policy is the sampling one (approx_kl ~ 0), the
    second's has taken a step (approx_kl > 1e-9), so a target of 1e-9 runs exactly 2 of 4."""
    from embodied.rl.advantages import Estimate  # noqa: F401  (the interface the update takes)

    torch.manual_seed(0)
    model, processor = load_policy(tiny_path)
    base = dict(
        prompts_per_step=2, group_size=4, max_new_tokens=8, kl_coef=0.0, updates_per_rollout=4, lr=1e-3
    )
    ro = sample_groups(
        model, processor, examples[:2], VideoConfig(), varied_reward, sampling_args(grpo_config(base))
    )
    state = {k: v.clone() for k, v in model.state_dict().items()}
    free = grpo_step(model, processor, grpo_config(base)).learn(ro, 1)
    assert free["optim/updates"] == 4 and free["drift/approx_kl"] > 1e-9
    assert 0.0 <= free["drift/clip_fraction_mean"] <= 1.0
    model.load_state_dict(state)
    stopped = grpo_step(model, processor, grpo_config(base, target_kl=1e-9)).learn(ro, 1)
    assert stopped["optim/updates"] == 2 and stopped["drift/approx_kl"] > 1e-9
    one = grpo_step(model, processor, grpo_config(base, updates_per_rollout=1)).learn(ro, 1)
    assert not any(k.startswith("drift/") for k in one) and "optim/updates" not in one  # on-policy: no drift
