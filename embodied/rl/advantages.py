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
