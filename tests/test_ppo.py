"""PPO with a learned critic: token rewards, GAE, whitening, the clipped value loss and the value head,
checked against numbers worked out by hand; per-token advantages through the policy loss; the PPO config
checks and the value head in checkpoints."""

from __future__ import annotations

import re

import pytest
import torch

from embodied.rl.losses import LossSpec, grpo_loss
from embodied.rl.ppo import (
    ValueHead,
    explained_variance,
    first_tokens,
    gae,
    gae_advantages,
    sequence_values,
    token_rewards,
    value_loss,
    whiten,
)


def _close(x: torch.Tensor, expected: list, atol: float = 1e-6) -> bool:
    return torch.allclose(x, torch.tensor(expected, dtype=x.dtype), atol=atol)


# --- token rewards ---------------------------------------------------------------------------------


def test_token_rewards_on_last_real_token():
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0]])
    r = token_rewards(torch.tensor([1.0, -0.5, 2.0]), mask)
    # lengths 3, 1, 2 -> last real tokens at t = 2, 0, 1
    assert torch.equal(r, torch.tensor([[0.0, 0.0, 1.0], [-0.5, 0.0, 0.0], [0.0, 2.0, 0.0]]))
    # a masked-out row (no real token) gets nothing, and does not spill onto another position
    r = token_rewards(torch.tensor([1.0, 3.0]), torch.tensor([[1, 1], [0, 0]]))
    assert torch.equal(r, torch.tensor([[0.0, 1.0], [0.0, 0.0]]))


def test_token_rewards_with_kl_penalty():
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.4, 9.0, 9.0]])  # 9.0 sits on padding
    r = token_rewards(torch.tensor([1.0, -0.5]), mask, kl=kl, kl_coef=0.5)
    # seq 0: -0.5 * (0.1, 0.2, 0.3) = (-0.05, -0.1, -0.15), plus the reward 1 on t = 2 -> 0.85
    # seq 1: -0.5 - 0.5 * 0.4 = -0.7 on t = 0 ; padding stays 0 (not -4.5)
    assert _close(r, [[-0.05, -0.1, 0.85], [-0.7, 0.0, 0.0]])
    with pytest.raises(ValueError):
        token_rewards(torch.tensor([1.0, -0.5]), mask, kl_coef=0.5)  # kl_coef without kl


def test_token_rewards_rejects_bad_shapes():
    with pytest.raises(ValueError):
        token_rewards(torch.tensor([1.0]), torch.ones(2, 3))
    with pytest.raises(ValueError):
        token_rewards(torch.tensor([1.0]), torch.tensor([[0, 1, 1]]))  # left padding
    with pytest.raises(ValueError):
        token_rewards(torch.tensor([1.0]), torch.ones(1, 3), kl=torch.ones(1, 2), kl_coef=0.1)


# --- GAE -------------------------------------------------------------------------------------------

# One sequence of 3 tokens: token rewards r = (0.5, -0.2, 1.0), values V = (0.3, 0.6, 0.8).
R3 = torch.tensor([[0.5, -0.2, 1.0]])
V3 = torch.tensor([[0.3, 0.6, 0.8]])
M3 = torch.ones(1, 3)


def test_gae_gamma1_lam1_is_return_to_go_minus_value():
    adv, ret = gae(R3, V3, M3, gamma=1.0, lam=1.0)
    # return-to-go G = (0.5 - 0.2 + 1.0, -0.2 + 1.0, 1.0) = (1.3, 0.8, 1.0)
    # A = G - V = (1.3 - 0.3, 0.8 - 0.6, 1.0 - 0.8) = (1.0, 0.2, 0.2); returns = A + V = G
    assert _close(adv, [[1.0, 0.2, 0.2]])
    assert _close(ret, [[1.3, 0.8, 1.0]])


def test_gae_by_hand_gamma09_lam08():
    adv, ret = gae(R3, V3, M3, gamma=0.9, lam=0.8)
    # deltas, delta_t = r_t + 0.9 * V_{t+1} - V_t, with V_3 = 0 (the episode ends):
    #   delta_2 = 1.0 + 0.9 * 0   - 0.8 =  0.2
    #   delta_1 = -0.2 + 0.9 * 0.8 - 0.6 = -0.2 + 0.72 - 0.6 = -0.08
    #   delta_0 = 0.5 + 0.9 * 0.6 - 0.3 =  0.5 + 0.54 - 0.3 =  0.74
    # recursion A_t = delta_t + (0.9 * 0.8 = 0.72) * A_{t+1}, A_3 = 0:
    #   A_2 = 0.2
    #   A_1 = -0.08 + 0.72 * 0.2   = -0.08 + 0.144   = 0.064
    #   A_0 =  0.74 + 0.72 * 0.064 =  0.74 + 0.04608 = 0.78608
    # returns = A + V = (0.78608 + 0.3, 0.064 + 0.6, 0.2 + 0.8) = (1.08608, 0.664, 1.0)
    assert _close(adv, [[0.78608, 0.064, 0.2]])
    assert _close(ret, [[1.08608, 0.664, 1.0]])


def test_gae_lam0_is_one_step_td_error():
    adv, ret = gae(R3, V3, M3, gamma=0.9, lam=0.0)
    # A_t = delta_t, the deltas worked out above: (0.74, -0.08, 0.2); returns = r_t + 0.9 * V_{t+1}
    assert _close(adv, [[0.74, -0.08, 0.2]])
    assert _close(ret, [[0.5 + 0.54, -0.2 + 0.72, 1.0]])


def test_gae_lam1_returns_are_discounted_monte_carlo():
    adv, ret = gae(R3, V3, M3, gamma=0.9, lam=1.0)
    # G_2 = 1.0 ; G_1 = -0.2 + 0.9 * 1.0 = 0.7 ; G_0 = 0.5 + 0.9 * 0.7 = 1.13, whatever V is
    assert _close(ret, [[1.13, 0.7, 1.0]])
    assert _close(adv, [[1.13 - 0.3, 0.7 - 0.6, 1.0 - 0.8]])


def test_gae_padded_batch_by_hand():
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    # padding holds junk rewards and values, which must change nothing
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.0, 2.0, 5.0, 5.0]])
    values = torch.tensor([[0.2, 0.4, 0.6, 0.8], [0.5, 0.4, 7.0, 9.0]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    # seq 0 (4 tokens): deltas
    #   delta_3 = 1 - 0.8 = 0.2 ; delta_2 = 0.9 * 0.8 - 0.6 = 0.12
    #   delta_1 = 0.9 * 0.6 - 0.4 = 0.14 ; delta_0 = 0.9 * 0.4 - 0.2 = 0.16
    # A_3 = 0.2 ; A_2 = 0.12 + 0.72 * 0.2 = 0.264 ; A_1 = 0.14 + 0.72 * 0.264 = 0.33008
    # A_0 = 0.16 + 0.72 * 0.33008 = 0.3976576 ; returns = A + V = (0.5976576, 0.73008, 0.864, 1.0)
    # seq 1 (2 tokens): the value after its own last token (t = 1) is 0, not the padded 7.0:
    #   delta_1 = 2.0 + 0.9 * 0 - 0.4 = 1.6 (not 2.0 + 0.9 * 7.0 - 0.4 = 7.9)
    #   delta_0 = 0 + 0.9 * 0.4 - 0.5 = -0.14
    # A_1 = 1.6 ; A_0 = -0.14 + 0.72 * 1.6 = 1.012 ; returns = (1.512, 2.0) ; padding 0
    assert _close(adv, [[0.3976576, 0.33008, 0.264, 0.2], [1.012, 1.6, 0.0, 0.0]])
    assert _close(ret, [[0.5976576, 0.73008, 0.864, 1.0], [1.512, 2.0, 0.0, 0.0]])


def _random_padded(seed: int, lengths: list[int], T: int):
    g = torch.Generator().manual_seed(seed)
    mask = torch.tensor([[1] * n + [0] * (T - n) for n in lengths])
    return torch.randn(len(lengths), T, generator=g), torch.randn(len(lengths), T, generator=g), mask


def test_gae_lam0_td_errors_on_random_padded_batch():
    rewards, values, mask = _random_padded(0, [6, 3, 1, 5], 6)
    adv, _ = gae(rewards, values, mask, gamma=0.95, lam=0.0)
    for i, n in enumerate([6, 3, 1, 5]):
        for t in range(6):
            if t >= n:
                expected = 0.0
            else:
                nxt = values[i, t + 1].item() if t + 1 < n else 0.0
                expected = rewards[i, t].item() + 0.95 * nxt - values[i, t].item()
            assert adv[i, t].item() == pytest.approx(expected, abs=1e-5)


def test_gae_lam1_gamma1_monte_carlo_on_random_padded_batch():
    lengths = [6, 3, 1, 5]
    rewards, values, mask = _random_padded(1, lengths, 6)
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    for i, n in enumerate(lengths):
        for t in range(6):
            mc = sum(rewards[i, t:n].tolist()) if t < n else 0.0
            assert ret[i, t].item() == pytest.approx(mc, abs=1e-5)
            assert adv[i, t].item() == pytest.approx(mc - values[i, t].item() if t < n else 0.0, abs=1e-5)


def test_gae_no_gradient_and_validation():
    values = V3.clone().requires_grad_(True)
    adv, ret = gae(R3, values, M3, gamma=0.9, lam=0.8)
    assert not adv.requires_grad and not ret.requires_grad
    with pytest.raises(ValueError):
        gae(R3, torch.zeros(1, 2), M3, 0.9, 0.8)  # values' shape differs
    with pytest.raises(ValueError):
        gae(R3, V3, torch.tensor([[0, 1, 1]]), 0.9, 0.8)  # left padding
    with pytest.raises(ValueError):
        gae(R3, V3, M3, gamma=1.5, lam=0.8)


# --- whitening -------------------------------------------------------------------------------------


def test_whiten_by_hand():
    x = torch.tensor([[1.0, 2.0, 3.0, 99.0], [4.0, 99.0, 99.0, 99.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    w = whiten(x, mask)
    # real tokens 1, 2, 3, 4: mean 2.5 ; population var (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25,
    # std sqrt(1.25) = 1.118034 -> (-1.5, -0.5, 0.5, 1.5) / 1.118034 ; padding zeroed (99 would not be)
    assert _close(w, [[-1.341641, -0.447214, 0.447214, 0.0], [1.341641, 0.0, 0.0, 0.0]])
    m = mask.bool()
    assert w[m].mean().item() == pytest.approx(0.0, abs=1e-6)
    assert (w[m] ** 2).mean().item() == pytest.approx(1.0, abs=1e-6)


def test_whiten_centre_only_by_hand():
    x = torch.tensor([[1.0, 2.0, 3.0, 99.0], [4.0, 99.0, 99.0, 99.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    # real tokens 1, 2, 3, 4: mean 2.5 -> (-1.5, -0.5, 0.5, 1.5), not divided by the std 1.118 ; padding 0
    assert _close(whiten(x, mask, scale=False), [[-1.5, -0.5, 0.5, 0.0], [1.5, 0.0, 0.0, 0.0]])
    # nearly equal values stay nearly equal: 1.00 and 1.02 -> -0.01 and +0.01, where scaling gives -1 and +1
    near = torch.tensor([[1.0, 1.02]])
    assert _close(whiten(near, torch.ones(1, 2), scale=False), [[-0.01, 0.01]])
    assert _close(whiten(near, torch.ones(1, 2)), [[-1.0, 1.0]], atol=1e-4)
    # through gae_advantages: returns-to-go (1, 1) and (-1, pad) minus their mean 1/3
    adv, _ = gae_advantages(
        torch.tensor([1.0, -1.0]), torch.zeros(2, 2), torch.tensor([[1, 1], [1, 0]]), 1.0, 1.0, scaled=False
    )
    assert _close(adv, [[2 / 3, 2 / 3], [-4 / 3, 0.0]])


def test_whiten_over_processes_equals_whole_batch():
    x, _, mask = _random_padded(2, [5, 2, 4, 1], 5)
    whole = whiten(x, mask)
    # two "processes" of two rows each: all_sum adds the other process's (additive) statistics
    halves = [(x[:2], mask[:2]), (x[2:], mask[2:])]
    local = []
    for xs, ms in halves:
        whiten(xs, ms, all_sum=lambda s: local.append(s.clone()) or s)
    parts = [whiten(xs, ms, all_sum=lambda s, o=local[1 - k]: s + o) for k, (xs, ms) in enumerate(halves)]
    assert torch.allclose(torch.cat(parts), whole, atol=1e-6)
    assert not torch.allclose(whiten(*halves[0]), whole[:2], atol=1e-3)  # the local stats differ


# --- value loss ------------------------------------------------------------------------------------


def _value_example():
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    values = torch.tensor([[1.0, 0.6, 0.0], [2.0, 100.0, 100.0]])
    old = torch.tensor([[0.5, 0.5, 0.5], [1.0, 0.0, 0.0]])
    returns = torch.tensor([[1.2, 0.0, 1.0], [1.5, -100.0, -100.0]])
    return values, old, returns, mask


def test_value_loss_by_hand():
    values, old, returns, mask = _value_example()
    loss, frac = value_loss(values, old, returns, mask, clip=0.2)
    # (a) V=1.0, V_old=0.5, R=1.2: unclipped (1.0-1.2)^2 = 0.04 ; clip(V) = 0.7 -> (0.7-1.2)^2 = 0.25
    #     -> max 0.25, the clip binds ; 0.5 * 0.25 = 0.125
    # (b) V=0.6, V_old=0.5, R=0.0: inside [0.3, 0.7], both 0.36 (equal: not counted as clipped) -> 0.18
    # (c) V=0.0, V_old=0.5, R=1.0: unclipped 1.0 ; clip(V) = 0.3 -> 0.49 -> max 1.0, unclipped -> 0.5
    # (d) V=2.0, V_old=1.0, R=1.5: unclipped 0.25 ; clip(V) = 1.2 -> 0.09 -> max 0.25 -> 0.125
    # padding (V=100, R=-100) ignored: mean over 4 tokens (0.125 + 0.18 + 0.5 + 0.125) / 4 = 0.2325
    assert loss.item() == pytest.approx(0.2325, abs=1e-6)
    assert frac.item() == pytest.approx(0.25, abs=1e-6)  # only (a) of the 4 real tokens


def test_value_loss_gradient_is_zero_where_clip_binds():
    values, old, returns, mask = _value_example()
    values.requires_grad_(True)
    loss, _ = value_loss(values, old, returns, mask, clip=0.2)
    loss.backward()
    # d/dV of 0.5 (V - R)^2 / 4 = (V - R) / 4 where unclipped wins, 0 where the clip binds or on padding:
    # (a) 0 ; (b) 0.6 / 4 = 0.15 ; (c) -1.0 / 4 = -0.25 ; (d) 0.5 / 4 = 0.125
    assert _close(values.grad, [[0.0, 0.15, -0.25], [0.125, 0.0, 0.0]])


def test_value_loss_without_clip_is_half_mse():
    values, old, returns, mask = _value_example()
    # 0.5 * mean of (0.04, 0.36, 1.0, 0.25) = 0.5 * 1.65 / 4 = 0.20625
    for clip in (0.0, -1.0):
        loss, frac = value_loss(values, old, returns, mask, clip=clip)
        assert loss.item() == pytest.approx(0.20625, abs=1e-6)
        assert frac.item() == 0.0


def test_value_loss_micro_batches_add_up_and_padding_may_be_nan():
    values, old, returns, mask = _value_example()
    values[1, 1:] = float("nan")
    returns[1, 1:] = float("inf")
    whole, _ = value_loss(values, old, returns, mask, clip=0.2)
    assert whole.item() == pytest.approx(0.2325, abs=1e-6)
    parts = [
        value_loss(values[i : i + 1], old[i : i + 1], returns[i : i + 1], mask[i : i + 1], 0.2, 4)[0]
        for i in (0, 1)
    ]
    # (0.125 + 0.18 + 0.5) / 4 + 0.125 / 4
    assert (parts[0] + parts[1]).item() == pytest.approx(0.2325, abs=1e-6)
    with pytest.raises(ValueError):
        value_loss(values, old[:, :2], returns, mask, clip=0.2)


# --- value head ------------------------------------------------------------------------------------


def test_value_head_shape_init_and_dtype():
    head = ValueHead(8)
    hidden = torch.randn(2, 5, 8, dtype=torch.bfloat16)
    v = head(hidden)
    assert v.shape == (2, 5) and v.dtype == torch.float32
    assert torch.equal(v, torch.zeros(2, 5))  # zero init: every value starts at 0
    small = ValueHead(8, init_std=1e-3)
    assert small.linear.weight.abs().max().item() > 0
    assert small.linear.weight.std().item() < 1e-2 and torch.equal(small.linear.bias, torch.zeros(1))
    assert ValueHead(8, dtype=torch.bfloat16).linear.weight.dtype == torch.bfloat16
    with pytest.raises(ValueError):
        head(torch.randn(2, 5, 7))


def test_value_head_gradients():
    torch.manual_seed(0)
    hidden = torch.randn(2, 5, 8, requires_grad=True)
    head = ValueHead(8)
    (head(hidden) - 1.0).pow(2).mean().backward()
    assert head.linear.weight.grad.abs().sum() > 0 and head.linear.bias.grad.abs().sum() > 0
    assert torch.equal(hidden.grad, torch.zeros_like(hidden))  # zero weights: nothing reaches the backbone
    hidden.grad = None
    head = ValueHead(8, init_std=1e-3)
    (head(hidden) - 1.0).pow(2).mean().backward()
    assert hidden.grad.abs().sum() > 0


def test_value_head_learns_toy_returns_with_clipped_loss():
    torch.manual_seed(0)
    hidden = torch.randn(4, 6, 16)
    mask = torch.tensor([[1] * n + [0] * (6 - n) for n in (6, 4, 2, 5)])
    returns = (hidden @ torch.randn(16) * 0.5 + 0.3) * mask  # reachable by a linear head
    head = ValueHead(16)
    opt = torch.optim.Adam(head.parameters(), lr=0.05)
    first, _ = value_loss(head(hidden), head(hidden).detach(), returns, mask, clip=0.2)
    for _ in range(25):  # PPO-style: old values frozen for 4 steps, then refreshed
        old = head(hidden).detach()
        for _ in range(4):
            loss, _ = value_loss(head(hidden), old, returns, mask, clip=0.2)
            opt.zero_grad()
            loss.backward()
            opt.step()
    last, _ = value_loss(head(hidden), head(hidden).detach(), returns, mask, clip=0.2)
    assert first.item() > 0.1
    assert last.item() < 0.02 * first.item()


# --- the PPO pipeline: rewards -> GAE -> whitening, the critic's metric ------------------------------


def test_gae_advantages_by_hand():
    mask = torch.tensor([[1, 1], [1, 0]])
    adv, ret = gae_advantages(torch.tensor([1.0, -1.0]), torch.zeros(2, 2), mask, gamma=1.0, lam=1.0)
    # token rewards (0, 1) and (-1, pad); values 0, so A = returns = return-to-go: (1, 1) and (-1, 0)
    assert _close(ret, [[1.0, 1.0], [-1.0, 0.0]])
    # whitened over the real tokens 1, 1, -1: mean 1/3, population var (4/9 + 4/9 + 16/9) / 3 = 8/9,
    # std 0.942809 -> (2/3) / 0.942809 = 0.707107 and (-4/3) / 0.942809 = -1.414214 ; padding 0
    assert _close(adv, [[0.707107, 0.707107], [-1.414214, 0.0]])
    kl = torch.tensor([[0.2, 0.4], [0.1, 9.0]])
    _, ret = gae_advantages(torch.tensor([1.0, -1.0]), torch.zeros(2, 2), mask, 1.0, 1.0, kl, kl_coef=0.5)
    # token rewards (-0.1, 1 - 0.2) and (-1 - 0.05, pad) -> returns-to-go (0.7, 0.8) and (-1.05, 0)
    assert _close(ret, [[0.7, 0.8], [-1.05, 0.0]])
    raw, _ = gae_advantages(torch.tensor([1.0, -1.0]), torch.zeros(2, 2), mask, 1.0, 1.0, whitened=False)
    assert _close(raw, [[1.0, 1.0], [-1.0, 0.0]])  # the return-to-go minus V = 0, padding 0


def test_decoupled_value_lambda_by_hand():
    # one sequence of 3 tokens, reward 1 on the last; values (0.3, 0.6, 0.8); gamma 1, policy lambda 0.5
    # deltas: d2 = 1 - 0.8 = 0.2 ; d1 = 0.8 - 0.6 = 0.2 ; d0 = 0.6 - 0.3 = 0.3
    # lambda 0.5: A2 = 0.2 ; A1 = 0.2 + 0.5 * 0.2 = 0.3 ; A0 = 0.3 + 0.5 * 0.3 = 0.45
    mask, values, reward = torch.ones(1, 3), torch.tensor([[0.3, 0.6, 0.8]]), torch.tensor([1.0])
    adv, ret = gae_advantages(reward, values, mask, 1.0, 0.5, whitened=False)
    assert _close(adv, [[0.45, 0.3, 0.2]])
    assert _close(ret, [[0.75, 0.9, 1.0]])  # A + V: the critic's own values leak into its targets
    # value_lam 1: the targets are the Monte-Carlo return-to-go (1, 1, 1), the advantages stay lambda 0.5's
    adv1, ret1 = gae_advantages(reward, values, mask, 1.0, 0.5, whitened=False, value_lam=1.0)
    assert torch.equal(adv1, adv) and _close(ret1, [[1.0, 1.0, 1.0]])
    # ... whatever the values are
    _, ret2 = gae_advantages(reward, torch.tensor([[5.0, -2.0, 0.1]]), mask, 1.0, 0.5, value_lam=1.0)
    assert _close(ret2, [[1.0, 1.0, 1.0]])
    # value_lam equal to lam, or None, changes nothing
    assert torch.equal(gae_advantages(reward, values, mask, 1.0, 0.5, value_lam=0.5)[1], ret)


def test_sequence_values_and_first_tokens_by_hand():
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    values = torch.tensor([[0.4, 9.0, -3.0], [1.5, 7.0, 7.0], [2.0, 2.0, 2.0]])
    # each row's V(s_0) on its real tokens: (0.4, 0.4, 0.4), (1.5, pad, pad); the empty row gets nothing
    assert _close(sequence_values(values, mask), [[0.4, 0.4, 0.4], [1.5, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert torch.equal(first_tokens(mask), torch.tensor([[1, 0, 0], [1, 0, 0], [0, 0, 0]]))
    with pytest.raises(ValueError):
        first_tokens(torch.tensor([[0, 1]]))  # left padding


def test_sequence_baseline_gives_return_to_go_minus_the_prompt_value():
    # gamma = lam = 1, reward 1 on the last of 3 tokens, a per-token KL reward of -0.1 on token 0:
    # token rewards (-0.1, 0, 1); returns-to-go G = (0.9, 1.0, 1.0). Per-token values (0.3, 0.6, 0.8)
    # give A = G - V_t = (0.6, 0.4, 0.2): the critic's position structure in the advantages. The sequence
    # baseline V(s_0) = 0.3 gives A = G - 0.3 = (0.6, 0.7, 0.7): the same baseline on every token.
    mask, reward = torch.ones(1, 3), torch.tensor([1.0])
    kl = torch.tensor([[1.0, 0.0, 0.0]])
    values = torch.tensor([[0.3, 0.6, 0.8]])
    adv, ret = gae_advantages(reward, values, mask, 1.0, 1.0, kl, 0.1, whitened=False)
    assert _close(adv, [[0.6, 0.4, 0.2]]) and _close(ret, [[0.9, 1.0, 1.0]])
    base = sequence_values(values, mask)
    adv, ret = gae_advantages(reward, base, mask, 1.0, 1.0, kl, 0.1, whitened=False)
    assert _close(adv, [[0.6, 0.7, 0.7]]) and _close(ret, [[0.9, 1.0, 1.0]])


def test_explained_variance_by_hand():
    returns = torch.tensor([[1.0, 2.0, 3.0, 99.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    assert explained_variance(returns, returns, mask).item() == pytest.approx(1.0)
    assert explained_variance(torch.zeros(1, 4), returns, mask).item() == pytest.approx(0.0, abs=1e-6)
    # V = (1, 2, 4): R - V = (0, 0, -1), mean -1/3, var (1/9 + 1/9 + 4/9) / 3 = 2/9 ; Var R = 2/3
    # -> 1 - (2/9) / (2/3) = 2/3 (padding, V = 0 against R = 99, ignored)
    values = torch.tensor([[1.0, 2.0, 4.0, 0.0]])
    assert explained_variance(values, returns, mask).item() == pytest.approx(2 / 3, abs=1e-6)
    assert explained_variance(values, torch.ones(1, 4), mask).item() == 0.0  # constant returns


# --- per-token advantages through the policy loss ---------------------------------------------------

SPECS = {
    "grpo": LossSpec(),
    "dapo": LossSpec(clip_eps_high=0.28, agg="token-mean", dual_clip=3.0),
    "drgrpo": LossSpec(agg="seq-sum-norm", agg_norm=4.0),
    "gspo": LossSpec(ratio_level="sequence", clip_eps=3e-4, clip_eps_high=4e-4),
    "kl_cov": LossSpec(cov_mode="kl_cov", cov_ratio=0.2),
    "clip_cov": LossSpec(cov_mode="clip_cov", cov_ratio=0.2, clip_cov_bounds=(-10.0, 10.0)),
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_per_token_advantages_constant_over_tokens_equal_per_sequence_ones(name):
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]])
    old = torch.randn(3, 4, generator=g) - 1.0
    adv = torch.tensor([1.5, -0.7, 0.3])
    results = []
    for a in (adv, adv.unsqueeze(1).expand(3, 4).clone()):  # (B,) and the same value on every token
        logp = (old + 0.3 * torch.randn(3, 4, generator=torch.Generator().manual_seed(1))).requires_grad_(
            True
        )
        loss, terms = grpo_loss(
            logp, old, a, mask, spec=SPECS[name], generator=torch.Generator().manual_seed(2)
        )
        loss.backward()
        results.append((loss.detach(), terms, logp.grad))
    (l1, t1, g1), (l2, t2, g2) = results
    assert torch.equal(l1, l2) and torch.equal(g1, g2)
    assert all(torch.equal(t1[k], t2[k]) for k in t1)
    # advantages that do vary over tokens give another loss: the (B, T) ones are really used per token
    varied = adv.unsqueeze(1) * torch.tensor([1.0, 0.0, 2.0, 1.0])
    logp = (old + 0.3 * torch.randn(3, 4, generator=torch.Generator().manual_seed(1))).detach()
    other, _ = grpo_loss(
        logp, old, varied, mask, spec=SPECS[name], generator=torch.Generator().manual_seed(2)
    )
    assert not torch.allclose(other, l1)


def test_per_token_advantages_of_the_wrong_shape_are_refused():
    mask = torch.ones(2, 3)
    with pytest.raises(ValueError):
        grpo_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 2), mask)
    with pytest.raises(ValueError):
        grpo_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3), mask)


# --- config checks and the value head in checkpoints ------------------------------------------------


def test_ppo_config_checks():
    from embodied.config import GRPOConfig
    from embodied.train.config import PPOConfig
    from embodied.train.grpo import check_config

    check_config(GRPOConfig(advantage="gae", ppo=PPOConfig(kl_in_reward=True), group_size=1))
    for bad, world, says in (
        (GRPOConfig(ppo=PPOConfig(kl_in_reward=True)), 1, "kl_in_reward"),  # per-token rewards need GAE
        (GRPOConfig(advantage="gae", ppo=PPOConfig(lam=1.5)), 1, "grpo.ppo.lam"),
        (GRPOConfig(advantage="gae", ppo=PPOConfig(value_lam=-0.1)), 1, "grpo.ppo.value_lam"),
        (GRPOConfig(advantage="gae", ppo=PPOConfig(value_hidden=-1)), 1, "value_hidden"),
        (GRPOConfig(advantage="gae", ppo=PPOConfig(value_warmup_steps=-1)), 1, "value_warmup_steps"),
        (GRPOConfig(advantage="gae", ppo=PPOConfig(value_level="prompt")), 1, "grpo.ppo.value_level"),
        # A_t = G_t - V(s_0) needs lambda 1
        (GRPOConfig(advantage="gae", ppo=PPOConfig(value_level="sequence", lam=0.95)), 1, "lam=1"),
        (GRPOConfig(advantage="gae"), 2, "several processes"),  # not over several processes yet
        (GRPOConfig(advantage="ppo"), 1, "grpo.advantage='ppo'"),
    ):
        with pytest.raises(ValueError, match=re.escape(says)):
            check_config(bad, world)


def test_checkpoint_keeps_the_value_head_next_to_the_model(tmp_path):
    from embodied.train.checkpoint import load_checkpoint, save_checkpoint

    torch.manual_seed(0)
    model, head = torch.nn.Linear(3, 2), ValueHead(3, init_std=0.5)
    opt = torch.optim.AdamW([*model.parameters(), *head.parameters()])
    path = save_checkpoint(tmp_path, 1, model, opt, extra={"value_head": head})
    assert (path / "value_head.safetensors").is_file()
    fresh_model, fresh_head = torch.nn.Linear(3, 2), ValueHead(3)
    fresh_opt = torch.optim.AdamW([*fresh_model.parameters(), *fresh_head.parameters()])
    load_checkpoint(path, fresh_model, fresh_opt, extra={"value_head": fresh_head})
    assert torch.equal(fresh_head.linear.weight, head.linear.weight)
    assert torch.equal(fresh_model.weight, model.weight)
    (path / "value_head.safetensors").unlink()  # a checkpoint of a run without a critic
    with pytest.raises(FileNotFoundError, match="value_head"):
        load_checkpoint(path, fresh_model, fresh_opt, extra={"value_head": fresh_head})
