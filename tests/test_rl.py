"""Rewards, advantages and the GRPO loss, checked against numbers worked out by hand."""

import math
import time

import pytest
import torch

from embodied.rl.advantages import compute_advantages, group_normalized_advantages
from embodied.rl.losses import LossSpec, aggregate, grpo_loss, k3_kl, kl_estimate, masked_mean
from embodied.rl.rewards import accuracy_reward, format_reward, mcq_reward, parse_answer

LN = math.log


# --- rewards -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, answer, acc, fmt",
    [
        ("<think>falls then rests</think><answer>A</answer>", "A", 1.0, 1.0),
        ("<think>x</think>\n<answer> A </answer>\n", "A", 1.0, 1.0),  # whitespace is fine
        ("<think>x</think><answer>B</answer>", "A", 0.0, 1.0),  # well formed, wrong
        ("<think>x</think>", "A", 0.0, 0.0),  # missing answer
        ("<think>x</think><answer></answer>", "A", 0.0, 0.0),  # empty answer
        ("<think>x</think><answer>  </answer>", "A", 0.0, 0.0),  # blank answer
        ("<think>x</think><answer>A</answer><answer>A</answer>", "A", 0.0, 0.0),  # duplicated
        ("<think>x</think><answer>A</answer><answer>B</answer>", "A", 0.0, 0.0),  # hedging
        ("<think>x</think><answer>A<answer>B</answer>", "A", 0.0, 0.0),  # nested
        ("<answer>A</answer>", "A", 1.0, 0.0),  # right letter, no reasoning block
        ("<think>x</think><answer>A</answer> trailing words", "A", 1.0, 0.0),
        ("<think>x</think><answer>a</answer>", "A", 0.0, 1.0),  # exact letter: case matters
        ("<think>x</think><answer>(A)</answer>", "A", 0.0, 1.0),  # exact letter only
        ("<think>x<think>y</think></think><answer>A</answer>", "A", 1.0, 0.0),  # nested think
        ("<think>x</think><answer>A", "A", 0.0, 0.0),  # unterminated
        ("", "A", 0.0, 0.0),
    ],
)
def test_reward_edge_cases(text, answer, acc, fmt):
    assert accuracy_reward(text, answer) == acc
    assert format_reward(text) == fmt


@pytest.mark.parametrize(
    "content, chosen",
    [
        ("B", "B"),  # a letter names its option
        ("2, 1, 3", "B"),  # an option's text names it
        ("2,1,3", "B"),
        (" 3, 2, 1. ", "C"),  # a final period and spaces aside
        ("forward", "forward"),  # a text that is no option matches none
        ("2, 1", "2, 1"),  # part of an order is not the order
        ("D", "D"),  # a letter past the options names none
        ("1, 3, 3", "A"),  # an order that is no option: the one it agrees with on most positions (2 of 3)
        ("1 2 2", "A"),
        ("2, 3, 1", "2, 3, 1"),  # agrees with each option on one position: a tie chooses none
        ("1, 3, 2, 4", "1, 3, 2, 4"),  # another length is no order of these pieces
    ],
)
def test_an_answer_chooses_an_option_by_letter_or_by_text(content, chosen):
    from embodied.questions import chosen_option
    from embodied.rl.rewards import record_reward

    options = ["1, 3, 2", "2, 1, 3", "3, 2, 1"]
    text = f"<think>x</think><answer>{content}</answer>"
    assert chosen_option(text, options) == chosen
    assert chosen_option(text) == content.strip()  # without options only letters name options
    assert accuracy_reward(text, "B", options) == float(chosen == "B")
    assert accuracy_reward(text, "B") == float(content == "B")  # the letter rule without options is unchanged
    record = {"family": "temporal_puzzle", "options": options, "answer": "B"}
    assert record_reward(text, record)["reward/accuracy"] == float(chosen == "B")


def test_nearest_order_only_on_ordering_questions():
    from embodied.questions import chosen_option, nearest_order_option

    assert nearest_order_option("2, 1, 4, 3", ["1, 2, 3, 4", "2, 1, 3, 4", "4, 3, 2, 1"]) == "B"
    assert nearest_order_option("2, 1", ["forward", "backward"]) is None  # options that are no orders
    assert nearest_order_option("4", ["1", "5", "9"]) is None  # places of one patch are no orders
    assert nearest_order_option("1, 2", ["1, 2, 3", "2, 1"]) is None  # orders of different lengths
    assert nearest_order_option("first", ["1, 2", "2, 1"]) is None
    assert chosen_option("<answer>1, 2, 2</answer>", ["1, 2, 3", "3, 1, 2"]) == "A"  # repeats: 2 to 1
    # what a tokenizer may write: non-ASCII digits are no order (`int("²")` would raise), a multi-letter
    # answer is no letter, a trailing comma is the same order, an order that agrees nowhere chooses none
    assert chosen_option("<answer>2, 1, 3²</answer>", ["1, 2, 3", "2, 1, 3"]) == "2, 1, 3²"
    assert chosen_option("<answer>AB</answer>", ["1, 2", "2, 1"]) == "AB"
    assert chosen_option("<answer>2, 1, 3,</answer>", ["1, 2, 3", "2, 1, 3"], nearest=False) == "B"
    assert nearest_order_option("2, 1", ["1, 2"]) is None


def test_partial_credit_reads_an_order_written_out():
    from embodied.rl.rewards import order_credit_reward

    orders = [[1, 2, 3, 4], [1, 2, 4, 3], [2, 1, 3, 4]]
    for content in ("B", "1, 2, 4, 3", "1,2,4,3"):
        text = f"<think></think><answer>{content}</answer>"
        assert order_credit_reward(text, "A", orders, 0.2) == pytest.approx(0.1)  # 2 of 4 places right
    assert order_credit_reward("<answer>1, 2</answer>", "A", orders, 0.2) == 0.0
    assert order_credit_reward("<answer>AB</answer>", "A", orders, 0.2) == 0.0  # no letter, no credit


def test_parse_answer_and_weighted_total():
    assert parse_answer("<think></think><answer>C</answer>") == "C"
    assert parse_answer("no tags") is None
    r = mcq_reward("<think>x</think><answer>B</answer>", "B", accuracy_weight=1.0, format_weight=0.5)
    assert r == {"reward/accuracy": 1.0, "reward/format": 1.0, "reward/total": 1.5}
    r = mcq_reward("<answer>B</answer>", "B", accuracy_weight=2.0, format_weight=0.5)
    assert r["reward/total"] == 2.0


# --- advantages --------------------------------------------------------------------------------------


def test_group_advantages_by_hand():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0], [3.0, 0.0, 0.0, 0.0]])
    adv = group_normalized_advantages(rewards, eps=0.0 + 1e-12)
    # group 0: mean 0.5; unbiased std = sqrt(4 * 0.25 / 3) = 0.577350 -> +-0.5 / 0.577350 = +-0.866025
    assert torch.allclose(adv[0], torch.tensor([0.866025, -0.866025, -0.866025, 0.866025]), atol=1e-5)
    # group 1: no spread -> exactly zero, not NaN
    assert torch.equal(adv[1], torch.zeros(4))
    # group 2: mean 0.75; deviations 2.25, -0.75 x3; std = sqrt((5.0625 + 3 * 0.5625) / 3) = 1.5
    assert torch.allclose(adv[2], torch.tensor([1.5, -0.5, -0.5, -0.5]), atol=1e-5)
    # mean-only centring (Dr. GRPO style) keeps the raw deviations
    assert torch.allclose(
        group_normalized_advantages(rewards, scale=False)[2], torch.tensor([2.25, -0.75, -0.75, -0.75])
    )


def test_group_advantages_loop_equals_vectorised():
    torch.manual_seed(0)
    rewards = torch.randint(0, 3, (6, 8)).float()
    adv = group_normalized_advantages(rewards)
    for i, row in enumerate(rewards):
        mean = sum(row.tolist()) / len(row)
        std = math.sqrt(sum((x - mean) ** 2 for x in row.tolist()) / (len(row) - 1))
        expected = [(x - mean) / (std + 1e-6) for x in row.tolist()]
        assert torch.allclose(adv[i], torch.tensor(expected), atol=1e-5)
    assert not torch.isnan(group_normalized_advantages(torch.ones(3, 8))).any()


# --- losses ------------------------------------------------------------------------------------------


def _hand_example():
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    old = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -0.3, -2.0]])
    # log-ratios chosen so the ratios are 1.5, 1.0, 0.5 and 1.1, 0.7 (the padded one is arbitrary)
    logprobs = old + torch.tensor([[LN(1.5), 0.0, LN(0.5)], [LN(1.1), LN(0.7), 5.0]])
    advantages = torch.tensor([1.0, -2.0])
    return logprobs, old, advantages, mask


def test_grpo_loss_by_hand():
    logprobs, old, adv, mask = _hand_example()
    loss, m = grpo_loss(logprobs, old, adv, mask, spec=LossSpec(clip_eps=0.2))
    # sequence 0 (A = +1): tokens -min(r A, clip(r) A):
    #   r=1.5 -> -min(1.5, 1.2) = -1.2 ; r=1.0 -> -1.0 ; r=0.5 -> -min(0.5, 0.8) = -0.5 ; mean -0.9
    # sequence 1 (A = -2): r=1.1 -> -min(-2.2, -2.2) = 2.2 ; r=0.7 -> -min(-1.4, -1.6) = 1.6 ; mean 1.9
    # loss = mean over sequences = (-0.9 + 1.9) / 2 = 0.5
    assert loss.item() == pytest.approx(0.5, abs=1e-6)
    assert m["loss/kl"].item() == 0.0
    # clipped term chosen for (seq 0, r=1.5) and (seq 1, r=0.7): 2 of 5 real tokens
    assert m["clip/fraction"].item() == pytest.approx(0.4, abs=1e-6)


def test_grpo_loss_with_k3_kl_by_hand():
    logprobs, old, adv, mask = _hand_example()
    # d = ref - logprobs per token; k3(d) = e^d - d - 1
    d = torch.tensor([[0.0, LN(2.0), -LN(2.0)], [LN(2.0), 0.0, 3.0]])
    ref = logprobs + d
    # seq 0: 0 + (2 - ln2 - 1) + (0.5 + ln2 - 1) = 0.5, mean 1/6 ; seq 1: (1 - ln2 + 0) / 2 = 0.153426
    kl_expected = (0.5 / 3 + (1 - LN(2.0)) / 2) / 2
    loss, m = grpo_loss(logprobs, old, adv, mask, ref_logprobs=ref, spec=LossSpec(clip_eps=0.2, kl_coef=0.1))
    assert m["loss/kl"].item() == pytest.approx(kl_expected, abs=1e-6)
    assert loss.item() == pytest.approx(0.5 + 0.1 * kl_expected, abs=1e-6)
    with pytest.raises(ValueError):
        grpo_loss(logprobs, old, adv, mask, spec=LossSpec(kl_coef=0.1))


def test_k3_is_nonnegative_and_zero_at_equality():
    x = torch.randn(4, 5)
    assert torch.all(k3_kl(x, x) == 0)
    assert torch.all(k3_kl(x, x + torch.randn(4, 5)) >= 0)


def test_grpo_gradient_on_policy_by_hand():
    # At the sampling policy (ratio 1) the gradient wrt each real token's log-prob is -A_i / (B |o_i|).
    _, old, adv, mask = _hand_example()
    logprobs = old.clone().requires_grad_(True)
    loss, _ = grpo_loss(logprobs, old, adv, mask)
    loss.backward()
    expected = torch.tensor([[-1 / 6, -1 / 6, -1 / 6], [2 / 4, 2 / 4, 0.0]])
    assert torch.allclose(logprobs.grad, expected, atol=1e-7)


def test_grpo_loss_loop_equals_vectorised():
    torch.manual_seed(1)
    B, T = 5, 7
    old = -torch.rand(B, T) * 3
    logprobs = old + 0.3 * torch.randn(B, T)
    ref = old + 0.2 * torch.randn(B, T)
    adv = torch.randn(B)
    lengths = [7, 3, 5, 1, 6]
    mask = torch.tensor([[1] * n + [0] * (T - n) for n in lengths])
    loss, _ = grpo_loss(logprobs, old, adv, mask, ref, spec=LossSpec(clip_eps=0.2, kl_coef=0.05))
    total = 0.0
    for i in range(B):
        seq = 0.0
        for t in range(lengths[i]):
            r = math.exp(logprobs[i, t] - old[i, t])
            a = adv[i].item()
            pg = -min(r * a, min(max(r, 0.8), 1.2) * a)
            dd = (ref[i, t] - logprobs[i, t]).item()
            seq += pg + 0.05 * (math.exp(dd) - dd - 1)
        total += seq / lengths[i]
    assert loss.item() == pytest.approx(total / B, rel=1e-5)


def test_masked_mean():
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert masked_mean(x, mask).item() == pytest.approx(2.0)
    assert torch.allclose(masked_mean(x, mask, dim=1), torch.tensor([1.5, 3.0]))


# --- the GRPO family's switches -------------------------------------------------------------------


def test_clip_higher_by_hand():
    logprobs, old, adv, mask = _hand_example()
    loss, _ = grpo_loss(logprobs, old, adv, mask, spec=LossSpec(clip_eps=0.2, clip_eps_high=0.28))
    # seq 0 (A=+1): r=1.5 -> -min(1.5, 1.28) = -1.28 ; r=1.0 -> -1.0 ; r=0.5 -> -min(0.5, 0.8) = -0.5
    #   mean -2.78 / 3 = -0.926667
    # seq 1 (A=-2): unchanged by the upper bound: (2.2 + 1.6) / 2 = 1.9
    # loss (-0.926667 + 1.9) / 2 = 0.486667
    assert loss.item() == pytest.approx((-2.78 / 3 + 1.9) / 2, abs=1e-6)


def test_dual_clip_by_hand():
    old = torch.tensor([[-1.0, -1.0]])
    logprobs = old + torch.tensor([[LN(4.0), LN(1.1)]])
    adv, mask = torch.tensor([-2.0]), torch.ones(1, 2)
    # A=-2: r=4 -> -min(-8, -2.4) = 8, capped by dual clip c=3 at -c*A = 6 ; r=1.1 -> 2.2
    plain, _ = grpo_loss(logprobs, old, adv, mask)
    dual, _ = grpo_loss(logprobs, old, adv, mask, spec=LossSpec(dual_clip=3.0))
    assert plain.item() == pytest.approx((8 + 2.2) / 2, abs=1e-5)
    assert dual.item() == pytest.approx((6 + 2.2) / 2, abs=1e-5)
    # positive advantages are never dual-clipped
    pos, _ = grpo_loss(logprobs, old, -adv, mask, spec=LossSpec(dual_clip=3.0))
    assert pos.item() == pytest.approx(-(1.2 * 2 + 1.1 * 2) / 2, abs=1e-5)
    with pytest.raises(ValueError):
        grpo_loss(logprobs, old, adv, mask, spec=LossSpec(dual_clip=0.5))


def test_loss_aggregations_by_hand():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 99.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    assert aggregate(x, mask, "seq-mean-token-mean").item() == pytest.approx((2.0 + 4.5) / 2)  # 3.25
    assert aggregate(x, mask, "token-mean").item() == pytest.approx(15.0 / 5)  # 3.0
    assert aggregate(x, mask, "seq-sum-norm", norm=4).item() == pytest.approx((6 / 4 + 9 / 4) / 2)  # 1.875
    with pytest.raises(ValueError):
        aggregate(x, mask, "seq-sum-norm")
    with pytest.raises(ValueError):
        aggregate(x, mask, "mean-of-something")


def test_kl_estimators_by_hand():
    lp = torch.tensor([[-1.0]])
    ref = lp + LN(2.0)  # d = ref - lp = ln 2
    assert kl_estimate(lp, ref, "k1").item() == pytest.approx(-0.693147, abs=1e-6)
    assert kl_estimate(lp, ref, "k2").item() == pytest.approx(0.5 * 0.693147**2, abs=1e-6)  # 0.240227
    assert kl_estimate(lp, ref, "k3").item() == pytest.approx(2 - 0.693147 - 1, abs=1e-6)  # 0.306853
    with pytest.raises(ValueError):
        kl_estimate(lp, ref, "k4")


def test_rloo_and_reinforce_pp_by_hand():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [3.0, 0.0, 0.0, 0.0]])
    # RLOO: r_i minus the mean of the other three: 1 - 1/3 = 2/3, 0 - 2/3 = -2/3 ; 3 - 0 = 3, 0 - 1 = -1
    expected = torch.tensor([[2 / 3, -2 / 3, -2 / 3, 2 / 3], [3.0, -1.0, -1.0, -1.0]])
    assert torch.allclose(compute_advantages(rewards, "rloo"), expected, atol=1e-6)
    # REINFORCE++ baseline: centred [[.5,-.5,-.5,.5],[2.25,-.75,-.75,-.75]]; batch std
    # sqrt((4 * 0.25 + 5.0625 + 3 * 0.5625) / 7) = sqrt(7.75 / 7) = 1.052209
    centred = torch.tensor([[0.5, -0.5, -0.5, 0.5], [2.25, -0.75, -0.75, -0.75]])
    assert torch.allclose(compute_advantages(rewards, "reinforce_pp"), centred / 1.052209, atol=1e-5)
    assert torch.allclose(compute_advantages(rewards, "drgrpo"), centred)
    assert torch.equal(compute_advantages(torch.ones(2, 4), "rloo"), torch.zeros(2, 4))
    with pytest.raises(ValueError):
        compute_advantages(rewards, "ppo")


def test_rloo_loop_equals_vectorised():
    torch.manual_seed(2)
    rewards = torch.rand(5, 6)
    adv = compute_advantages(rewards, "rloo")
    for i in range(5):
        for j in range(6):
            others = [rewards[i, k].item() for k in range(6) if k != j]
            assert adv[i, j].item() == pytest.approx(rewards[i, j].item() - sum(others) / 5, abs=1e-6)


# --- reward functions: failures are errors, never zeros -------------------------------------------------


def test_score_passes_terms_through_and_averages_mixed_kinds():
    from embodied.rl.rewards import mcq_rewards, mean_terms, score

    recs = [{"id": "a", "family": "t", "answer": "A"}, {"id": "b", "family": "t", "answer": "B"}]
    texts = ["<think></think><answer>A</answer>", "<answer>A</answer>"]
    terms = score(mcq_rewards(1.0, 0.5), texts, recs)
    assert [t["reward/total"] for t in terms] == [1.5, 0.0]
    # 'reward/dropped' is reported by one completion only: its mean is over that one (2.0), not over both.
    assert mean_terms([{"reward/total": 1.0}, {"reward/total": 0.0, "reward/dropped": 2.0}]) == {
        "reward/total": 0.5,
        "reward/dropped": 2.0,
    }


@pytest.mark.parametrize(
    "fn, match",
    [
        (lambda texts, recs: 1 / 0, "raised ZeroDivisionError"),
        (lambda texts, recs: [{"reward/total": 1.0}], "returned 1 results for 2"),
        (lambda texts, recs: [{"reward/total": float("nan")}] * 2, "no finite 'reward/total'"),
        (lambda texts, recs: [{"reward/accuracy": 1.0}] * 2, "no finite 'reward/total'"),
        (lambda texts, recs: time.sleep(5), "timed out after 0.2 s"),
    ],
)
def test_score_reports_failing_reward_functions_as_errors(fn, match):
    from embodied.rl.rewards import RewardError, score

    recs = [{"id": "rec-7", "task": "place"}, {"id": "rec-7", "task": "place"}]
    with pytest.raises(RewardError, match=match) as e:
        score(fn, ["x", "y"], recs, timeout_s=0.2)
    if "returned" not in match:  # says what was being scored
        assert "rec-7" in str(e.value)


# --- GSPO ratio, entropy controls, PAPO, overlong shaping ----------------------------------------------


def test_sequence_level_ratio_by_hand():
    lp = torch.tensor([[0.2, -0.1]], requires_grad=True)
    old = torch.zeros(1, 2)
    mask = torch.ones(1, 2)
    # sequence log-ratio = (0.2 - 0.1) / 2 = 0.05 on both tokens; rho = e^0.05 = 1.051271 < 1.2, unclipped
    loss, _ = grpo_loss(lp, old, torch.tensor([1.0]), mask, spec=LossSpec(ratio_level="sequence"))
    assert loss.item() == pytest.approx(-1.051271, abs=1e-6)
    loss.backward()
    # d/d lp_t of -e^{mean} = -e^0.05 / 2 for each token (the gradient reaches every token equally)
    assert torch.allclose(lp.grad, torch.full((1, 2), -1.051271 / 2), atol=1e-6)


def test_entropy_bonus_by_hand():
    lp = torch.zeros(1, 2)
    ent = torch.tensor([[1.0, 2.0]])
    # advantage 0: policy term 0; entropy seq-mean = 1.5; loss = -0.1 * 1.5
    loss, m = grpo_loss(
        lp, lp, torch.tensor([0.0]), torch.ones(1, 2), entropy=ent, spec=LossSpec(entropy_coef=0.1)
    )
    assert loss.item() == pytest.approx(-0.15, abs=1e-7)
    assert m["loss/entropy"].item() == pytest.approx(1.5)


# logp of 4 tokens in 2 sequences; token (0,0) moved by +0.1 from the sampling policy.
COV_LP = torch.tensor([[-1.0, -2.0], [-3.0, -3.5]])
COV_OLD = COV_LP - torch.tensor([[0.1, 0.0], [0.0, 0.0]])
COV_ADV = torch.tensor([1.0, -1.0])


def test_token_covariance_by_hand():
    from embodied.rl.losses import token_covariance

    # mean A over tokens = 0; mean logp = -9.5 / 4 = -2.375
    # cov = A * (lp + 2.375): 1*1.375, 1*0.375, -1*-0.625, -1*-1.125
    cov = token_covariance(COV_LP, COV_ADV, torch.ones(2, 2))
    assert torch.allclose(cov, torch.tensor([[1.375, 0.375], [0.625, 1.125]]), atol=1e-6)


def test_kl_cov_by_hand():
    lp = COV_LP.clone().requires_grad_(True)
    # top-1 token by covariance: (0,0) (1.375). Its loss: -A * rho + |log rho| = -e^0.1 + 0.1 = -1.005171
    # the others, unclipped -A * rho with rho = 1: -1, +1, +1
    # seq-mean-token-mean: ((-1.005171 - 1) / 2 + (1 + 1) / 2) / 2 = -0.00129275
    loss, m = grpo_loss(
        lp, COV_OLD, COV_ADV, torch.ones(2, 2), spec=LossSpec(cov_mode="kl_cov", cov_ratio=1e-4)
    )
    assert loss.item() == pytest.approx(-0.00129275, abs=1e-6)
    assert m["clip/cov_fraction"].item() == pytest.approx(0.25)


def test_clip_cov_by_hand():
    lp = COV_LP.clone().requires_grad_(True)
    # only (1,1) has 1.1 < cov < 1.2 (1.125): its gradient is cut. PPO loss of the others: -e^0.1, -1, +1
    # seq-mean-token-mean: ((-1.105171 - 1) / 2 + (1 + 0) / 2) / 2 = -0.27629275
    loss, m = grpo_loss(
        lp,
        COV_OLD,
        COV_ADV,
        torch.ones(2, 2),
        spec=LossSpec(cov_mode="clip_cov", cov_ratio=1e-4, clip_cov_bounds=(1.1, 1.2)),
    )
    assert loss.item() == pytest.approx(-0.27629275, abs=1e-6)
    loss.backward()
    assert lp.grad[1, 1] == 0 and lp.grad[1, 0] != 0 and lp.grad[0, 0] != 0


def test_perception_loss_by_hand():
    from embodied.rl.losses import perception_loss

    lp, masked = torch.tensor([[LN(0.5)]]), torch.tensor([[LN(0.25)]])
    # d = ln 0.25 - ln 0.5 = -ln 2; k3 = e^d - d - 1 = 0.5 + 0.693147 - 1 = 0.193147
    # loss = -0.01 * 0.193147 + 0.03 * 1.0 + 0.03 * 2.0 = 0.08806853
    loss, m = perception_loss(lp, masked, torch.ones(1, 1), 0.01, torch.ones(1, 1), torch.full((1, 1), 2.0))
    assert loss.item() == pytest.approx(0.08806853, abs=1e-7)
    assert m["loss/perception"].item() == pytest.approx(0.193147, abs=1e-6)
    # maximising the divergence: the gradient pushes log pi(real) up where it exceeds the masked one
    lp.requires_grad_(True)
    perception_loss(lp, masked, torch.ones(1, 1), gamma=1.0)[0].backward()
    # d/dlp of -(e^{m - lp} - (m - lp) - 1) = e^{m - lp} - 1 = 0.5 - 1 = -0.5
    assert lp.grad.item() == pytest.approx(-0.5, abs=1e-6)


def test_overlong_penalty_by_hand():
    from embodied.rl.rewards import overlong_penalty

    lengths = torch.tensor([5, 6, 8, 10, 11])
    # soft, max 10, buffer 4: free up to 6, then (6 - L) / 4, -1 past 10
    assert overlong_penalty(lengths, 10, 4).tolist() == [0.0, 0.0, -0.5, -1.0, -1.0]
    # hard (buffer 0): only the over-budget one
    assert overlong_penalty(lengths, 10, 0).tolist() == [0.0, 0.0, 0.0, 0.0, -1.0]
    with pytest.raises(ValueError, match="buffer"):
        overlong_penalty(lengths, 10, 10)


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean", "seq-sum-norm"])
def test_loss_and_gradient_do_not_depend_on_micro_batch_split(agg):
    torch.manual_seed(0)
    B, T = 8, 6
    lp = torch.randn(B, T, dtype=torch.float64)
    old = lp + 0.1 * torch.randn(B, T, dtype=torch.float64)
    ref = lp + 0.1 * torch.randn(B, T, dtype=torch.float64)
    adv = torch.randn(B, dtype=torch.float64)
    mask = (torch.rand(B, T) > 0.3).long()
    mask[:, 0] = 1
    kw = dict(kl_coef=0.04, agg=agg, agg_norm=T, clip_eps_high=0.28, entropy_coef=0.01)
    ent = torch.rand(B, T, dtype=torch.float64)

    full = lp.clone().requires_grad_(True)
    loss_full, _ = grpo_loss(full, old, adv, mask, ref, entropy=ent, spec=LossSpec(**kw))
    loss_full.backward()

    split = lp.clone().requires_grad_(True)
    total = 0.0
    for idx in ([0, 1, 2], [3], [4, 5, 6, 7]):  # uneven micro-batches
        part, _ = grpo_loss(
            split[idx],
            old[idx],
            adv[idx],
            mask[idx],
            ref[idx],
            entropy=ent[idx],
            num_seqs=B,
            num_tokens=int(mask.sum()),
            spec=LossSpec(**kw),
        )
        part.backward()
        total += part.item()
    assert total == pytest.approx(loss_full.item(), abs=1e-12)
    assert torch.allclose(split.grad, full.grad, atol=1e-12)


def test_papo_masks_whole_patches_with_black():
    from embodied.rl.papo import mask_patches, patch_mask

    grid = torch.tensor([[2, 2, 3], [1, 2, 2]])  # video 0: 2 temporal patches of 2x3; video 1: 1 of 2x2
    g = torch.Generator().manual_seed(0)
    m = patch_mask(grid, 0.5, consistent=True, generator=g)
    assert m.shape == (2 * 6 + 4,)
    assert torch.equal(m[:6], m[6:12])  # the same spatial positions in both temporal patches
    m_ind = patch_mask(grid, 0.5, consistent=False, generator=torch.Generator().manual_seed(3))
    assert not torch.equal(m_ind[:6], m_ind[6:12])  # drawn anew (seed chosen so they differ)
    assert patch_mask(grid, 0.0, False).sum() == 0 and patch_mask(grid, 1.0, False).all()
    pix = torch.randn(16, 3 * 2 * 2 * 2)  # C=3, Tp=2, P=2
    black = torch.tensor([-1.0, -2.0, -3.0])
    out = mask_patches(pix, m, black)
    # a masked row is channel 0's value x 8, then channel 1's x 8, then channel 2's x 8 (layout C, Tp, P, P)
    row = out[m.nonzero()[0, 0]]
    assert torch.equal(row, torch.tensor([-1.0] * 8 + [-2.0] * 8 + [-3.0] * 8))
    assert torch.equal(out[~m], pix[~m])


# --- the sampler/trainer correction: importance weights against a rollout engine's log-probs ----------


def _engine_example():
    """Three rows, 6 loss tokens; gaps d = logp_old - logp_engine chosen so every ratio is a round number.
    Past the mask the gaps are garbage (+5, and an old log-prob of -inf) that must change nothing."""
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]])
    engine = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -0.3, 0.0], [-0.7, 0.0, 0.0]], dtype=torch.float64)
    d = torch.tensor([[LN(2), LN(4), -LN(4)], [LN(2), LN(2), 5.0], [-LN(4), 0.0, 0.0]], dtype=torch.float64)
    old = engine + d
    old[2, 1] = -math.inf
    return old, engine, mask


def test_engine_is_weights_per_token_by_hand():
    from embodied.rl.losses import engine_is_weights

    old, engine, mask = _engine_example()
    # token ratios r_t = exp(d_t): row 0 [2, 4, 0.25], row 1 [2, 2], row 2 [0.25]; mean 10.5 / 6 = 1.75, max 4
    w, s = engine_is_weights(old, engine, mask, "token_truncate", cap=3.0)
    # truncated IS: min(r, 3) -> [2, 3, 0.25], [2, 2, 0], [0.25, 0, 0] (0 past the mask); 1 of 6 truncated
    want = torch.tensor([[2.0, 3.0, 0.25], [2.0, 2.0, 0.0], [0.25, 0.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(w, want, atol=1e-12)
    assert s["rollout/is_ratio_mean"].item() == pytest.approx(1.75, abs=1e-12)
    assert s["rollout/is_ratio_max"].item() == pytest.approx(4.0, abs=1e-12)
    assert s["rollout/is_weight_mean"].item() == pytest.approx(9.5 / 6, abs=1e-12)
    assert s["rollout/is_truncated_frac"].item() == pytest.approx(1 / 6, abs=1e-12)
    # masked IS in [0.5, 3]: 4 (above the cap) and the two 0.25 (below the floor) get 0; 3 of 6 masked
    w, s = engine_is_weights(old, engine, mask, "token_mask", cap=3.0, floor=0.5)
    want = torch.tensor([[2.0, 0.0, 0.0], [2.0, 2.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(w, want, atol=1e-12)
    assert s["rollout/is_masked_frac"].item() == pytest.approx(0.5, abs=1e-12)
    assert s["rollout/is_weight_mean"].item() == pytest.approx(1.0, abs=1e-12)
    # without a floor (TRL's default) only the 4 is masked
    _, s = engine_is_weights(old, engine, mask, "token_mask", cap=3.0)
    assert s["rollout/is_masked_frac"].item() == pytest.approx(1 / 6, abs=1e-12)


def test_engine_is_weights_per_sequence_by_hand():
    from embodied.rl.losses import engine_is_weights

    old, engine, mask = _engine_example()
    # r = exp(sum of the row's gaps over its mask) = product of its token ratios: 2 * 4 * 0.25 = 2, 2 * 2 = 4
    # (the +5 past the mask left out), 0.25; over rows: mean 6.25 / 3, max 4
    w, s = engine_is_weights(old, engine, mask, "sequence_truncate", cap=3.0)
    want = torch.tensor([[2.0, 2.0, 2.0], [3.0, 3.0, 0.0], [0.25, 0.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(w, want, atol=1e-12)  # min(r, 3) on every token of the row
    assert s["rollout/is_ratio_mean"].item() == pytest.approx(6.25 / 3, abs=1e-12)
    assert s["rollout/is_ratio_max"].item() == pytest.approx(4.0, abs=1e-12)
    assert s["rollout/is_weight_mean"].item() == pytest.approx(5.25 / 3, abs=1e-12)
    assert s["rollout/is_truncated_frac"].item() == pytest.approx(1 / 3, abs=1e-12)
    # masked in [0.5, 3]: row 1 (4) and row 2 (0.25) drop out whole
    w, s = engine_is_weights(old, engine, mask, "sequence_mask", cap=3.0, floor=0.5)
    want = torch.tensor([[2.0, 2.0, 2.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(w, want, atol=1e-12)
    assert s["rollout/is_masked_frac"].item() == pytest.approx(2 / 3, abs=1e-12)
    assert s["rollout/is_weight_mean"].item() == pytest.approx(2 / 3, abs=1e-12)
    _, s = engine_is_weights(old, engine, mask, "sequence_mask", cap=3.0)  # no floor: row 2 keeps 0.25
    assert s["rollout/is_masked_frac"].item() == pytest.approx(1 / 3, abs=1e-12)
    with pytest.raises(ValueError, match="token_truncate"):
        engine_is_weights(old, engine, mask, "sequence")


def test_engine_is_weights_bounds_are_inclusive_and_a_faithful_engine_weighs_one():
    from embodied.rl.losses import IS_CORRECTIONS, engine_is_weights

    lp = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1], [1, 0]])
    for mode in IS_CORRECTIONS[1:]:  # r = exp(0) = 1 exactly: kept with cap = floor = 1 (floor <= r <= cap)
        w, s = engine_is_weights(lp, lp.clone(), mask, mode, cap=1.0, floor=1.0)
        assert torch.equal(w, mask.to(w.dtype)), mode
        frac = [v for k, v in s.items() if k.endswith("_frac")]
        assert frac == [0.0] and s["rollout/is_ratio_max"].item() == 1.0
    # just past either bound is masked (and, above the cap, truncated to it)
    w, _ = engine_is_weights(lp + 1e-9, lp, mask, "token_mask", cap=1.0)
    assert w.abs().sum().item() == 0.0
    w, _ = engine_is_weights(lp - 1e-9, lp, mask, "token_mask", cap=3.0, floor=1.0)
    assert w.abs().sum().item() == 0.0
    w, _ = engine_is_weights(lp + 1e-9, lp, mask, "token_truncate", cap=1.0)
    assert torch.equal(w, mask.to(w.dtype))
    # a huge gap is bounded before the exp: no inf in the statistics, the same weight at the cap
    w, s = engine_is_weights(lp + 100.0, lp, mask, "sequence_truncate", cap=3.0)
    assert math.isfinite(s["rollout/is_ratio_max"].item()) and w.max().item() == 3.0


def test_engine_is_weights_statistics_add_up_over_micro_batches():
    from embodied.rl.losses import engine_is_weights

    torch.manual_seed(0)
    B, T = 7, 5
    engine = -torch.rand(B, T, dtype=torch.float64) * 3
    old = engine + 0.6 * torch.randn(B, T, dtype=torch.float64)
    mask = (torch.rand(B, T) > 0.3).long()
    mask[:, 0] = 1
    for mode in ("token_truncate", "sequence_mask"):
        w_full, s_full = engine_is_weights(old, engine, mask, mode, cap=1.5, floor=0.7)
        sums, top, parts = {}, -math.inf, []
        for idx in ([0, 1], [2], [3, 4, 5, 6]):
            w, s = engine_is_weights(old[idx], engine[idx], mask[idx], mode, 1.5, 0.7, B, int(mask.sum()))
            parts.append(w)
            top = max(top, s.pop("rollout/is_ratio_max").item())
            sums = {k: sums.get(k, 0.0) + v.item() for k, v in s.items()}
        assert torch.equal(torch.cat(parts), w_full)
        assert top == s_full.pop("rollout/is_ratio_max").item()
        assert sums == pytest.approx({k: v.item() for k, v in s_full.items()}, abs=1e-12)


def test_grpo_loss_weights_only_the_policy_term_by_hand():
    logprobs, old, adv, mask = _hand_example()
    # per-token policy losses (test_grpo_loss_by_hand): row 0 [-1.2, -1.0, -0.5], row 1 [2.2, 1.6]
    # weights [2, 1, 0] and [0.5, 1] (9 past the mask): row 0 (-2.4 - 1.0) / 3, row 1 (1.1 + 1.6) / 2
    w = torch.tensor([[2.0, 1.0, 0.0], [0.5, 1.0, 9.0]], requires_grad=True)
    want = (-3.4 / 3 + 2.7 / 2) / 2  # 0.108333
    loss, m = grpo_loss(logprobs, old, adv, mask, spec=LossSpec(clip_eps=0.2), is_weight=w)
    assert loss.item() == pytest.approx(want, abs=1e-6)
    # the KL term is not weighted: the same k3 as in test_grpo_loss_with_k3_kl_by_hand is added whole
    d = torch.tensor([[0.0, LN(2.0), -LN(2.0)], [LN(2.0), 0.0, 3.0]])
    kl_expected = (0.5 / 3 + (1 - LN(2.0)) / 2) / 2
    spec = LossSpec(clip_eps=0.2, kl_coef=0.1)
    lp = logprobs.clone().requires_grad_(True)
    loss, m = grpo_loss(lp, old, adv, mask, ref_logprobs=logprobs + d, spec=spec, is_weight=w)
    assert loss.item() == pytest.approx(want + 0.1 * kl_expected, abs=1e-6)
    assert m["loss/kl"].item() == pytest.approx(kl_expected, abs=1e-6)
    loss.backward()
    assert w.grad is None and lp.grad is not None  # the weight carries no gradient
    # None: bit for bit the loss without a correction
    a, _ = grpo_loss(logprobs, old, adv, mask, spec=spec, ref_logprobs=logprobs + d)
    b, _ = grpo_loss(logprobs, old, adv, mask, spec=spec, ref_logprobs=logprobs + d, is_weight=None)
    assert torch.equal(a, b)
