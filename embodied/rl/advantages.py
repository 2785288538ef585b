"""Advantage estimators: how a rollout's rewards become the advantages the policy loss weighs tokens by.

Two kinds plug into GRPO's update through one interface, `Estimator` (`grpo.advantage` names one):

- the group baselines (`GroupBaseline`): pure functions of the `(N, G)` rewards of N prompts' groups of G
  answers (GRPO's mean/std, Dr. GRPO's mean, RLOO's leave-one-out, REINFORCE++'s batch std), below;
- PPO's critic (`embodied.rl.critic`, `gae`): a value head trained beside the policy, GAE against its values.

A new estimator is a class with an `estimate` method, registered by name (docs/training.md, "A new advantage
estimator or loss"):

    class Median(Estimator):
        def estimate(self, ro, ctx):
            r = ro.rewards  # (N, G)
            return Estimate(ctx.per_row(r - r.median(1, keepdim=True).values))

    register_estimator("median", lambda cfg, model: Median())   # then grpo.advantage=median
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

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


GROUP_ESTIMATORS = ("grpo", "drgrpo", "rloo", "reinforce_pp")


def compute_advantages(rewards: torch.Tensor, estimator: str = "grpo", all_sum=None) -> torch.Tensor:
    """`(N, G)` rewards -> `(N, G)` advantages with one of `GROUP_ESTIMATORS` (`all_sum`: see the batch
    one)."""
    if estimator == "grpo":
        return group_normalized_advantages(rewards)
    if estimator == "drgrpo":  # Dr. GRPO (Liu et al. 2025): no division by the group std
        return group_normalized_advantages(rewards, scale=False)
    if estimator == "rloo":
        return rloo_advantages(rewards)
    if estimator == "reinforce_pp":
        return batch_normalized_advantages(rewards, all_sum=all_sum)
    raise ValueError(f"unknown advantage estimator {estimator!r}; choose one of {GROUP_ESTIMATORS}")


@dataclass
class Context:
    """What an estimator may use besides the rollout: the policy, the KL reference (None without KL), the
    tokens the loss sees (`mask`, `(B, T)`), the micro-batch size of no-grad passes, how to sum over
    processes (None: one process) and `owner`, `(B,)` the trajectory of each row, as `Rollout.owner` names it
    (every turn of a multi-turn trajectory shares its advantage; None for single-turn rollouts, whose rows
    are their own trajectories)."""

    model: torch.nn.Module
    ref: object | None
    mask: torch.Tensor
    micro_batch_size: int = 0
    all_sum: Callable[[torch.Tensor], torch.Tensor] | None = None
    owner: torch.Tensor | None = None

    def per_row(self, advantages: torch.Tensor) -> torch.Tensor:
        """`(N, G)` advantages of the trajectories -> `(B,)` one per row of the rollout."""
        flat = advantages.flatten()
        return flat if self.owner is None else flat[self.owner]


@dataclass
class Estimate:
    """One rollout's advantages: `(B,)` one per row, or `(B, T)` one per token; optionally the sampling
    policy's log-probs `(B, T)` when the estimator computed them anyway (None: the update computes them when
    it needs them), and metrics to log."""

    advantages: torch.Tensor
    old_logp: torch.Tensor | None = None
    metrics: dict = field(default_factory=dict)


class Estimator:
    """An advantage estimator. `estimate` is the one method to write; the rest are the hooks of an
    estimator that trains a module of its own beside the policy (PPO's critic), with the defaults of one that
    trains nothing."""

    modules: dict[str, torch.nn.Module] = {}
    every_step: tuple[str, ...] = ()
    """Metric prefixes logged at every step, not only every `log_every` (a critic's: whether it learns)."""
    """Modules trained beside the policy (stepped by its optimizer, saved in every checkpoint as
    `<name>.safetensors`)."""

    def estimate(self, ro, ctx: Context) -> Estimate:
        """The advantages of rollout `ro` (an `embodied.rl.rollout.Rollout`)."""
        raise NotImplementedError

    def param_groups(self, lr: float) -> list[dict]:
        """Optimizer groups of `modules` at the policy's learning rate `lr`."""
        return []

    def head(self, policy_learns: bool) -> torch.nn.Module | None:
        """A module the policy's forward pass feeds its last hidden states to (values per token), or None."""
        return None

    def loss(
        self, values: torch.Tensor | None, idx: list[int], est: Estimate
    ) -> tuple[torch.Tensor, dict] | None:
        """The estimator's own loss term on micro-batch rows `idx` (`values` from `head`), added to the policy
        loss; None when it has none."""
        return None

    def policy_learns(self, step: int) -> bool:
        """False while the policy waits for the estimator (a critic's warm-up): only `modules` are stepped."""
        return True

    def after_update(self, ro, ctx: Context, est: Estimate, step: int) -> dict:
        """Metrics after the rollout's updates (e.g. how well a critic now fits it)."""
        return {}


class GroupBaseline(Estimator):
    """Advantages from each prompt's group of G answers alone: `fn((N, G) rewards, all_sum) -> (N, G)`."""

    def __init__(self, fn: Callable[[torch.Tensor, Callable | None], torch.Tensor]):
        self.fn = fn

    def estimate(self, ro, ctx: Context) -> Estimate:
        return Estimate(ctx.per_row(self.fn(ro.rewards, ctx.all_sum)))


ESTIMATORS: dict[str, Callable] = {
    name: (lambda cfg, model, name=name: GroupBaseline(lambda r, s: compute_advantages(r, name, s)))
    for name in GROUP_ESTIMATORS
}
"""`grpo.advantage` names -> `make(grpo_config, model) -> Estimator` (`gae` is `embodied.rl.critic`'s)."""


def register_estimator(name: str, make: Callable) -> None:
    """Make `grpo.advantage=name` build `make(grpo_config, model)`, an `Estimator`."""
    if name in ESTIMATORS:
        raise ValueError(f"an advantage estimator named {name!r} is already registered")
    ESTIMATORS[name] = make


def unregister_estimator(name: str) -> None:
    ESTIMATORS.pop(name, None)
