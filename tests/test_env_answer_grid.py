"""`env.answer=grid`: numeric tasks asked as lettered options, parsed back to actions that MuJoCo executes.

Real MuJoCo on the CPU backend; records only (``num_frames=0``) where no clip is needed, to stay fast.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from embodied.envs import (
    answer_examples,
    answer_form,
    answer_text,
    carry,
    execute,
    parse,
    place,
    push,
    random_answer,
    task_answer_form,
)
from embodied.envs.reward import env_reward, unparseable_penalty
from embodied.eval.env_baselines import best_constant
from embodied.eval.env_stats import vote_action
from embodied.questions import LETTERS, format_question


def _answer(x: str) -> str:
    return f"<think>physics</think><answer>{x}</answer>"


def _records(mod, seeds, difficulty="hard") -> list[dict]:
    return [mod.make_episode(s, difficulty, num_frames=0)[0] for s in seeds]


def test_grid_form_asks_letters_and_parses_back_to_the_action():
    for mod in (carry, push):
        record = _records(mod, [5])[0]
        grid = answer_form(record, "grid")
        _, options = mod.answer_grid(record)
        assert grid["options"] == [t for _, t in options] and len(grid["options"]) == 8
        assert "letter of the correct option" in format_question(grid["question"], grid["options"])
        assert "<answer>0.35</answer>" not in grid["question"] and "12.5" not in grid["question"]
        for k, (action, _) in enumerate(options):
            assert parse(grid, _answer(LETTERS[k])) == action
            assert answer_text(mod.NAME, action, grid).endswith(f"<answer>{LETTERS[k]}</answer>")
        assert parse(grid, _answer("I")) is None  # only eight options
        assert parse(grid, _answer("0.35")) is None and parse(grid, _answer("12.5, 0.2")) is None
        assert parse(record, _answer("C")) is None, "the number form still wants numbers"
        assert answer_form(grid, "grid") == grid and answer_form(grid, "number") == record
        assert "answer_grid" not in record["meta"], "the input record is not modified"
        rng = np.random.default_rng(0)
        assert all(parse(grid, random_answer(grid, rng)) is not None for _ in range(20))
    lettered = _records(place, [5])[0]
    assert answer_form(lettered, "grid") is lettered and answer_form(lettered, "number") is lettered
    with pytest.raises(ValueError, match="env.answer"):
        answer_form(lettered, "numbers")


def test_answer_form_per_task():
    pushed, carried = _records(push, [3])[0], _records(carry, [3])[0]
    for spec in ("push=grid", " push = grid , carry=number"):
        assert "answer_grid" in answer_form(pushed, spec)["meta"]
        assert answer_form(carried, spec) == carried, "a task not named (or named number) stays a number"
    both = "push=grid,carry=grid"
    assert all("answer_grid" in answer_form(r, both)["meta"] for r in (pushed, carried))
    assert task_answer_form("grid", "carry") == "grid" and task_answer_form("push=grid", "carry") == "number"
    for bad, why in (("push=grids", "task=form pairs"), ("push", "task=form pairs"), ("shove=grid", "shove")):
        with pytest.raises(ValueError, match=why):
            answer_form(pushed, bad)


def test_push_options_are_multiples_of_the_stated_demo_impulse():
    record = _records(push, [11])[0]
    demo = record["meta"]["scene"]["demo_impulse"]
    actions = [a for a, _ in push.answer_grid(record)[1]]
    assert actions == sorted(actions) and len(set(actions)) == len(actions)
    assert actions == pytest.approx([min(1.0, r * demo) for r in push.GRID_RATIOS], abs=1e-4)


def test_a_letter_executes_the_same_physics_as_its_numbers():
    records = _records(carry, [1, 2]) + _records(push, [3])
    grids = [answer_form(r, "grid") for r in records]
    letters = ["B", "H", "D"]
    by_letter = env_reward([_answer(x) for x in letters], grids)
    for terms, rec, grid, x in zip(by_letter, records, grids, letters):
        action = parse(grid, _answer(x))
        assert terms["reward/total"] == pytest.approx(execute(rec, action)["reward/total"] + 0.2)
    bad = env_reward([_answer("2, 0.4")], grids[:1])[0]
    assert bad["reward/unparseable"] == 1 and bad["reward/total"] == -unparseable_penalty()


def test_carry_grid_holds_a_sound_option_for_every_material():
    """Each material has an option that lifts it on hard episodes, and no one option suits them all: the
    grid can be learned only by reading the material from the clip."""
    seeds = {}
    for s in range(200):  # one hard episode per material
        rec = _records(carry, [s])[0]
        seeds.setdefault(rec["meta"]["scene"]["material"], rec)
        if len(seeds) == len(carry.MATERIALS):
            break
    wins = {}
    for material, rec in seeds.items():
        grid = answer_form(rec, "grid")
        terms = env_reward([_answer(LETTERS[k]) for k in range(8)], [grid] * 8)
        wins[material] = {k for k, t in enumerate(terms) if t["reward/success"]}
        assert wins[material], f"no option lifts {material}"
    assert not set.intersection(*wins.values()), "one constant option would suit every material"


def test_best_constant_tries_letters_too_and_reports_both():
    records = [answer_form(r, "grid") for r in _records(push, range(6))]
    out = best_constant(records)["push"]
    assert set(out) >= {"number", "grid", "answer", "success", "ci95"}
    assert out["success"] == max(out["number"]["success"], out["grid"]["success"])
    assert out["grid"]["answer"].startswith("option ")


def test_answer_examples_and_vote_on_grid_records():
    @dataclasses.dataclass
    class Ex:
        record: dict

    mcq = {"task": "arrow_of_time", "question": "q", "options": ["a", "b"], "answer": "A", "meta": {}}
    examples = answer_examples([Ex(_records(push, [2])[0]), Ex(mcq)], "grid")
    assert examples[0].record["options"] and examples[1].record is mcq
    # a grid question votes for the most frequent option, not the median impulse
    assert vote_action("push", [0.1, 0.5, 0.5, None], lettered=True) == 0.5
    assert vote_action("push", [0.1, 0.2, 0.5], lettered=False) == pytest.approx(0.2)


def test_spread_of_grid_answers_counts_letters_not_actions():
    """On push's options, relative to each episode's demo, one letter is one answer (its impulses differ),
    and choosing the option nearest to the impulse physics calls for correlates with it."""
    from embodied.eval.env_stats import action_spread

    records = {r["id"]: r for r in (answer_form(r | {"id": f"p{i}"}, "grid") for i, r in enumerate(
        _records(push, range(8))))}  # fmt: skip
    constant = [{"id": i, "task": "push", "response": _answer("D")} for i in records]
    spread = action_spread(constant, records)
    assert spread["distinct"] == 1 and spread["entropy_bits"] == 0 and spread["corr_decisive"] != spread[
        "corr_decisive"]  # fmt: skip

    def nearest(rec):
        need = push.decisive(rec)
        actions = [parse(rec, _answer(x)) for x in LETTERS[:8]]
        return LETTERS[int(np.argmin([abs(np.log(a / need)) for a in actions]))]

    reading = [{"id": i, "task": "push", "response": _answer(nearest(r))} for i, r in records.items()]
    spread = action_spread(reading, records)
    assert spread["distinct"] > 1 and spread["corr_decisive"] == pytest.approx(1.0)
