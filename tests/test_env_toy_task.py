"""A new interactive task is one file (issue 23): a toy task written into a temporary module and registered
is generated, loaded, evaluated, given its best constant, probed for parity and reported like the shipped
ones, without a line of the framework naming it."""

from __future__ import annotations

import importlib.util
import types

import numpy as np
import pytest

from embodied import envs
from embodied.envs.reward import env_reward, unparseable_penalty

TOY = '''
"""Toss: the launch speed that makes a ball peak at a marked height (a slide joint, no controls)."""

import math

import numpy as np

from embodied.envs import core

NAME = "toss"
VERSION = 1
NUMERIC = True
RANK = 0
SCENE = __file__.replace(".py", ".xml")
SPEED_RANGE = (0.0, 5.0)
TOL = {"easy": 0.05, "hard": 0.02}  # m around the target height that counts as a hit
WEIGHTS = {"reward/success": 1.0, "reward/too_low": 0.5, "reward/too_high": 0.5}
FAILURES = ("reward/too_low", "reward/too_high")
WORST_OUTCOME = -0.5  # too low or too high, never both
CONSTANT_GRID = [round(0.5 * i, 1) for i in range(1, 11)]
DECIDED_BY = "the speed whose peak is the target height"


def make_episode(seed, difficulty="easy", width=112, height=112, num_frames=4, fps=2.0):
    """A target height and a clip that marks it (drawn, not rendered: the frame's row of the height)."""
    target = float(np.random.default_rng(seed).uniform(0.1, 0.9))
    frames = np.full((num_frames, height, width, 3), 40, np.uint8)
    frames[:, int((1 - target) * (height - 1)), :, 1] = 255
    record = {
        "task": NAME,
        "question": "At what speed (m/s, 0 to 5) must the ball leave to peak at the green line?",
        "options": [],
        "answer": "",
        "meta": {"seed": int(seed), "difficulty": difficulty, "fps": fps, "num_frames": num_frames,
                 "interactive": True, "scene": {"target": target, "tol": TOL[difficulty]}},
    }
    return record, frames


def parse_action(text):
    values = core.parse_numbers(text, [SPEED_RANGE])
    return None if values is None else values[0]


def format_action(action):
    return f"{action:.3f}"


def describe(action):
    return f"launch {action:.2f} m/s"


def random_answer(rng):
    return f"{0.5 * int(rng.integers(1, 11)):.2f}"


def job(record, action):
    model = core.base_model(NAME)
    qvel = np.array([float(action)])
    return core.Job(NAME, record["meta"]["seed"], model, model.qpos0.copy(), qvel,
                    [(core.steps(model, 1.2), np.zeros(model.nu))])


def outcome(record, action, trace):
    scene = record["meta"]["scene"]
    error = float(trace.qpos[:, 0].max()) - scene["target"]
    terms = {
        "reward/success": float(abs(error) <= scene["tol"]),
        "reward/too_low": -1.0 if error < -scene["tol"] else 0.0,
        "reward/too_high": -1.0 if error > scene["tol"] else 0.0,
    }
    return core.total(terms, WEIGHTS)


def good_action(record):
    return math.sqrt(2 * 9.81 * record["meta"]["scene"]["target"])


def probe_actions(record, rng, k):
    return core.numeric_probes(good_action(record), [SPEED_RANGE], (3,), rng, k)


def action_value(action):
    return float(action)


def decisive(record):
    return good_action(record)
'''

SCENE = """<mujoco model="toss">
  <option timestep="0.002"/>
  <worldbody>
    <geom name="floor" type="plane" size="1 1 0.1"/>
    <body name="ball" pos="0 0 0.05">
      <joint name="z" type="slide" axis="0 0 1"/>
      <geom name="ball" type="sphere" size="0.03" mass="0.1"/>
    </body>
    <camera name="cam" pos="0 -2 0.5" xyaxes="1 0 0 0 0 1"/>
  </worldbody>
</mujoco>
"""


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    folder = tmp_path_factory.mktemp("toy_task")
    (folder / "toss.py").write_text(TOY)
    (folder / "toss.xml").write_text(SCENE)
    spec = importlib.util.spec_from_file_location("toss", folder / "toss.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    envs.register(module)
    yield module
    envs.unregister("toss")


@pytest.fixture(scope="module")
def examples(toy, tmp_path_factory):
    from embodied.data.episodes import generate_episodes
    from embodied.data.load import load_examples
    from embodied.envs.config import EnvConfig

    cfg = EnvConfig(tasks=["toss"], root=str(tmp_path_factory.mktemp("toss_env")), n_train=2, n_test=8)
    manifest = generate_episodes(cfg, progress=False)
    assert manifest["counts"]["test"] == {"toss": {"easy": 8}}
    examples, skipped = load_examples(cfg.root, "test")
    assert not skipped and len(examples) == 8
    return examples


def _peaks_in_band(records, speed):
    """Hits of one launch speed by hand: the peak of a throw is v^2 / 2g above the start."""
    return sum(
        abs(speed**2 / (2 * 9.81) - r["meta"]["scene"]["target"]) <= r["meta"]["scene"]["tol"]
        for r in records
    )


def test_registered_toy_is_a_task(toy, examples):
    assert "toss" in envs.task_names() and envs.task("toss") is toy
    assert envs.is_interactive(examples[0].record)
    assert envs.TASKS == ("place", "carry", "push")  # registration adds, it does not change the shipped list
    assert toy.parse_action(envs.random_answer(examples[0].record, np.random.default_rng(0))) is not None
    # The reward: a sound throw succeeds, half of it falls short, twice of it overshoots.
    rec = examples[0].record
    good = toy.good_action(rec)
    texts = [envs.answer_text("toss", v) for v in (good, 0.5 * good, min(5.0, 2 * good))] + ["no idea"]
    terms = env_reward(texts, [rec] * 4)
    assert [t["reward/success"] for t in terms] == [1, 0, 0, 0]
    assert terms[1]["reward/too_low"] == -1 and terms[2]["reward/too_high"] == -1
    assert terms[0]["reward/total"] == pytest.approx(1.2) and terms[1]["reward/total"] == pytest.approx(-0.3)
    assert terms[3]["reward/total"] == -unparseable_penalty() == -1.5  # the toy's worst is above carry's


def test_evaluation_and_best_constant(toy, examples, tiny_policy):
    from embodied.eval.env_baselines import best_constant
    from embodied.eval.env_loop import EnvEval, evaluate_env
    from embodied.eval.env_stats import env_markdown
    from embodied.video import VideoConfig

    model, processor = tiny_policy
    result = evaluate_env(model, processor, examples, VideoConfig(), EnvEval(max_new_tokens=8))
    assert result["n"] == 8 and set(result["per_task"]) == {"toss"}
    assert result["unparseable"] == 1.0 and "| toss | 8 |" in env_markdown(result)
    records = [e.record for e in examples]
    out = best_constant(records)["toss"]
    hits = {v: _peaks_in_band(records, v) for v in toy.CONSTANT_GRID}
    best = max(hits, key=hits.get)  # the first of equals, as best_constant keeps the first
    assert out["answer"] == toy.describe(best) and out["success"] == hits[best] / 8 and out["n"] == 8


def test_parity_probes(toy):
    from embodied.envs.parity import episodes

    records, texts = episodes("toss", 12, seed=0, difficulty="easy")
    assert len(texts) == 12 and len({r["meta"]["seed"] for r in records}) == 3
    terms = env_reward(texts, records)
    assert all(t["reward/unparseable"] == 0 for t in terms)
    assert 0 < sum(t["reward/success"] for t in terms) < 12  # the probes cover both outcomes


@pytest.mark.slow
def test_parity_on_both_backends(toy):
    pytest.importorskip("mujoco_warp")
    from embodied.envs.parity import parity

    result = parity(n_per_task=8, seed=0, tasks=("toss",))
    assert result["agree"] >= 0.99 * result["n"], result


def test_report(toy, examples, tiny_policy, tmp_path):
    from embodied.config import Config
    from embodied.eval.env_baselines import best_constant
    from embodied.eval.env_loop import EnvEval, evaluate_env
    from embodied.experiments.env_report import write_env_report
    from embodied.video import VideoConfig

    model, processor = tiny_policy
    env = evaluate_env(model, processor, examples, VideoConfig(), EnvEval(max_new_tokens=8))
    mcq = {"accuracy": 0.5, "ci95": [0.3, 0.7], "chance": 0.5, "n": 20}
    rows = [{"seed": 0, "stages": {"start": {"env": env, "mcq": mcq}}, "videos": {}}]
    constant = best_constant([e.record for e in examples])
    summary = write_env_report(rows, constant, tmp_path, Config())
    figures = summary["stages"]["start"]["env"]["toss"]
    assert figures["too_low"] == [0.0] and figures["too_high"] == [0.0]  # nothing parsed, nothing failed
    text = (tmp_path / "results.md").read_text()
    assert "| start | 0.000 (0.00-0.00)" in text and toy.DECIDED_BY in text
    assert (tmp_path / "results.png").stat().st_size > 0


def test_penalty_follows_the_worst_task_and_protocol_is_checked(toy):
    deep = types.ModuleType("deep")
    deep.__dict__.update({k: v for k, v in vars(toy).items() if not k.startswith("__")})
    deep.NAME, deep.WORST_OUTCOME = "deep", -3.0
    envs.register(deep)
    try:
        assert unparseable_penalty() == 3.25  # 0.25 below the worst outcome of every known task
    finally:
        envs.unregister("deep")
    assert unparseable_penalty() == 1.5
    with pytest.raises(TypeError, match="CONSTANT_GRID"):
        envs.register(types.ModuleType("half"))
    with pytest.raises(ValueError, match="already known"):
        envs.register(envs.task("place"))
