"""PPO with a learned critic: per-token rewards, GAE, whitening, the clipped value loss, a value head.

The baseline GRPO was designed to replace (Shao et al. 2024, Sec. 4.1). Shapes: B sequences, T completion
tokens, right-padded; `mask` is 1 on real completion tokens and 0 on padding. Token t is the action taken
in state s_t = (prompt, completion[:t]); `values[:, t]` is V(s_t), the critic's estimate *before* emitting
token t, and the episode ends with the completion's last real token (the value after it is 0).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from embodied.rl.losses import masked_mean


def _check(mask: torch.Tensor, right_padded: bool = False, **tensors: torch.Tensor) -> None:
    """Raise a ValueError unless `mask` is `(B, T)` and every tensor has its shape (and, optionally, the mask
    is right-padded: no real token after a padding one)."""
    if mask.ndim != 2:
        raise ValueError(f"mask must be (B, T), got {tuple(mask.shape)}")
    for name, x in tensors.items():
        if x.shape != mask.shape:
            raise ValueError(f"{name} must have the mask's shape {tuple(mask.shape)}, got {tuple(x.shape)}")
    m = mask.bool()
    if right_padded and (m[:, 1:] & ~m[:, :-1]).any():
        raise ValueError("mask must be right-padded: no completion token may follow a padding one")


def token_rewards(
    rewards: torch.Tensor, mask: torch.Tensor, kl: torch.Tensor | None = None, kl_coef: float = 0.0
) -> torch.Tensor:
    """`(B, T)` per-token rewards: each sequence-level reward `(B,)` on its completion's last real token.

    With `kl` `(B, T)` (a per-token estimate of KL(pi || pi_ref), e.g. `losses.kl_estimate(..., "k1")`),
    `- kl_coef * kl` is added on every real token: InstructGPT (Ouyang et al. 2022, Eq. 2) and TRL's PPO,
    R(x, y) = r(x, y) - beta * log(pi(y|x) / pi_ref(y|x)), spread over tokens with r on the final one.
    Padding gets 0. A row with no real token (a masked-out sample) gets no reward. Detached: a reward
    carries no gradient.
    """
    _check(mask, right_padded=True)
    if rewards.shape != mask.shape[:1]:
        raise ValueError(f"rewards must be (B,) = {tuple(mask.shape[:1])}, got {tuple(rewards.shape)}")
    m = mask.bool()
    lengths = m.sum(1)
    out = torch.zeros(mask.shape, dtype=rewards.dtype, device=rewards.device)
    rows = (lengths > 0).nonzero().squeeze(1)
    out[rows, lengths[rows] - 1] = rewards.detach()[rows]
    if kl is not None:
        _check(mask, kl=kl)
        out = out - kl_coef * kl.detach().to(out.dtype) * m
    elif kl_coef != 0:
        raise ValueError("kl_coef != 0 needs the per-token kl")
    return out


@torch.no_grad()
def gae(
    token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation (Schulman et al. 2016, "High-Dimensional Continuous Control Using
    GAE", Sec. 3, Eq. 16), backwards over completion tokens: `(advantages, returns)`, both `(B, T)`, float32.

        delta_t = r_t + gamma * V_{t+1} - V_t,      A_t = delta_t + gamma * lam * A_{t+1},

    with V_{t+1} = 0 and A_{t+1} = 0 after each sequence's own last real token (the episode ends there).
    returns = A + V, the lambda-return the critic regresses onto. lam = 0 gives one-step TD errors; lam = 1
    gives discounted Monte-Carlo returns minus V (Eqs. 17-18). Padding gets 0 advantage and 0 return,
    whatever its rewards and values hold. No gradient flows through it.
    """
    _check(mask, right_padded=True, token_rewards=token_rewards, values=values)
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"gamma and lam must lie in [0, 1], got gamma={gamma}, lam={lam}")
    m = mask.float()
    # zero rewards and values on padding: then, as the mask is right-padded, V_{t+1} = 0 after each last real
    # token, every padding delta is 0, and so is every padding A (the recursion restarts at each last token)
    r, v = token_rewards.float() * m, values.float() * m
    next_v = torch.cat([v[:, 1:], torch.zeros_like(v[:, :1])], dim=1)
    delta = r + gamma * next_v - v
    adv = torch.zeros_like(v)
    running = torch.zeros_like(v[:, 0])
    for t in reversed(range(v.shape[1])):
        running = delta[:, t] + gamma * lam * running
        adv[:, t] = running
    return adv, adv + v


def sequence_values(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`(B, T)`: each row's first value, V(s_0) (the value of the prompt alone, before any completion
    token), on every real token of the row; 0 on padding. Used as the baseline of every token, it is a learned
    per-question baseline: with gamma = lam = 1, GAE then gives A_t = G_t - V(s_0), the return-to-go minus a
    function of the prompt alone, an unbiased policy gradient (Sutton & Barto 2018, Sec. 13.4: any baseline
    that does not depend on the action), with the same baseline on every token of an answer."""
    _check(mask, right_padded=True, values=values)
    return values[:, :1].expand_as(values) * mask.to(values.dtype)


def first_tokens(mask: torch.Tensor) -> torch.Tensor:
    """`(B, T)` 1 on the first real token of each row (a row with none gets none): where a per-sequence value
    V(s_0) is read and trained."""
    _check(mask, right_padded=True)
    out = torch.zeros_like(mask)
    out[:, 0] = mask[:, 0]
    return out


def whiten(
    x: torch.Tensor,
    mask: torch.Tensor,
    eps: float = 1e-8,
    all_sum: Callable | None = None,
    scale: bool = True,
) -> torch.Tensor:
    """Masked whitening of advantages, as PPO implementations do (e.g. OpenAI baselines, TRL, OpenRLHF):
    (x - mean) / (std + eps) with mean and std over the real tokens only; padding is set to 0.

    The std is the population one (divide by N, not N - 1), so the result has masked mean 0 and masked
    mean square 1. `all_sum` sums a tensor over processes when the batch is split across them (as in
    `advantages.batch_normalized_advantages`): the statistics are then the whole batch's.

    `scale=False` centres only: x - mean, in the advantages' own units. The division is what turns a
    critic's error into unit-size advantages when the rewards barely vary (nearly every answer right); the
    centring is what removes the critic's error common to the whole batch (a value level that lags the
    batch's return), which would otherwise push every sampled token the same way. Dropping the division
    and keeping the centring is Dr. GRPO's change to GRPO's group normalisation (Liu et al. 2025,
    "Understanding R1-Zero-Like Training"), applied to the batch.
    """
    _check(mask, x=x)
    m = mask.to(x.dtype)
    xd, md = x.double(), m.double()
    stats = torch.stack([md.sum(), (xd * md).sum(), (xd * xd * md).sum()])
    if all_sum is not None:
        stats = all_sum(stats)
    n, s1, s2 = stats.unbind()
    mean = s1 / n.clamp(min=1)
    var = (s2 / n.clamp(min=1) - mean * mean).clamp(min=0)
    if not scale:
        return (x - mean.to(x.dtype)) * m
    return (x - mean.to(x.dtype)) / (var.sqrt().to(x.dtype) + eps) * m


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
    num_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped value loss (Schulman et al. 2017, Eq. 9's L^VF, with the clipping of the OpenAI
    baselines ppo2 implementation, also used by TRL and OpenRLHF), per token:

        0.5 * max((V - R)^2, (clip(V, V_old - eps, V_old + eps) - R)^2),

    averaged over real tokens (`num_tokens`: the whole batch's count when this is one micro-batch, so the
    micro-batch losses add up to the batch's). `clip <= 0` means no clipping: 0.5 * masked MSE.

    Returns the scalar loss and the (detached) clip fraction: the share of real tokens whose clipped term is
    strictly the larger one (where the clip binds and the token's gradient is zero). Padding is ignored,
    even if it holds inf or NaN.
    """
    _check(mask, values=values, old_values=old_values, returns=returns)
    returns, old_values = returns.detach(), old_values.detach()
    unclipped = (values - returns) ** 2
    is_clipped = torch.zeros_like(mask, dtype=torch.bool)
    per_token = unclipped
    if clip > 0:
        clipped = (torch.clamp(values, old_values - clip, old_values + clip) - returns) ** 2
        per_token = torch.maximum(unclipped, clipped)
        is_clipped = (clipped > unclipped) & mask.bool()
    per_token = (0.5 * per_token).masked_fill(~mask.bool(), 0.0)
    loss = masked_mean(per_token, mask) if num_tokens is None else per_token.sum() / max(num_tokens, 1)
    return loss, masked_mean(is_clipped.to(per_token.dtype), mask).detach()


def gae_advantages(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    all_sum: Callable | None = None,
    whitened: bool = True,
    value_lam: float | None = None,
    scaled: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's advantages for one rollout: `(whitened advantages, returns)`, both `(B, T)` float32.

    The sequence rewards `(B,)` go on each completion's last real token, with `- kl_coef * kl` on every
    token (`token_rewards`); GAE(gamma, lam) against the rollout-time `values` (`gae`); the advantages are
    whitened over the batch's real tokens (`whiten`, with `all_sum` across processes) for the policy loss,
    while the returns (A + V, not whitened) are the critic's regression targets (`value_loss`).
    `whitened=False` leaves the advantages in reward units (masked to the real tokens); `scaled=False`
    centres them over the batch without dividing by their std (`whiten(scale=False)`).

    `value_lam` decouples the critic's lambda from the policy's (VC-PPO, Yuan et al. 2025, arXiv 2503.01491,
    "decoupled GAE"): the returns are then GAE(gamma, value_lam)'s A + V. With value_lam = 1 and gamma = 1
    they are the Monte-Carlo return-to-go, whatever the values: a fixed target, where lam < 1 mixes the
    critic's own (possibly biased) values of later tokens into it and decays the reward on early tokens.
    None: the policy's `lam`.
    """
    r = token_rewards(rewards.float(), mask, kl, kl_coef)
    adv, returns = gae(r, values, mask, gamma, lam)
    if value_lam is not None and value_lam != lam:
        returns = gae(r, values, mask, gamma, value_lam)[1]
    if not whitened:
        return adv.masked_fill(~mask.bool(), 0.0), returns
    return whiten(adv, mask, all_sum=all_sum, scale=scaled), returns


@torch.no_grad()
def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """How much of the returns' variance the values explain, over real tokens: 1 - Var[R - V] / Var[R]
    (as OpenAI baselines log it). 1: a perfect critic; 0: no better than a constant; negative: worse.
    0 when the returns do not vary."""
    _check(mask, values=values, returns=returns)

    def var(x: torch.Tensor) -> torch.Tensor:
        mean = masked_mean(x.double(), mask)
        return masked_mean((x.double() - mean) ** 2, mask)

    var_r = var(returns)
    if var_r <= 0:
        return torch.zeros((), dtype=torch.float32)
    return (1 - var(returns - values) / var_r).float()


@torch.no_grad()
def prompt_explainable_variance(returns: torch.Tensor) -> torch.Tensor:
    """The explained variance a perfect critic that sees only the prompt could reach: the share of the
    returns' variance that lies between prompts. `returns` is `(P, G)`, G >= 2 answers to each of P prompts
    (their returns from the first token, G_0). The best prompt-only value is V(s_0) = E[G_0 | prompt], whose
    explained variance is Var_prompt(E[G_0 | prompt]) / Var(G_0); estimated without bias from the groups as
    1 - mean over prompts of the within-group variance (ddof 1) / the variance over all answers (ddof 1).

    Near 0 when every prompt is as hard as every other for the policy (the reward is a coin the state before
    the answer cannot call): no critic of V(s_0) can then beat a constant, however well it learns. It can come
    out slightly negative from sampling noise. 0 when the returns do not vary."""
    if returns.ndim != 2 or returns.shape[1] < 2:
        raise ValueError(f"returns must be (P, G) with G >= 2, got {tuple(returns.shape)}")
    r = returns.double()
    total = r.flatten().var(correction=1)
    if total <= 0:
        return torch.zeros((), dtype=torch.float32)
    within = r.var(dim=1, correction=1).mean()
    return (1 - within / total).float()


class ValueHead(torch.nn.Module):
    """A scalar value per position from the policy's last hidden states: `(B, L, H)` -> `(B, L)`.

    By default one Linear(H, 1); with `hidden_units` k > 0, Linear(H, k) -> tanh -> Linear(k, 1), a layer
    of its own, so the critic can combine features the policy keeps apart (which letter was written, and
    which one the clip supports) without reshaping the policy's features to do it. The output layer (named
    `linear` either way) has zero bias and, by default, zero weights (`init_std=0`), so every value starts at
    exactly 0, the value of the terminal state: the first advantages are then plain (discounted) returns,
    free of random-init noise, and no gradient reaches a shared backbone through the head at step 0. A single
    output unit has no symmetry to break, and dL/dW = dL/dV * h is non-zero, so it learns from the first step.
    Pass `init_std` (e.g. 1e-3) for small random output weights instead.

    `detach=True` stops the value loss's gradient at the head's input: the critic reads the policy's
    features but never changes them, so the policy moves by the policy loss alone.

    Keep the head in float32 even for a bfloat16 policy (the default): hidden states are cast to the head's
    dtype, and bf16's 8-bit mantissa is too coarse for value regression.
    """

    def __init__(
        self,
        hidden_size: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        init_std: float = 0.0,
        hidden_units: int = 0,
        detach: bool = False,
    ):
        super().__init__()
        if hidden_units < 0:
            raise ValueError(f"hidden_units must be >= 0, got {hidden_units}")
        self.in_features, self.detach = hidden_size, detach
        self.body = None
        if hidden_units:
            layer = torch.nn.Linear(hidden_size, hidden_units, dtype=dtype, device=device)
            self.body = torch.nn.Sequential(layer, torch.nn.Tanh())
        self.linear = torch.nn.Linear(hidden_units or hidden_size, 1, dtype=dtype, device=device)
        torch.nn.init.zeros_(self.linear.bias)
        if init_std > 0:
            torch.nn.init.normal_(self.linear.weight, mean=0.0, std=init_std)
        else:
            torch.nn.init.zeros_(self.linear.weight)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if hidden.ndim != 3 or hidden.shape[-1] != self.in_features:
            raise ValueError(f"hidden must be (B, L, {self.in_features}), got {tuple(hidden.shape)}")
        x = hidden.to(self.linear.weight.dtype)
        if self.detach:
            x = x.detach()
        if self.body is not None:
            x = self.body(x)
        return self.linear(x).squeeze(-1)
