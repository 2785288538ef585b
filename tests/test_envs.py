"""Interactive tasks: each reward responds to physics, answers are parsed strictly, errors are loud.

Real MuJoCo on the CPU backend; the Warp parity check is `slow` (Warp compiles its kernels first).
"""

from __future__ import annotations

import numpy as np
import pytest

from embodied.envs import TASKS, carry, execute, place, push, task
from embodied.envs.backend import simulate_jobs
from embodied.envs.core import EnvError
from embodied.envs.reward import env_reward, unparseable_penalty


def _answer(x: str) -> str:
    return f"<think>physics</think><answer>{x}</answer>"


@pytest.fixture(scope="module")
def episodes():
    return {name: task(name).make_episode(3, "easy") for name in TASKS}


def test_episode_record_and_clip(episodes):
    for name, (record, frames) in episodes.items():
        assert record["task"] == name and record["answer"] == "" and record["meta"]["seed"] == 3
        assert frames.shape == (4, 112, 112, 3) and frames.dtype == np.uint8
        assert frames.std() > 10, f"{name}: the clip is blank"
        again, frames2 = task(name).make_episode(3, "easy")
        assert again == record and np.array_equal(frames, frames2), f"{name} is not reproducible"
    assert len(episodes["place"][0]["options"]) == 5
    assert episodes["carry"][0]["options"] == [] and episodes["push"][0]["options"] == []


def test_push_demo_clip_shows_the_puck_sliding(episodes):
    _, frames = episodes["push"]
    assert np.abs(frames[1].astype(int) - frames[0]).sum() > 0  # the demo moves


def test_place_good_and_bad_block(episodes):
    record, _ = episodes["place"]
    margins = record["meta"]["static_margins"]
    good, bad = int(np.argmax(margins)), int(np.argmin(margins))
    assert margins[good] > 0 > margins[bad]
    ok, fell = execute(record, good), execute(record, bad)
    assert ok["reward/success"] == 1 and ok["reward/toppled"] == 0 and ok["reward/standing"] == 1
    assert fell["reward/success"] == 0 and fell["reward/toppled"] == -1 and fell["reward/standing"] < 1
    assert ok["reward/total"] > fell["reward/total"]


def test_place_physics_agrees_with_statics():
    """Across episodes, MuJoCo's verdict matches the centre-of-mass rule for every option."""
    for seed in range(4):
        record, _ = place.make_episode(100 + seed, "hard")
        jobs = [place.job(record, a) for a in range(5)]
        for a, trace in enumerate(simulate_jobs(jobs)):
            stands = place.outcome(record, a, trace)["reward/success"] == 1
            assert stands == (record["meta"]["static_margins"][a] > 0), (seed, a)


def _carry_record(material: str) -> dict:
    for seed in range(200):
        record, _ = carry.make_episode(seed, "easy")
        if record["meta"]["scene"]["material"] == material:
            return record
    raise AssertionError(f"no {material} object in 200 seeds")


def test_carry_good_grip_dropped_crushed_too_slow():
    glass = _carry_record("glass")
    good = carry.good_action(glass)
    assert execute(glass, good)["reward/success"] == 1
    assert execute(glass, (1.0, good[1]))["reward/dropped"] == -1  # too little friction for the weight
    assert execute(glass, (45.0, good[1]))["reward/crushed"] == -1  # squeezed past its strength
    assert execute(glass, (good[0], 0.05))["reward/too_low"] == -1  # does not reach the height in time
    steel = _carry_record("steel")
    # The grip that carries the glass cannot carry the steel block: weight is seen, not told.
    assert execute(steel, good)["reward/dropped"] == -1
    assert execute(steel, carry.good_action(steel))["reward/success"] == 1


def test_push_good_short_and_long(episodes):
    record, _ = episodes["push"]
    j = push.good_action(record)
    ok, short, far = (execute(record, x) for x in (j, 0.5 * j, min(1.0, 1.6 * j)))
    assert ok["reward/success"] == 1 and ok["reward/closeness"] > 0.9
    assert short["reward/short"] == -1 and short["reward/success"] == 0
    assert far["reward/overshoot"] == -1 and far["reward/success"] == 0
    assert ok["reward/total"] > max(short["reward/total"], far["reward/total"])


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("place", _answer("B"), 1),
        ("place", _answer(" (C) "), 2),
        ("place", _answer("F"), None),  # only five options
        ("place", _answer("b"), None),
        ("place", _answer("A, B"), None),
        ("place", "<answer>A</answer><answer>B</answer>", None),
        ("carry", _answer("12.5, 0.2"), (12.5, 0.2)),
        ("carry", _answer("12.5 0.2"), (12.5, 0.2)),
        ("carry", _answer("12.5 N, 0.2 m/s"), None),  # units are not numbers
        ("carry", _answer("60, 0.2"), None),  # force out of range
        ("carry", _answer("12.5"), None),
        ("push", _answer("0.35"), 0.35),
        ("push", _answer(".5"), 0.5),
        ("push", _answer("nan"), None),
        ("push", _answer("1.5"), None),
        ("push", "0.35", None),
    ],
)
def test_parse_action_is_strict(name, text, expected):
    assert task(name).parse_action(text) == expected


def test_env_reward_terms_and_unparseable(episodes):
    records = [episodes["push"][0], episodes["push"][0], episodes["place"][0]]
    good = push.good_action(records[0])
    texts = [_answer(f"{good:.3f}"), "I would push it gently", _answer("C")]
    terms = env_reward(texts, records)
    assert len({tuple(sorted(t)) for t in terms}) == 1, "every dict has the same keys"
    assert {"reward/total", "reward/format", "reward/unparseable", "reward/toppled"} <= set(terms[0])
    assert terms[0]["reward/success"] == 1 and terms[0]["reward/format"] == 1
    assert terms[1]["reward/unparseable"] == 1 and terms[1]["reward/format"] == 0
    assert terms[1]["reward/total"] == -unparseable_penalty() and terms[1]["reward/success"] == 0
    expected = execute(records[2], 2)["reward/total"] + 0.2
    assert terms[2]["reward/total"] == pytest.approx(expected)


def test_not_answering_never_beats_a_bad_action():
    """A task's declared worst outcome is no lower than every failure term at -1 together (the other terms
    are never negative), and unparseable scores below it."""
    for name in TASKS:
        mod = task(name)
        every_failure = -sum(mod.WEIGHTS[k] for k in mod.FAILURES)
        assert every_failure <= mod.WORST_OUTCOME < 0, name
        assert -unparseable_penalty() < mod.WORST_OUTCOME, name
        assert set(mod.FAILURES) <= set(mod.WEIGHTS), name


def test_env_errors_name_task_and_seed(episodes):
    record = {**episodes["push"][0], "meta": {**episodes["push"][0]["meta"], "scene": {}}}
    with pytest.raises(EnvError, match=r"task push, seed 3"):
        env_reward([_answer("0.3")], [record])
    job = push.job(episodes["push"][0], 0.3)
    job.qvel[:] = np.nan  # MuJoCo would reset this silently; the backend must not
    with pytest.raises(EnvError, match=r"task push, seed 3.*diverged"):
        simulate_jobs([job])


@pytest.mark.slow
def test_warp_backend_agrees_with_cpu():
    """Parity on a small sample (the full figure comes from `embodied bench envs`)."""
    pytest.importorskip("mujoco_warp")
    from embodied.envs.parity import parity

    result = parity(n_per_task=8, seed=0)
    assert result["agree"] >= 0.99 * result["n"], result


def test_gymnasium_shaped_env():
    from embodied.envs.gym_env import TaskEnv

    env = TaskEnv("push")
    obs, info = env.reset(3)
    assert obs["frames"].shape == (4, 112, 112, 3) and obs["options"] == [] and "impulse" in obs["question"]
    j = push.good_action(info["record"])
    _, reward, terminated, truncated, info = env.step(f"<think></think><answer>{j:.3f}</answer>")
    assert terminated and not truncated and info["terms"]["reward/success"] == 1
    assert reward == pytest.approx(info["terms"]["reward/total"])
    with pytest.raises(RuntimeError, match="reset"):
        env.step(0.3)
