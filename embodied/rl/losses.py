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


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ref_logprobs: torch.Tensor | None = None,
    clip_eps: float = 0.2,
    kl_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GRPO objective (DeepSeekMath, Shao et al. 2024, Eq. 3), negated for minimisation.

    Per token: -min(rho * A, clip(rho, 1 - eps, 1 + eps) * A) + beta * KL_k3, with the ratio
    rho = exp(logprobs - old_logprobs) against the policy that sampled the tokens. The per-token loss
    is averaged over each sequence's tokens, then over sequences (the paper's 1/G sum_i 1/|o_i| sum_t).

    Args:
        logprobs: `(B, T)` log-probs of the sampled tokens under the current policy (with grad).
        old_logprobs: `(B, T)` the same under the sampling policy (no grad).
        advantages: `(B,)` one advantage per sequence.
        mask: `(B, T)` 1 for completion tokens, 0 for padding.
        ref_logprobs: `(B, T)` under the frozen reference policy; required when `kl_coef > 0`.

    Returns:
        Scalar loss and detached metrics (`loss/policy`, `loss/kl`, `clip/fraction`).
    """
    ratio = torch.exp(logprobs - old_logprobs)
    adv = advantages.unsqueeze(1)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv
    per_token = -torch.minimum(unclipped, clipped)
    policy_loss = masked_mean(per_token, mask, dim=1).mean()
    kl = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    if kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs")
        kl = masked_mean(k3_kl(logprobs, ref_logprobs), mask, dim=1).mean()
    loss = policy_loss + kl_coef * kl
    clip_frac = masked_mean((clipped < unclipped).to(logprobs.dtype), mask)
    return loss, {
        "loss/policy": policy_loss.detach(),
        "loss/kl": kl.detach(),
        "clip/fraction": clip_frac.detach(),
    }
