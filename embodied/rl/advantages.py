"""Advantage estimators over groups of responses to the same prompt."""

from __future__ import annotations

import torch


def group_normalized_advantages(rewards: torch.Tensor, eps: float = 1e-6, scale: bool = True) -> torch.Tensor:
    """GRPO advantages: each reward minus its group's mean, divided by the group's std.

    DeepSeekMath (Shao et al. 2024), Sec. 4.1.2: A_i = (r_i - mean(r)) / std(r), the same value for
    every token of response i. `std` is the unbiased sample std (as TRL and verl compute it).

    Args:
        rewards: `(N, G)` rewards, N prompts with G responses each.
        scale: divide by the std (False gives Dr. GRPO's mean-only centring).

    Returns:
        `(N, G)` advantages. A group whose rewards are all equal gets exactly 0, never NaN.
    """
    if rewards.ndim != 2:
        raise ValueError(f"rewards must be (N, G), got {tuple(rewards.shape)}")
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if not scale:
        return centred
    std = rewards.std(dim=1, keepdim=True) if rewards.shape[1] > 1 else torch.zeros_like(centred)
    return centred / (std + eps)


def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """RLOO: each reward minus the mean of the *other* G-1 rewards of its group (Ahmadian et al. 2024, Eq. 4).

    Equals G / (G - 1) * (r_i - mean(r)). `(N, G)` -> `(N, G)`; needs G >= 2.
    """
    g = rewards.shape[1]
    if g < 2:
        raise ValueError("RLOO needs at least 2 responses per prompt")
    return (rewards * g - rewards.sum(dim=1, keepdim=True)) / (g - 1)


def batch_normalized_advantages(rewards: torch.Tensor, eps: float = 1e-6, all_sum=None) -> torch.Tensor:
    """REINFORCE++ with a group baseline (Hu et al. 2025): subtract each group's mean, then divide by the
    std of those centred rewards over the whole batch, so no single group's spread sets the scale.

    `all_sum` sums a tensor over processes when the batch is split across them (the std is then the
    whole batch's, from the sums of x and x^2)."""
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if all_sum is None:
        std = centred.flatten().std() if centred.numel() > 1 else torch.zeros(())
        return centred / (std + eps)
    x = centred.flatten().double()
    n, s1, s2 = all_sum(torch.stack([torch.tensor(float(x.numel()), dtype=x.dtype), x.sum(), (x * x).sum()]))
    var = (s2 - s1 * s1 / n) / (n - 1) if n > 1 else torch.zeros((), dtype=x.dtype)
    return centred / (var.clamp(min=0).sqrt().to(centred.dtype) + eps)


ESTIMATORS = ("grpo", "drgrpo", "rloo", "reinforce_pp")


def compute_advantages(rewards: torch.Tensor, estimator: str = "grpo", all_sum=None) -> torch.Tensor:
    """`(N, G)` rewards -> `(N, G)` advantages with one of `ESTIMATORS` (`all_sum`: see the batch one)."""
    if estimator == "grpo":
        return group_normalized_advantages(rewards)
    if estimator == "drgrpo":  # Dr. GRPO (Liu et al. 2025): no division by the group std
        return group_normalized_advantages(rewards, scale=False)
    if estimator == "rloo":
        return rloo_advantages(rewards)
    if estimator == "reinforce_pp":
        return batch_normalized_advantages(rewards, all_sum=all_sum)
    raise ValueError(f"unknown advantage estimator {estimator!r}; choose one of {ESTIMATORS}")
