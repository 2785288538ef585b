"""Evaluation numbers, worked by hand: Wilson interval, unbiased pass@k, majority vote (cons@k), the
per-family / per-tier summary with views, and the markdown table."""

from __future__ import annotations

import itertools
import math

import pytest

from embodied.eval.stats import (
    majority_vote,
    markdown_table,
    pass_at_k,
    prediction_stats,
    resolve_k,
    wilson_interval,
)


def test_wilson_hand_worked():
    # 5/10, z = 1.96: denom = 1 + 3.8416/10 = 1.38416, centre = (0.5 + 0.19208)/1.38416 = 0.5,
    # half = 1.96 * sqrt(0.025 + 0.009604) / 1.38416 = 0.26341.
    lo, hi = wilson_interval(5, 10)
    assert lo == pytest.approx(0.23659, abs=1e-5) and hi == pytest.approx(0.76341, abs=1e-5)
    # 0/20: the interval is [0, z^2 / (n + z^2)] = [0, 3.8416 / 23.8416].
    lo, hi = wilson_interval(0, 20)
    assert lo == pytest.approx(0.0, abs=1e-12) and hi == pytest.approx(3.8416 / 23.8416, abs=1e-9)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_pass_at_k_hand_worked():
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10.
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    # n=10, c=3, k=5: 1 - C(7,5)/C(10,5) = 1 - 21/252 = 0.91667.
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)  # pass@1 is the share correct
    assert pass_at_k(3, 2, 2) == 1.0  # only one wrong sample: every pair holds a right one
    assert pass_at_k(6, 0, 3) == 0.0
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(2, 1, 3)


def test_pass_at_k_equals_enumeration_of_subsets():
    """The closed form is the share of k-subsets of the n samples holding a correct one."""
    for n in range(1, 7):
        for c in range(n + 1):
            correct = [True] * c + [False] * (n - c)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(correct, k))
                brute = sum(any(s) for s in subsets) / len(subsets)
                assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12), (n, c, k)


def test_majority_vote_ties_and_unparseable():
    assert majority_vote(["A", "B", "B"]) == "B"
    assert majority_vote(["A", "B"]) == "A"  # tie: the one sampled first
    assert majority_vote(["B", "A"]) == "B"
    assert majority_vote(["B", None, "A", "A", "B"]) == "B"  # 2-2 tie, B came first
    assert majority_vote([None, None, "C"]) == "C"  # unparseable samples do not vote
    assert majority_vote([None, None]) is None
    assert majority_vote([]) is None


def test_resolve_k():
    assert resolve_k(0, [1, 4]) == []
    assert resolve_k(8, []) == [1, 8]
    assert resolve_k(1, []) == [1]
    assert resolve_k(8, [4, 1, 4]) == [1, 4]
    with pytest.raises(ValueError, match=r"eval\.k"):
        resolve_k(4, [1, 8])


def _row(qid, family, tier, answer, predicted, choice=None, sampled=None, n_options=2, view=0):
    row = {
        "id": qid,
        "family": family,
        "difficulty": tier,
        "n_options": n_options,
        "view": view,
        "answer": answer,
        "predicted": predicted,
        "response": "",
        "choice": choice,
    }
    if sampled is not None:
        row["sampled"] = sampled
    return row


def test_summarize_families_tiers_views_and_samples():
    rows = [
        # family f (2 options): q1 easy right; q2 hard wrong; q3 easy, two views: one right, one unparseable.
        _row("q1", "f", "easy", "A", "A", "A", ["A", "B", "A"]),
        _row("q2", "f", "hard", "B", "A", "B", ["A", "A", None]),
        _row("q3", "f", "easy", "A", "A", "A", ["B", "B", "A"], view=0),
        _row("q3", "f", "easy", "A", None, "B", ["A", None, "A"], view=1),
        # family g (4 options), no tier: right.
        _row("q4", "g", None, "C", "C", "C", ["C", "C", "D"], n_options=4),
    ]
    res = prediction_stats(rows, k=[1, 2])
    # Per question: q1 1, q2 0, q3 (1 + 0)/2 = 0.5, q4 1 -> 2.5 / 4.
    assert res["n"] == 4 and res["accuracy"] == pytest.approx(2.5 / 4)
    assert res["ci95"] == pytest.approx(list(wilson_interval(2.5, 4)))
    assert res["chance"] == pytest.approx((0.5 + 0.5 + 0.5 + 0.25) / 4)
    assert res["unparseable"] == pytest.approx((0 + 0 + 0.5 + 0) / 4)
    assert res["choice_accuracy"] == pytest.approx((1 + 1 + 0.5 + 1) / 4)
    # pass@1 = c/n per view: q1 2/3, q2 0, q3 (1/3 + 2/3)/2 = 1/2, q4 2/3.
    assert res["pass@1"] == pytest.approx((2 / 3 + 0 + 0.5 + 2 / 3) / 4)
    # pass@2 with n=3: c=2 -> 1; c=0 -> 0; q3 views c=1 -> 1 - C(2,2)/C(3,2) = 2/3 and c=2 -> 1; q4 c=2 -> 1.
    assert res["pass@2"] == pytest.approx((1 + 0 + (2 / 3 + 1) / 2 + 1) / 4)
    # cons@2 votes the first two samples: q1 [A,B] tie -> A right; q2 [A,A] wrong;
    # q3 [B,B] wrong and [A,None] -> A right; q4 [C,C] right.
    assert res["cons@2"] == pytest.approx((1 + 0 + 0.5 + 1) / 4)
    assert res["cons@1"] == pytest.approx((1 + 0 + 0.5 + 1) / 4)  # first samples: A, A, (B, A), C
    assert res["chance_pass@2"] == pytest.approx((0.75 * 3 + (1 - 0.75**2)) / 4)
    assert res["unparseable_samples"] == pytest.approx((0 + 1 / 3 + (0 + 1 / 3) / 2 + 0) / 4)

    assert list(res["per_family"]) == ["f", "g"]
    assert res["per_family"]["f"]["n"] == 3 and res["per_family"]["f"]["accuracy"] == pytest.approx(1.5 / 3)
    assert res["per_family"]["g"]["chance"] == pytest.approx(0.25)
    tiers = res["per_family_tier"]["f"]
    assert list(tiers) == ["easy", "hard"]  # easy < medium < hard, then the rest alphabetically
    assert tiers["easy"]["n"] == 2 and tiers["easy"]["accuracy"] == pytest.approx(0.75)
    assert tiers["hard"]["accuracy"] == 0.0
    assert list(res["per_family_tier"]["g"]) == ["unspecified"]


def test_summarize_old_call_without_option_counts_in_rows():
    """`prediction_stats(rows, n_options)` as before: rows without `n_options` take it from the mapping."""
    rows = [{"id": "a", "family": "t", "answer": "A", "predicted": "A", "choice": None}]
    res = prediction_stats(rows, {"a": 3})
    assert res["chance"] == pytest.approx(1 / 3) and res["accuracy"] == 1.0
    assert "choice_accuracy" not in res and "pass@1" not in res


def test_markdown_table_rows_and_columns():
    rows = [
        _row("q1", "f", "easy", "A", "A", "A", ["A", "B"]),
        _row("q2", "f", "hard", "B", None, "A", ["B", "B"]),
        _row("q3", "g", "medium", "A", "B", "B", ["A", "A"]),
    ]
    table = markdown_table(prediction_stats(rows, k=[1, 2]), "demo")
    lines = table.strip().splitlines()
    assert lines[0] == "### demo"
    head = [c.strip() for c in lines[2].strip("|").split("|")]
    assert head == [
        "family",
        "tier",
        "n",
        "accuracy [95% CI]",
        "chance",
        "unparseable",
        "forced choice",
        "pass@1",
        "cons@1",
        "pass@2",
        "cons@2",
    ]
    body = [[c.strip() for c in line.strip("|").split("|")] for line in lines[4:]]
    assert [r[:3] for r in body] == [
        ["**all**", "all", "3"],
        ["f", "all", "2"],
        ["f", "easy", "1"],
        ["f", "hard", "1"],
        ["g", "all", "1"],
        ["g", "medium", "1"],
    ]
    lo, hi = wilson_interval(1, 3)
    assert body[0][3] == f"0.333 [{lo:.3f}, {hi:.3f}]" and body[0][5] == "33.3%"
    assert body[3][7:] == ["1.000", "1.000", "1.000", "1.000"]  # q2 sampled B, B: right both times
    assert not math.isnan(float(body[0][6]))


def test_forced_choice_answers_where_the_model_answers():
    from embodied.eval.answerer import choice_prefix

    response = "<think>falls, then rests</think> <answer>B</answer>"
    assert choice_prefix(response) == "<think>falls, then rests</think> "
    assert choice_prefix("<think></think><answer>") == "<think></think>"
    assert choice_prefix("no tags at all") == "<think></think>"  # the SFT target's shape


def test_mcq_settings_come_from_the_config_and_the_old_keywords_are_refused():
    from embodied.config import load_config
    from embodied.eval.loop import MCQEval, evaluate
    from embodied.video import VideoConfig

    over = ["seed=7", "eval.batch_size=3", "eval.max_new_tokens=9", "eval.choice=false", "eval.samples=4"]
    over += ["eval.k=[1,4]", "eval.temperature=0.7", "eval.baseline=blind", "eval.media=images"]
    how = MCQEval.of(load_config(None, overrides=over), progress=False, desc="test")
    assert how == MCQEval(3, 9, False, False, "test", "blind", 4, [1, 4], 0.7, 7, "images")
    assert MCQEval.of(load_config(None)) == MCQEval(k=[])  # the defaults agree with the config's
    for old in ({"max_new_tokens": 8}, {"choice": False}, {"progress": False}):  # all go through MCQEval now
        with pytest.raises(TypeError, match="unexpected keyword argument"):
            evaluate(None, None, [], VideoConfig(), **old)
