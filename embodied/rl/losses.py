"""Policy-gradient losses as pure tensor functions.

Shapes: B sequences, T completion tokens. `mask` is 1 on real completion tokens and 0 on padding.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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
    per_token: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    norm: float | None = None,
    num_seqs: int | None = None,
    num_tokens: int | None = None,
) -> torch.Tensor:
    """Reduce a `(B, T)` per-token loss to a scalar.

    - `seq-mean-token-mean` (GRPO, DeepSeekMath Eq. 3): mean over each sequence's tokens, then over sequences.
    - `token-mean` (DAPO, Yu et al. 2025, token-level loss): mean over all tokens, so long answers weigh more.
    - `seq-sum-norm` (Dr. GRPO, Liu et al. 2025, Sec. 3.1): each sequence's token sum divided by the constant
      `norm` (e.g. the generation budget), then mean over sequences: no length bias.

    When the batch is one micro-batch of a larger one, pass the whole batch's `num_seqs` and `num_tokens`:
    every mode is then a sum over this micro-batch divided by whole-batch constants, so the micro-batch
    losses (and gradients) add up exactly to those of the whole batch.
    """
    m = mask.to(per_token.dtype)
    seqs = per_token.shape[0] if num_seqs is None else num_seqs
    if mode == "seq-mean-token-mean":
        return ((per_token * m).sum(1) / m.sum(1).clamp(min=1)).sum() / seqs
    if mode == "token-mean":
        tokens = m.sum().clamp(min=1) if num_tokens is None else max(num_tokens, 1)
        return (per_token * m).sum() / tokens
    if mode == "seq-sum-norm":
        if not norm or norm <= 0:
            raise ValueError("seq-sum-norm needs a positive constant `norm` (e.g. max_new_tokens)")
        return (per_token * m).sum() / (norm * seqs)
    raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {LOSS_AGGREGATIONS}")


RATIO_LEVELS = ("token", "sequence")
COV_MODES = ("none", "clip_cov", "kl_cov")


def log_ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor, level: str = "token"
) -> torch.Tensor:
    """`(B, T)` log importance ratio log pi/pi_old, per token (PPO, GRPO) or per sequence.

    `sequence`: the length-normalised sequence ratio of GSPO (Zheng et al. 2025, Eq. 7),
    (1/|o|) sum_t (log pi - log pi_old), broadcast to every token of the sequence (gradient flows to all).
    """
    d = logprobs - old_logprobs
    if level == "token":
        return d
    if level == "sequence":
        return masked_mean(d, mask, dim=1).unsqueeze(1).expand_as(d)
    raise ValueError(f"unknown ratio level {level!r}; choose one of {RATIO_LEVELS}")


def token_advantages(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`(B, T)` advantages: one per sequence `(B,)` repeated over its tokens, or per-token ones `(B, T)`
    (PPO's GAE, `rl.ppo.gae`) as they are."""
    if advantages.ndim == 1 and advantages.shape[0] == like.shape[0]:
        return advantages.unsqueeze(1).expand_as(like)
    if advantages.shape == like.shape:
        return advantages
    raise ValueError(
        f"advantages must be (B,) or (B, T) = {tuple(like.shape)}, got {tuple(advantages.shape)}"
    )


def token_covariance(logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`(B, T)` centred products (A_t - mean A)(log pi_t - mean log pi) over the batch's real tokens.

    Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs", Eq. 11: tokens whose log-prob and
    advantage co-vary most drive entropy collapse. `advantages` is `(B,)` (one per sequence) or `(B, T)`.
    Means run over masked tokens; detached (selection only).
    """
    adv = token_advantages(advantages, logprobs).detach()
    lp = logprobs.detach()
    return (adv - masked_mean(adv, mask)) * (lp - masked_mean(lp, mask))


def clip_cov_select(
    cov: torch.Tensor,
    mask: torch.Tensor,
    exclude: torch.Tensor,
    ratio: float,
    low: float,
    high: float,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Clip-Cov's token choice (Cui et al. 2025, Sec. 4, Eq. 12): `(B, T)` bool.

    Among real tokens not in `exclude` (already clipped) with low < cov < high, pick max(1, int(ratio * N))
    uniformly at random (N = real tokens); their gradient is then detached.
    """
    eligible = (cov > low) & (cov < high) & mask.bool() & ~exclude
    idx = eligible.flatten().nonzero().squeeze(1)
    k = min(max(1, int(ratio * int(mask.sum()))), idx.numel())
    pick = idx[torch.randperm(idx.numel(), generator=generator, device="cpu")[:k].to(idx.device)]
    out = torch.zeros(cov.numel(), dtype=torch.bool, device=cov.device)
    out[pick] = True
    return out.view_as(cov)


def kl_cov_select(cov: torch.Tensor, mask: torch.Tensor, ratio: float) -> torch.Tensor:
    """KL-Cov's token choice (Cui et al. 2025, Sec. 4, Eq. 13): `(B, T)` bool, the top max(1, int(ratio * N))
    real tokens by covariance."""
    n = int(mask.sum())
    k = min(max(1, int(ratio * n)), n)
    scores = cov.masked_fill(~mask.bool(), float("-inf")).flatten()
    out = torch.zeros_like(scores, dtype=torch.bool)
    out[scores.topk(k).indices] = True
    return out.view_as(cov)


IS_CORRECTIONS = ("off", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
IS_LOG_BOUND = 20.0
"""|log r| is clamped here before the exp (verl's SAFETY_BOUND): no inf in the statistics, and a cap below
exp(20) = 4.9e8 or a floor above exp(-20) acts on the clamped ratio as on the exact one."""


def engine_is_weights(
    old_logprobs: torch.Tensor,
    engine_logprobs: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    cap: float = 3.0,
    floor: float = 0.0,
    num_seqs: int | None = None,
    num_tokens: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`(B, T)` detached weights correcting a rollout engine's sampler/trainer mismatch, and their statistics.

    The engine (vLLM) samples from pi_engine, not quite the trainer's pi_old at the same weights (kernels,
    bf16), so the policy-gradient term of each token is multiplied by an importance weight built from
    r = pi_old / pi_engine (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL
    training"; TRL's `vllm_importance_sampling_correction`, verl's `algorithm.rollout_correction`):

    - `token_*`: per token, r_t = exp(logp_old_t - logp_engine_t);
    - `sequence_*`: per sequence, r = exp(sum_t (logp_old_t - logp_engine_t)) over its `mask` tokens (the
      product of the token ratios, as TRL and verl: a sum, not GSPO's length-normalised mean), broadcast to
      every token of the sequence;
    - `*_truncate` (TIS): w = min(r, cap), from above only (Yao et al., verl's truncate);
    - `*_mask` (MIS, TRL's `sequence_mask`, OpenRLHF's icepop / seq-mask): w = r if floor <= r <= cap, else 0.
      A masked token stays in the loss's denominator with weight 0, as in TRL.

    The weight carries no gradient and is 0 past `mask`. Statistics are over the loss's tokens (`token_*`)
    or its rows (`sequence_*`; a row without tokens has ratio exactly 1, as in TRL), divided by whole-batch
    `num_tokens` / `num_seqs` when given, so that micro-batch means add up to the batch's (as `aggregate`):
    `rollout/is_ratio_mean` and `rollout/is_ratio_max` of r (before the cap), `rollout/is_weight_mean` of w,
    and `rollout/is_truncated_frac` (r > cap) or `rollout/is_masked_frac` (r outside [floor, cap]).
    """
    if mode not in IS_CORRECTIONS[1:]:
        raise ValueError(f"unknown IS correction {mode!r}; choose one of {IS_CORRECTIONS[1:]}")
    level, bound = mode.split("_")
    m = mask.bool()
    gap = torch.where(m, old_logprobs.detach() - engine_logprobs, 0.0)  # past the mask: 0, even from -inf
    gap = gap.to(torch.promote_types(gap.dtype, torch.float32))  # bf16 log-probs: the ratio in fp32
    if level == "sequence":
        gap = gap.sum(1, keepdim=True)
    ratio = torch.exp(gap.clamp(-IS_LOG_BOUND, IS_LOG_BOUND))
    if bound == "truncate":
        acted = ratio > cap
        weight = ratio.clamp(max=cap)
    else:
        acted = (ratio < floor) | (ratio > cap)
        weight = ratio.masked_fill(acted, 0.0)
    if level == "token":
        units, count = m, m.sum() if num_tokens is None else num_tokens
    else:
        units = torch.ones_like(ratio, dtype=torch.bool)
        count = ratio.shape[0] if num_seqs is None else num_seqs
    count = max(float(count), 1.0)
    r, acted_name = ratio[units], "truncated" if bound == "truncate" else "masked"
    stats = {
        "rollout/is_ratio_mean": r.sum() / count,
        "rollout/is_ratio_max": r.max() if r.numel() else torch.ones(()),
        "rollout/is_weight_mean": weight[units].sum() / count,
        f"rollout/is_{acted_name}_frac": acted[units].to(ratio.dtype).sum() / count,
    }
    return torch.where(m, weight.expand_as(m), 0.0), stats


@dataclass(frozen=True)
class LossSpec:
    """The switches of `grpo_loss`: one value per recipe choice, fixed for a run (`GRPOConfig` fields of the
    same names; `kl_kind` is `grpo.kl_estimator`, `agg` is `grpo.loss_agg`, `agg_norm` its normaliser)."""

    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    dual_clip: float | None = None
    kl_coef: float = 0.0
    kl_kind: str = "k3"
    agg: str = "seq-mean-token-mean"
    agg_norm: float | None = None
    ratio_level: str = "token"
    entropy_coef: float = 0.0
    cov_mode: str = "none"
    cov_ratio: float = 2e-4
    clip_cov_bounds: tuple[float, float] = (1.0, 5.0)
    kl_cov_coef: float = 1.0


def _cov_control(per_token, unclipped, is_clipped, logprobs, old_logprobs, advantages, mask, s, generator):
    """Clip-Cov / KL-Cov (Cui et al. 2025) on the per-token loss: `(per_token, selected, is_clipped)`."""
    cov = token_covariance(logprobs, advantages, mask)
    if s.cov_mode == "clip_cov":
        lo, hi = s.clip_cov_bounds
        selected = clip_cov_select(cov, mask, is_clipped, s.cov_ratio, lo, hi, generator)
        return per_token.masked_fill(selected, 0.0), selected, is_clipped
    if s.cov_mode == "kl_cov":
        selected = kl_cov_select(cov, mask, s.cov_ratio)
        penalty = s.kl_cov_coef * (logprobs - old_logprobs).abs()
        return torch.where(selected, -unclipped + penalty, -unclipped), selected, torch.zeros_like(is_clipped)
    raise ValueError(f"unknown cov_mode {s.cov_mode!r}; choose one of {COV_MODES}")


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ref_logprobs: torch.Tensor | None = None,
    spec: LossSpec = LossSpec(),
    entropy: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    num_seqs: int | None = None,
    num_tokens: int | None = None,
    is_weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped policy-gradient objective of GRPO (DeepSeekMath, Shao et al. 2024, Eq. 3), negated.

    Per token: -min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A) + beta * KL, with the ratio
    rho = exp(logprobs - old_logprobs) against the policy that sampled the tokens (per token, or GSPO's
    per-sequence ratio with `ratio_level="sequence"`). The switches are `spec`'s (a `LossSpec`).
    `clip_eps_high` (default: `clip_eps`) gives DAPO's
    clip-higher (Yu et al. 2025: 0.2 / 0.28). `dual_clip` = c > 1 caps the loss of negative-advantage tokens
    at -c * A (dual-clip PPO, Ye et al. 2020). The per-token loss is reduced by
    `aggregate(..., agg, agg_norm)`; the default is the paper's 1/G sum_i 1/|o_i| sum_t.

    Entropy controls (Cui et al. 2025): `cov_mode="clip_cov"` detaches the gradient of a few random tokens
    whose covariance lies in `clip_cov_bounds`; `"kl_cov"` drops the clip and adds `kl_cov_coef * |log rho|`
    on the top `cov_ratio` tokens by covariance. `entropy_coef` > 0 subtracts coef * H (an entropy bonus);
    `entropy` `(B, T)` must then carry gradient.

    Args:
        logprobs: `(B, T)` log-probs of the sampled tokens under the current policy (with grad).
        old_logprobs: `(B, T)` the same under the sampling policy (no grad).
        advantages: `(B,)` one advantage per sequence (GRPO), or `(B, T)` one per token (PPO's GAE).
        mask: `(B, T)` 1 for completion tokens, 0 for padding (and for masked-out truncated samples).
        ref_logprobs: `(B, T)` under the frozen reference policy; required when `kl_coef > 0`.
        num_seqs, num_tokens: whole-batch sizes when this is one micro-batch (see `aggregate`).
        is_weight: `(B, T)` `engine_is_weights`, on the policy-gradient term only (not KL nor entropy).

    Returns:
        Scalar loss and detached metrics (`loss/policy`, `loss/kl`, `loss/entropy`, `clip/fraction`,
        `clip/cov_fraction`).
    """
    s = spec
    clip_eps, kl_coef, agg, agg_norm = s.clip_eps, s.kl_coef, s.agg, s.agg_norm
    eps_high = clip_eps if s.clip_eps_high is None else s.clip_eps_high
    dual_clip, cov_mode = s.dual_clip, s.cov_mode
    ratio = torch.exp(log_ratio(logprobs, old_logprobs, mask, s.ratio_level))
    adv = token_advantages(advantages, logprobs)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + eps_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    is_clipped = (clipped < unclipped) & mask.bool()
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        per_token = torch.where(adv < 0, torch.minimum(per_token, -dual_clip * adv), per_token)
    selected = torch.zeros_like(mask, dtype=torch.bool)
    if cov_mode != "none":
        per_token, selected, is_clipped = _cov_control(
            per_token, unclipped, is_clipped, logprobs, old_logprobs, advantages, mask, s, generator
        )
    if is_weight is not None:  # the sampler/trainer correction (TRL: per_token_loss * importance ratio)
        per_token = per_token * is_weight.detach()
    sizes = {"num_seqs": num_seqs, "num_tokens": num_tokens}
    policy_loss = aggregate(per_token, mask, agg, agg_norm, **sizes)
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    kl, ent = zero, zero
    if kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs")
        kl = aggregate(kl_estimate(logprobs, ref_logprobs, s.kl_kind), mask, agg, agg_norm, **sizes)
    if entropy is not None:
        ent = aggregate(entropy, mask, agg, agg_norm, **sizes)
    loss = policy_loss + kl_coef * kl - s.entropy_coef * ent
    return loss, {
        "loss/policy": policy_loss.detach(),
        "loss/kl": kl.detach(),
        "loss/entropy": ent.detach(),
        "clip/fraction": masked_mean(is_clipped.to(logprobs.dtype), mask).detach(),
        "clip/cov_fraction": masked_mean(selected.to(logprobs.dtype), mask).detach(),
    }


def perception_loss(
    logprobs: torch.Tensor,
    masked_logprobs: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 0.01,
    entropy: torch.Tensor | None = None,
    masked_entropy: torch.Tensor | None = None,
    eta: tuple[float, float] = (0.03, 0.03),
    agg: str = "seq-mean-token-mean",
    agg_norm: float | None = None,
    num_seqs: int | None = None,
    num_tokens: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PAPO's extra terms (Wang et al. 2025, "Perception-Aware Policy Optimization", Eqs. 5-7 and 10).

    Implicit perception loss: KL_prcp = KL(pi(o | q, V) || pi(o | q, V_masked)), estimated per rollout token
    with the k3 estimator (d = log pi_masked - log pi), is *maximised*: the loss adds -gamma * KL_prcp. The
    double entropy regulariser adds eta1 * H[pi(.|V)] + eta2 * H[pi(.|V_masked)], keeping both distributions
    sharp so the divergence cannot be inflated by making the masked branch uniform ("KL hacking", Sec. 4).

    Args:
        logprobs, masked_logprobs: `(B, T)` log-probs of the rollout tokens given the real and the masked
            visual input. Pass `masked_logprobs` detached for PAPO's default (no gradient through the masked
            branch), or with grad to push both branches.
        entropy, masked_entropy: `(B, T)` entropies of the two branches (or None to skip the regulariser).

    Returns:
        The scalar to add to the GRPO loss, and detached metrics (`loss/perception` is KL_prcp itself).
    """
    sizes = {"num_seqs": num_seqs, "num_tokens": num_tokens}
    kl = aggregate(k3_kl(logprobs, masked_logprobs), mask, agg, agg_norm, **sizes)
    loss = -gamma * kl
    metrics = {"loss/perception": kl.detach()}
    for coef, h, name in ((eta[0], entropy, "entropy/real"), (eta[1], masked_entropy, "entropy/masked")):
        if h is not None:
            h_agg = aggregate(h, mask, agg, agg_norm, **sizes)
            loss = loss + coef * h_agg
            metrics[name] = h_agg.detach()
    return loss, metrics


@dataclass
class LossInputs:
    """What a registered loss term sees of one micro-batch (B rows, T completion tokens): the current
    policy's log-probs `(B, T)` (with grad), the sampling policy's and the KL reference's (None without
    KL), the advantages (`(B,)` or `(B, T)`), the loss's tokens `mask`, the tokens' entropies `(B, T)`, and
    how GRPO reduces a per-token loss (`mean`: the run's `grpo.loss_agg` over the whole rollout's sizes,
    so micro-batch terms add up to the rollout's)."""

    logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor | None
    advantages: torch.Tensor
    mask: torch.Tensor
    entropy: torch.Tensor
    agg: str = "seq-mean-token-mean"
    agg_norm: float | None = None
    num_seqs: int | None = None
    num_tokens: int | None = None

    def mean(self, per_token: torch.Tensor) -> torch.Tensor:
        """A `(B, T)` per-token loss reduced as the policy loss is."""
        sizes = {"num_seqs": self.num_seqs, "num_tokens": self.num_tokens}
        return aggregate(per_token, self.mask, self.agg, self.agg_norm, **sizes)


LOSSES: dict[str, Callable[[LossInputs], torch.Tensor]] = {}
"""Extra loss terms by name (`grpo.loss_terms: {name: weight}` adds weight * term to GRPO's loss)."""


def register_loss(name: str, fn: Callable[[LossInputs], torch.Tensor] | None = None):
    """Register `fn(inputs: LossInputs) -> scalar tensor` as the loss term `name`; usable as a decorator.
    It is logged as `loss/<name>` and added as `grpo.loss_terms[name] * term`."""

    def add(f: Callable[[LossInputs], torch.Tensor]):
        if name in LOSSES:
            raise ValueError(f"a loss term named {name!r} is already registered")
        LOSSES[name] = f
        return f

    return add(fn) if fn is not None else add


def unregister_loss(name: str) -> None:
    LOSSES.pop(name, None)
