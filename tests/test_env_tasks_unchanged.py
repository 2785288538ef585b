"""The three interactive tasks behave as they did before each task declared its own grid, probes, failure
terms and worst outcome (issue 23): the same probe answers, the same rewards, the same best constants and
the same unparseable penalty. The expected values were recorded from the code before the change."""

from __future__ import annotations

import numpy as np
import pytest

from embodied.envs import answer_text, task
from embodied.envs.reward import env_reward, unparseable_penalty
from embodied.eval.env_baselines import best_constant

SEEDS = (0, 1, 2)
PROBES = {
    "place": [
        [
            "<think></think><answer>B</answer>",
            "<think></think><answer>E</answer>",
            "<think></think><answer>C</answer>",
            "<think></think><answer>D</answer>",
            "<think></think><answer>A</answer>",
            "<think></think><answer>A</answer>",
        ],
        [1.7, 0.075, 1.7, 1.7, 1.7, 1.7],
    ],
    "carry": [
        [
            "<think></think><answer>6.73, 0.168</answer>",
            "<think></think><answer>21.75, 0.488</answer>",
            "<think></think><answer>4.93, 0.143</answer>",
            "<think></think><answer>44.88, 0.430</answer>",
            "<think></think><answer>4.92, 0.180</answer>",
            "<think></think><answer>19.62, 0.272</answer>",
        ],
        [1.2, 1.2, 1.2, -0.3, 1.2, 1.2],
    ],
    "push": [
        [
            "<think></think><answer>0.2771</answer>",
            "<think></think><answer>0.4085</answer>",
            "<think></think><answer>0.2485</answer>",
            "<think></think><answer>0.0453</answer>",
            "<think></think><answer>0.2029</answer>",
            "<think></think><answer>0.0488</answer>",
        ],
        [1.571495931001, -0.05, 1.694900549236, -0.033209413565, 1.536570925295, -0.03048701203],
    ],
}
"""Per task: the completions of six parity probes (rng 5, episode seed 0) and their reward/total."""
BEST = {
    "carry": ["grip 13.0 N, lift 0.15 m/s", 1.0],
    "place": ["centred", 1.0],
    "push": ["impulse 0.25 N s", 0.6666666666666666],
}
"""Per task: the best constant answer on easy seeds 0-2 and its success."""
GRID_SIZES = {"place": 5, "carry": 45, "push": 20}
GRID_ENDS = {"place": [0, 4], "carry": [[0.5, 0.15], [50, 0.4]], "push": [0.05, 1.0]}


@pytest.fixture(scope="module")
def records():
    return {n: [task(n).make_episode(s, "easy", num_frames=0)[0] for s in SEEDS] for n in PROBES}


def test_probes_and_their_rewards_are_unchanged(records):
    for name, (texts, totals) in PROBES.items():
        rec = records[name][0]
        actions = task(name).probe_actions(rec, np.random.default_rng(5), 6)
        assert [answer_text(name, a) for a in actions] == texts, name
        got = [t["reward/total"] for t in env_reward(texts, [rec] * len(texts))]
        assert got == pytest.approx(totals, abs=1e-12), name


def test_best_constants_are_unchanged(records):
    out = best_constant([r for n in PROBES for r in records[n]])
    assert {n: (v["answer"], v["success"]) for n, v in out.items()} == {n: tuple(v) for n, v in BEST.items()}


def test_constant_grids_are_unchanged():
    for name, size in GRID_SIZES.items():
        grid = [list(a) if isinstance(a, tuple) else a for a in task(name).CONSTANT_GRID]
        assert len(grid) == size and [grid[0], grid[-1]] == GRID_ENDS[name], name


def test_unparseable_penalty_is_unchanged(records):
    assert unparseable_penalty() == 1.5
    assert {n: task(n).WORST_OUTCOME for n in PROBES} == {"place": -0.5, "carry": -1.25, "push": -0.25}
    terms = env_reward(["no answer"], [records["carry"][0]])[0]
    assert terms["reward/total"] == -1.5 and terms["reward/unparseable"] == 1
