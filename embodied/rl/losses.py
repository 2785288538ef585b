"""Policy-gradient losses as pure tensor functions.

Shapes: B sequences, T completion tokens. `mask` is 1 on real completion tokens and 0 on padding.
"""

from __future__ import annotations

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `x` over positions where `mask` is 1 (all positions, or along `dim`)."""
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref): exp(d) - d - 1 with d = log pi_ref - log pi.

    Schulman, "Approximating KL Divergence" (2020); used by GRPO, DeepSeekMath Eq. 4. Unbiased for
    samples from pi, always >= 0. Shapes `(B, T)` -> `(B, T)`.
    """
    d = ref_logprobs - logprobs
    return torch.exp(d) - d - 1.0


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman 2020), shapes `(B, T)`.

    k1 = log pi - log pi_ref (unbiased, can be negative); k2 = (log pi - log pi_ref)^2 / 2 (biased, >= 0);
    k3 = exp(d) - d - 1 with d = log pi_ref - log pi (unbiased, >= 0; GRPO's choice).
    """
    if kind == "k1":
        return logprobs - ref_logprobs
    if kind == "k2":
        return 0.5 * (logprobs - ref_logprobs) ** 2
    if kind == "k3":
        return k3_kl(logprobs, ref_logprobs)
    raise ValueError(f"unknown KL estimator {kind!r}; choose k1, k2 or k3")


LOSS_AGGREGATIONS = ("seq-mean-token-mean", "token-mean", "seq-sum-norm")


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, mode: str, norm: float | None = None
) -> torch.Tensor:
    """Reduce a `(B, T)` per-token loss to a scalar.

    - `seq-mean-token-mean` (GRPO, DeepSeekMath Eq. 3): mean over each sequence's tokens, then over sequences.
    - `token-mean` (DAPO, Yu et al. 2025, token-level loss): mean over all tokens, so long answers weigh more.
    - `seq-sum-norm` (Dr. GRPO, Liu et al. 2025, Sec. 3.1): each sequence's token sum divided by the constant
      `norm` (e.g. the generation budget), then mean over sequences: no length bias.
    """
    if mode == "seq-mean-token-mean":
        return masked_mean(per_token, mask, dim=1).mean()
    if mode == "token-mean":
        return masked_mean(per_token, mask)
    if mode == "seq-sum-norm":
        if not norm or norm <= 0:
            raise ValueError("seq-sum-norm needs a positive constant `norm` (e.g. max_new_tokens)")
        return ((per_token * mask.to(per_token.dtype)).sum(1) / norm).mean()
    raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {LOSS_AGGREGATIONS}")


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ref_logprobs: torch.Tensor | None = None,
    clip_eps: float = 0.2,
    kl_coef: float = 0.0,
    clip_eps_high: float | None = None,
    dual_clip: float | None = None,
    kl_kind: str = "k3",
    agg: str = "seq-mean-token-mean",
    agg_norm: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped policy-gradient objective of GRPO (DeepSeekMath, Shao et al. 2024, Eq. 3), negated.

    Per token: -min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A) + beta * KL, with the ratio
    rho = exp(logprobs - old_logprobs) against the policy that sampled the tokens. `clip_eps_high` (default:
    `clip_eps`) gives DAPO's clip-higher (Yu et al. 2025: 0.2 / 0.28). `dual_clip` = c > 1 caps the loss
    of negative-advantage tokens at -c * A (dual-clip PPO, Ye et al. 2020). The per-token loss is reduced by
    `aggregate(..., agg, agg_norm)`; the default is the paper's 1/G sum_i 1/|o_i| sum_t.

    Args:
        logprobs: `(B, T)` log-probs of the sampled tokens under the current policy (with grad).
        old_logprobs: `(B, T)` the same under the sampling policy (no grad).
        advantages: `(B,)` one advantage per sequence.
        mask: `(B, T)` 1 for completion tokens, 0 for padding.
        ref_logprobs: `(B, T)` under the frozen reference policy; required when `kl_coef > 0`.

    Returns:
        Scalar loss and detached metrics (`loss/policy`, `loss/kl`, `clip/fraction`).
    """
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    ratio = torch.exp(logprobs - old_logprobs)
    adv = advantages.unsqueeze(1)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + eps_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        per_token = torch.where(adv < 0, torch.minimum(per_token, -dual_clip * adv), per_token)
    policy_loss = aggregate(per_token, mask, agg, agg_norm)
    kl = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    if kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs")
        kl = aggregate(kl_estimate(logprobs, ref_logprobs, kl_kind), mask, agg, agg_norm)
    loss = policy_loss + kl_coef * kl
    clip_frac = masked_mean((clipped < unclipped).to(logprobs.dtype), mask)
    return loss, {
        "loss/policy": policy_loss.detach(),
        "loss/kl": kl.detach(),
        "clip/fraction": clip_frac.detach(),
    }
