"""Partial credit on ordering questions (`grpo.order_credit`, Visual Jigsaw's graded reward): numbers worked
out by hand in the comments; `reward/accuracy` stays the exact letter match."""

from __future__ import annotations

import numpy as np
import pytest

from embodied.config import GRPOConfig, load_config
from embodied.rl.rewards import (
    mcq_reward,
    mcq_rewards,
    mean_terms,
    option_orders,
    order_credit_reward,
    partial_order_credit,
    routed_rewards,
)

# A 3-segment temporal puzzle whose right order is A = 2, 3, 1.
TEMPORAL = {
    "id": "t0",
    "family": "temporal_puzzle",
    "question": "...",
    "options": ["2, 3, 1", "2, 1, 3", "3, 1, 2", "1, 3, 2"],
    "answer": "A",
    "meta": {"segments": 3, "segment_frames": 2},
}


def said(letter: str) -> str:
    return f"<think>x</think><answer>{letter}</answer>"


def test_partial_order_credit_by_hand():
    # 2,1,3 vs 2,3,1: only the first position agrees -> 1/3 of the positions; x 0.2 = 0.0667
    assert partial_order_credit([2, 1, 3], [2, 3, 1], 0.2) == pytest.approx(0.2 / 3, abs=1e-9)
    # 1,2,4,3 vs 3,2,4,1: positions 2 and 3 agree -> 2/4; x 0.2 = 0.1
    assert partial_order_credit([1, 2, 4, 3], [3, 2, 4, 1], 0.2) == pytest.approx(0.1, abs=1e-9)
    # no position agrees -> 0
    assert partial_order_credit([3, 1, 2], [2, 3, 1], 0.2) == 0.0
    # the right order earns the accuracy reward, not partial credit
    assert partial_order_credit([2, 3, 1], [2, 3, 1], 0.2) == 0.0
    with pytest.raises(ValueError, match="lengths"):
        partial_order_credit([1, 2], [2, 1, 3], 0.2)


def test_the_discount_scales_the_credit():
    # 2 of 4 positions right: the share is 0.5; with discount 0.2 the credit is 0.1 and with 0.5 it is 0.25.
    # A rule that ignored the discount would give 0.5 for both.
    assert partial_order_credit([1, 2, 4, 3], [3, 2, 4, 1], 0.2) == pytest.approx(0.1, abs=1e-9)
    assert partial_order_credit([1, 2, 4, 3], [3, 2, 4, 1], 0.5) == pytest.approx(0.25, abs=1e-9)


def test_mcq_reward_with_order_credit_by_hand():
    orders = option_orders(TEMPORAL)
    assert orders == [[2, 3, 1], [2, 1, 3], [3, 1, 2], [1, 3, 2]]
    # B = 2,1,3: first position right -> credit 0.2/3 = 0.0667; accuracy 0, format 1
    # total = 1.0 * (0 + 0.0667) + 0.5 * 1 = 0.5667
    b = mcq_reward(said("B"), "A", 1.0, 0.5, 0.2, orders)
    assert b["reward/accuracy"] == 0.0
    assert b["reward/order_credit"] == pytest.approx(0.0667, abs=1e-4)
    assert b["reward/total"] == pytest.approx(0.5667, abs=1e-4)
    # the credit is a share of the accuracy reward: accuracy_weight 2 -> 2 * 0.0667 + 0.5 = 0.6333
    assert mcq_reward(said("B"), "A", 2.0, 0.5, 0.2, orders)["reward/total"] == pytest.approx(
        0.6333, abs=1e-4
    )
    # C = 3,1,2 agrees nowhere with 2,3,1 -> no credit: total = 0.5 (format only)
    assert mcq_reward(said("C"), "A", 1.0, 0.5, 0.2, orders)["reward/total"] == pytest.approx(0.5, abs=1e-9)
    # D = 1,3,2: the second position agrees -> 0.0667 again
    d = mcq_reward(said("D"), "A", 1.0, 0.5, 0.2, orders)
    assert d["reward/order_credit"] == pytest.approx(0.0667, abs=1e-4)
    # the right letter: accuracy 1, credit 0, total 1 + 0.5 = 1.5 (never more than exact match)
    a = mcq_reward(said("A"), "A", 1.0, 0.5, 0.2, orders)
    assert (a["reward/accuracy"], a["reward/order_credit"], a["reward/total"]) == (1.0, 0.0, 1.5)


@pytest.mark.parametrize(
    "text",
    [
        "<think>x</think><answer></answer>",  # empty
        "<think>x</think> B",  # missing
        "<think>x</think><answer>B</answer><answer>B</answer>",  # duplicated
        "<think>x</think><answer>B, D</answer>",  # two letters
        said("E"),  # names no option
        said("2, 1"),  # part of an order (a whole option's order counts as that option: test_rl)
    ],
)
def test_unusable_answers_earn_no_credit(text: str):
    assert order_credit_reward(text, "A", option_orders(TEMPORAL), 0.2) == 0.0
    terms = mcq_reward(text, "A", 1.0, 0.5, 0.2, option_orders(TEMPORAL))
    assert terms["reward/order_credit"] == 0.0
    assert terms["reward/accuracy"] == 0.0


def test_off_by_default_and_exact_match_unchanged():
    assert GRPOConfig().order_credit == 0.0
    assert load_config(overrides=["grpo.order_credit=0.2"]).grpo.order_credit == 0.2
    off = mcq_rewards()([said("B")], [TEMPORAL])[0]
    assert "reward/order_credit" not in off
    assert off["reward/total"] == 0.5  # format only: a wrong letter earns nothing for accuracy
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="order_credit"):
            mcq_rewards(order_credit=bad)


def test_other_families_are_unchanged():
    arrow = {
        "id": "a",
        "family": "arrow_of_time",
        "options": ["forward", "reversed"],
        "answer": "A",
        "meta": {},
    }
    patch = {
        "id": "p",
        "family": "spatial_puzzle",
        "options": ["top left", "top right", "bottom left", "bottom right"],
        "answer": "C",
        "meta": {"variant": "patch", "grid": 2},
    }
    assert option_orders(arrow) is None and option_orders(patch) is None
    on, off = mcq_rewards(1.0, 0.5, 0.2), mcq_rewards(1.0, 0.5)
    texts, records = [said("B"), said("A")], [arrow, patch]
    for t_on, t_off in zip(on(texts, records), off(texts, records)):
        assert t_on["reward/order_credit"] == 0.0
        assert t_on["reward/total"] == t_off["reward/total"] == 0.5


def test_batch_metrics_keep_accuracy_exact():
    # one group answering A (right), B, C, D: exact accuracy 1/4 = 0.25;
    # credit (0 + 0.0667 + 0 + 0.0667) / 4 = 0.0333; total (1.5 + 0.5667 + 0.5 + 0.5667) / 4 = 0.7833
    texts = [said(x) for x in "ABCD"]
    for fn in (mcq_rewards(1.0, 0.5, 0.2), routed_rewards(order_credit=0.2)):
        means = mean_terms(fn(texts, [TEMPORAL] * 4))
        assert means["reward/accuracy"] == 0.25
        assert means["reward/order_credit"] == pytest.approx(0.0333, abs=1e-4)
        assert means["reward/total"] == pytest.approx(0.7833, abs=1e-4)


def test_generated_puzzles_are_ordering_questions():
    """Records made by the family generators themselves: their options parse as orders and the right letter
    earns accuracy, never credit; every wrong one earns at most 0.2 x (k-1)/k."""
    from embodied.questions import spatial_puzzle, temporal_puzzle

    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (8, 32, 32, 3), dtype=np.uint8)
    fields, _ = temporal_puzzle.shuffle_clip(frames, rng, 2, "hard")
    image = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
    spatial, _ = spatial_puzzle.puzzle(image, rng, 1, "easy", "arrangement")
    for rec in ({"family": "temporal_puzzle", **fields}, {"family": "spatial_puzzle", **spatial}):
        orders = option_orders(rec)
        assert orders is not None and all(sorted(o) == list(range(1, len(o) + 1)) for o in orders)
        terms = mcq_rewards(1.0, 0.5, 0.2)([said(x) for x in "ABCD"], [rec] * 4)
        right = "ABCD".index(rec["answer"])
        for i, t in enumerate(terms):
            assert t["reward/accuracy"] == (i == right)
            assert 0.0 <= t["reward/order_credit"] <= 0.2 * 3 / 4 + 1e-9
            assert t["reward/order_credit"] == 0.0 or i != right


def test_answer_reading_script_scores_both_readings():
    """`docs/results/scripts/answer_reading.py` scores the same responses exactly and by the nearest option,
    and refuses predictions whose answers disagree with the split (ids repeat across datasets)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "answer_reading",
        Path(__file__).resolve().parents[1] / "docs" / "results" / "scripts" / "answer_reading.py",
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    arrow = {"id": "a0", "family": "arrow_of_time", "options": ["forward", "backward"], "answer": "B"}
    questions = {"t0": TEMPORAL, "a0": arrow}
    rows = [
        {"id": "t0", "answer": "A", "response": said("3, 3, 1")},  # no option; nearest A (2 of 3 places)
        {"id": "a0", "answer": "B", "response": said("B")},
    ]
    table = script.reading_table(rows, questions)
    assert (table["all"]["exact"], table["all"]["nearest"]) == (0.5, 1.0)
    assert table["temporal_puzzle"]["order_not_an_option"] == 1.0
    assert table["temporal_puzzle"]["tie_share_of_those"] == 0.0
    assert table["arrow_of_time"]["ordering_n"] == 0
    word = script.reading_table([{"id": "t0", "response": said("E")}], questions)["temporal_puzzle"]
    assert (word["order_not_an_option"], word["tie_share_of_those"]) == (0.0, None)  # a letter is no order
    tie = [{"id": "t0", "response": said("1, 2, 3")}]  # one place with B and with D: a tie
    assert script.reading_table(tie, questions)["all"]["nearest"] == 0.0
    with pytest.raises(ValueError, match="another dataset"):
        script.reading_table([{"id": "t0", "answer": "C", "response": said("C")}], questions)
    # a response without an answer block counts in n and chooses nothing under either reading
    table = script.reading_table([{"id": "t0", "response": "<think>x</think>"}], questions)
    assert (table["all"]["exact"], table["all"]["nearest"], table["all"]["order_not_an_option"]) == (0, 0, 0)
    # object permanence gets a group per question form and outcome; the most chosen option shows a constant
    perm = {
        "id": "p0",
        "family": "object_permanence",
        "options": ["possible", "vanished", "elsewhere", "changed"],
        "answer": "B",
        "meta": {"difficulty": "easy", "variant": "outcome", "outcome": "vanished"},
    }
    questions["p0"] = perm
    table = script.reading_table(
        [{"id": "p0", "response": said("A")}, {"id": "a0", "response": said("A")}], questions
    )
    assert table["object_permanence/outcome/vanished"]["n"] == 1
    assert (table["all"]["top_choice"], table["all"]["top_choice_share"]) == ("A", 1.0)
    # over runs (seeds): means with intervals, and nearest minus exact paired by run
    runs = [script.reading_table(rows, questions), script.reading_table(tie + rows[1:], questions)]
    summary = script.seed_summary(runs)
    assert summary["temporal_puzzle"]["nearest"][0] == 0.5  # 1.0 and 0.0
    assert summary["temporal_puzzle"]["nearest_minus_exact"][0] == 0.5  # +1 and 0
    assert summary["arrow_of_time"]["exact"] == (1.0, 1.0, 1.0)
