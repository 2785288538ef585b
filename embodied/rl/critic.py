"""PPO's critic as an advantage estimator (`grpo.advantage=gae`, settings `grpo.ppo.*`).

A value head on the policy's last hidden states (`rl.ppo.ValueHead`), trained beside it by the clipped value
loss, is the baseline; GAE turns the rewards and its values into per-token advantages. It is an `Estimator`
like the group baselines: it estimates, adds its loss term to each micro-batch, holds the policy still during
its warm-up and reports how well it fits. The math is `embodied.rl.ppo`'s.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from embodied.rl.advantages import Context, Estimate, Estimator, register_estimator
from embodied.rl.losses import kl_estimate, masked_mean
from embodied.rl.ppo import (
    ValueHead,
    explained_variance,
    first_tokens,
    gae_advantages,
    prompt_explainable_variance,
    sequence_values,
    value_loss,
)
from embodied.rl.rollout import Rollout, rollout_logprobs

VALUE_LEVELS = ("token", "sequence")

EVERY_STEP = ("critic/", "loss/value", "clip/value_fraction")
"""The critic's metrics, logged at every step (not only every `log_every`): they say whether it learns."""


def check_ppo(cfg, world: int = 1) -> list[str]:
    """What is wrong with `cfg.ppo` (a `GRPOConfig`'s) for a run over `world` processes, one line each."""
    p, bad = cfg.ppo, []
    if p.value_level not in VALUE_LEVELS:
        bad.append(f"grpo.ppo.value_level={p.value_level!r} (choose {VALUE_LEVELS})")
    value_lam = p.lam if p.value_lam is None else p.value_lam
    if not (0 <= p.gamma <= 1 and 0 <= p.lam <= 1 and 0 <= value_lam <= 1):
        bad.append(
            f"grpo.ppo.gamma={p.gamma}, grpo.ppo.lam={p.lam} and grpo.ppo.value_lam={p.value_lam} "
            "must lie in [0, 1]"
        )
    if p.value_level == "sequence" and not (p.gamma == 1 and p.lam == 1):
        bad.append(
            "grpo.ppo.value_level=sequence needs grpo.ppo.gamma=1 and grpo.ppo.lam=1 (A_t = G_t - V(s_0))"
        )
    if min(p.value_hidden, p.value_warmup_steps, p.value_ev_patience) < 0:
        bad.append("grpo.ppo.value_hidden, value_warmup_steps and value_ev_patience must be >= 0")
    if p.kl_in_reward and cfg.advantage != "gae":
        bad.append("grpo.ppo.kl_in_reward needs grpo.advantage=gae (per-token rewards go through GAE)")
    if world > 1 and cfg.advantage == "gae":
        bad.append("grpo.advantage=gae (PPO's value head) with several processes is not supported yet")
    return bad


@dataclass
class CriticEstimate(Estimate):
    """PPO's estimate of one rollout: GAE's advantages `(B, T)` and what the value loss needs."""

    old_values: torch.Tensor | None = None
    """`(B, T)` the head's values when the rollout was scored: the centre of the value clip."""
    returns: torch.Tensor | None = None
    """`(B, T)` GAE's lambda-returns, the values' targets."""
    value_mask: torch.Tensor | None = None
    """`(B, T)` the tokens whose values are trained: every real one, or (`value_level=sequence`) the first."""
    v_count: int = 0
    """The trained values of the whole rollout (over processes): the value loss's normaliser."""


class Critic(Estimator):
    """A float32 value head with a zero-initialised output layer on the policy's last hidden states (the
    backbone is shared unless `value_detach`; a layer of its own with `value_hidden` units), on the policy's
    device, and the settings of `grpo.ppo`."""

    every_step = EVERY_STEP

    def __init__(self, cfg, model):
        self.cfg, p = cfg, cfg.ppo
        text = getattr(model.config, "text_config", model.config)
        device = next(model.parameters()).device
        self.value_head = ValueHead(
            text.hidden_size, device=device, hidden_units=p.value_hidden, detach=p.value_detach
        )
        self.modules = {"value_head": self.value_head}
        self.watch = CriticWatch(p.value_ev_patience)

    def param_groups(self, lr: float) -> list[dict]:
        return [{"params": list(self.value_head.parameters()), "lr": lr * self.cfg.ppo.value_lr_scale}]

    def head(self, policy_learns: bool) -> torch.nn.Module:
        """The head; in the warm-up it reads detached hidden states, so its loss trains the head alone."""
        return self.value_head if policy_learns else _Detached(self.value_head)

    def policy_learns(self, step: int) -> bool:
        return step > self.cfg.ppo.value_warmup_steps

    @torch.no_grad()
    def estimate(self, ro: Rollout, ctx: Context) -> CriticEstimate:
        """One no-grad pass for the sampling policy's log-probs and the head's values, the per-token KL to the
        reference when it goes in the reward (`kl_in_reward`), then GAE (advantages whitened as set)."""
        cfg, p, mask = self.cfg, self.cfg.ppo, ctx.mask
        old_logp, old_values = rollout_logprobs(ctx.model, ro, ctx.micro_batch_size, self.value_head)
        baseline = self.baseline(old_values, mask)
        kl = None
        if p.kl_in_reward and ctx.ref is not None:
            with ctx.ref.active() as frozen:
                ref_logp = rollout_logprobs(frozen, ro, ctx.micro_batch_size)
            kl = kl_estimate(old_logp, ref_logp, cfg.kl_estimator)
        kl_coef = cfg.kl_coef if kl is not None else 0.0
        rewards = ro.rewards.flatten()
        advantages, returns = gae_advantages(
            rewards, baseline, mask, p.gamma, p.lam, kl, kl_coef,
            whitened=p.whiten, value_lam=p.value_lam, scaled=p.whiten_std,
        )  # fmt: skip
        metrics = {
            "critic/value_mean": float(masked_mean(baseline, mask)),
            "critic/return_mean": float(masked_mean(returns, mask)),
            "critic/explained_variance": float(explained_variance(baseline, returns, mask)),
        }
        if kl is not None:
            metrics["critic/kl_reward"] = float(masked_mean(kl, mask))
        value_mask = first_tokens(mask) if p.value_level == "sequence" else mask
        if ro.group_size >= 2:  # what a perfect V(s_0) could explain of these returns
            g0 = (returns * first_tokens(mask)).sum(1).view(ro.rewards.shape)
            metrics["critic/explainable_variance"] = float(prompt_explainable_variance(g0))
        count = value_mask.sum()
        v_count = int(ctx.all_sum(count) if ctx.all_sum is not None else count)
        return CriticEstimate(advantages, old_logp, metrics, old_values, returns, value_mask, v_count)

    def baseline(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """`(B, T)` the values the advantages are taken against: the head's per-token values, or with
        `value_level=sequence` each answer's V(s_0) on all its tokens."""
        return sequence_values(values, mask) if self.cfg.ppo.value_level == "sequence" else values

    def loss(self, values: torch.Tensor, idx: list[int], est: CriticEstimate) -> tuple[torch.Tensor, dict]:
        """`vf_coef` times the clipped value loss of rows `idx`, normalised by the whole rollout's values."""
        p = self.cfg.ppo
        v_loss, v_clip = value_loss(
            values, est.old_values[idx], est.returns[idx], est.value_mask[idx], p.value_clip, est.v_count
        )
        return p.vf_coef * v_loss, {"loss/value": v_loss.detach(), "clip/value_fraction": v_clip}

    @torch.no_grad()
    def after_update(self, ro: Rollout, ctx: Context, est: CriticEstimate, step: int) -> dict:
        """How well the head now fits the rollout it was just trained on: the explained variance of its
        values after the updates against the same returns. Beside `critic/explained_variance` (the values the
        advantages were made with, before the head saw this rollout) it separates a critic that cannot fit
        from one that fits but does not carry over to new questions. Also feeds the watch."""
        _, values = rollout_logprobs(ctx.model, ro, ctx.micro_batch_size, self.value_head)
        fit = explained_variance(self.baseline(values, ctx.mask), est.returns, ctx.mask)
        self.watch.see(step, est.metrics["critic/explained_variance"])
        return {
            "critic/explained_variance_fit": float(fit),
            "critic/warmup": float(not self.policy_learns(step)),
        }


class _Detached(torch.nn.Module):
    """The value head reading detached hidden states: its loss trains the head alone."""

    def __init__(self, head: torch.nn.Module):
        super().__init__()
        self.head = head

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(hidden.detach())


class CriticWatch:
    """Warns when PPO's critic is worse than a constant: its explained variance below 0 (below -`tol`: a
    critic that predicts a constant reads 0 give or take rounding) for `patience` steps in a row, once per
    such stretch; `patience` 0 = never."""

    def __init__(self, patience: int, tol: float = 1e-3):
        self.patience, self.tol, self.below = patience, tol, 0

    def see(self, step: int, explained_variance: float) -> bool:
        """Record one step's explained variance; True (with a warning) when the stretch reaches `patience`."""
        self.below = self.below + 1 if explained_variance < -self.tol else 0
        if self.patience <= 0 or self.below != self.patience:
            return False
        warnings.warn(
            f"step {step}: the critic's explained variance has been below 0 for {self.below} steps in a "
            "row: its values are worse than a constant, so the advantages are mostly its error "
            "(docs/recipes.md; try grpo.ppo.value_warmup_steps, value_lr_scale, value_hidden)",
            stacklevel=2,
        )
        return True


register_estimator("gae", Critic)
