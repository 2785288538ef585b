"""Place: where to set a fourth block on a leaning tower so that the tower still stands.

The clip shows a tower of three equal blocks, each shifted sideways on the one below. The policy picks
one of five lettered positions (offsets from the bottom block's centre, marked by ticks on the floor)
for a fourth block on top; the block is released 2 mm above the tower and MuJoCo decides. Statics
says a tower stands when, at every interface, the centre of mass of all the blocks above lies over the
block below; :func:`static_margins` computes that margin, and the sampler keeps every option at least
``MIN_MARGIN`` away from the tipping point, so the physical outcome is not a coin toss on numerical
noise. No label is stored: the reward is what the simulator does.

Reward terms: ``reward/success`` (1 when every block is still at its height after 2.5 s),
``reward/toppled`` (-1 when any block fell), ``reward/standing`` (share of blocks still at height).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from embodied.envs import core
from embodied.questions import LETTERS

NAME = "place"
NUMERIC = False  # the answer is a lettered option
VERSION = 1
"""Bumped whenever what `make_episode` makes for a seed changes (the dataset manifest records it)."""
RANK = 0  # first in the default env.tasks
HALF = (0.06, 0.04, 0.025)  # block half-sizes (m), as in sim/place/scene.xml
OFFSETS_CM = (-6.0, -3.0, 0.0, 3.0, 6.0)  # from the bottom block's centre
MAX_SHIFT = 0.05  # m: largest sideways shift of a tower block on the one below
MIN_MARGIN = 0.006  # m: no option lies closer than this to tipping
TOWER_MARGIN = 0.01  # m: the three-block tower itself is at least this stable
SETTLE_S = 2.5
FALL_TOL = 0.01  # m: a block more than this below (or above) its stacked height has fallen
WARP_SIZES = (48, 160)  # peak on CPU: see core.Job.warp_sizes
WEIGHTS = {"reward/success": 1.0, "reward/toppled": 0.5, "reward/standing": 0.5}
FAILURES = ("reward/toppled",)
WORST_OUTCOME = -0.5
"""The lowest reward/total of an executed action: the tower toppled (-0.5) and no block stands (0)."""
CONSTANT_GRID = list(range(len(OFFSETS_CM)))
"""The best-constant baseline tries every option."""
DECIDED_BY = "the centre of the positions that stand"
QUESTION = (
    "A fourth block, the same as these, will be set down gently on top of the tower, its centre "
    "shifted sideways from the centre of the bottom block as the options say (left and right as seen "
    "in the video). "
    "Where should it go so that the whole tower still stands?"
)


def _options() -> list[str]:
    return [
        "centred" if o == 0 else f"{abs(o):.1f} cm to the {'left' if o < 0 else 'right'}" for o in OFFSETS_CM
    ]


def static_margins(xs: list[float]) -> float:
    """Smallest margin (m) over interfaces of a stack with block centres ``xs`` (bottom first).

    At the interface on top of block k, the centre of mass of blocks k+1.. must lie within HALF[0] of
    block k's centre; positive = stands, negative = tips. Equal masses, so the COM is a plain mean.
    """
    return min(HALF[0] - abs(float(np.mean(xs[k + 1 :])) - xs[k]) for k in range(len(xs) - 1))


def sample_tower(rng: np.random.Generator, difficulty: str) -> dict[str, Any]:
    """Block centres of a three-block tower whose options are all clearly stable or clearly not.

    easy: three or four of the five options stand; hard: at most two do.
    """
    for _ in range(10_000):
        d1, d2 = rng.uniform(-MAX_SHIFT, MAX_SHIFT, size=2)
        xs = [0.0, d1, d1 + d2]  # the bottom block sits at the centre of the view
        if static_margins(xs) < TOWER_MARGIN:
            continue
        margins = [static_margins([*xs, o / 100]) for o in OFFSETS_CM]
        if min(abs(m) for m in margins) < MIN_MARGIN:
            continue
        stands = sum(m > 0 for m in margins)
        if (difficulty == "easy") == (stands >= 3):
            return {"xs": [float(x) for x in xs], "margins": [float(m) for m in margins]}
    raise RuntimeError(f"could not sample a {difficulty} tower")


def _job(seed: int, xs: list[float], top_x: float | None) -> core.Job:
    """Tower ``xs`` plus the fourth block released at ``top_x`` (or parked out of view if None)."""
    model = core.base_model(NAME)
    qpos = model.qpos0.copy()
    for k, x in enumerate(xs):
        qpos[7 * k : 7 * k + 3] = [x, 0.0, HALF[2] * (2 * k + 1)]
    if top_x is None:
        qpos[21:24] = [1.5, 0.0, HALF[2]]  # on the floor, outside the camera's view
    else:
        qpos[21:24] = [top_x, 0.0, HALF[2] * 7 + 0.002]
    nu = np.zeros(model.nu)
    return core.Job(
        NAME,
        seed,
        model,
        qpos,
        np.zeros(model.nv),
        [(core.steps(model, SETTLE_S), nu)],
        warp_sizes=WARP_SIZES,
    )


def make_episode(
    seed: int,
    difficulty: str = "easy",
    width: int = 112,
    height: int = 112,
    num_frames: int = 4,
    fps: float = 2.0,
) -> tuple[dict, np.ndarray]:
    """Sample a tower from ``seed`` and render its clip: ``(record, frames (T, H, W, 3) uint8)``."""
    from embodied.envs.backend import simulate_cpu

    if difficulty not in core.DIFFICULTIES:
        raise ValueError(f"difficulty {difficulty!r}; choose one of {core.DIFFICULTIES}")
    rng = np.random.default_rng(seed)
    tower = sample_tower(rng, difficulty)
    job = _job(seed, tower["xs"], None)
    view = core.renderer(width, height) if num_frames else None  # 0 frames: the record alone
    _, frames = simulate_cpu(job, core.clip_times(num_frames, fps), view)
    record = {
        "task": NAME,
        "question": QUESTION,
        "options": _options(),
        "answer": "",
        "meta": {
            "seed": int(seed),
            "difficulty": difficulty,
            "fps": fps,
            "num_frames": num_frames,
            "interactive": True,
            "scene": {"xs": tower["xs"]},
            "static_margins": tower["margins"],
        },
    }
    return record, frames


def parse_action(text: str) -> int | None:
    """The chosen option's index, from exactly one ``<answer>X</answer>``; None if unparseable."""
    return core.parse_letter(text, len(OFFSETS_CM))


def job(record: dict, action: int) -> core.Job:
    xs = record["meta"]["scene"]["xs"]
    return _job(record["meta"]["seed"], xs, OFFSETS_CM[action] / 100)


def outcome(record: dict, action: int, trace: core.Trace) -> dict[str, float]:
    """Reward terms from the final state: which blocks are still at their stacked height."""
    del action
    z = trace.qpos[-1].reshape(4, 7)[:, 2]
    nominal = HALF[2] * (2 * np.arange(4) + 1)
    standing = np.abs(z - nominal) < FALL_TOL
    ok = bool(standing.all())
    terms = {
        "reward/success": float(ok),
        "reward/toppled": 0.0 if ok else -1.0,
        "reward/standing": float(standing.mean()),
    }
    return core.total(terms, WEIGHTS)


def format_action(action: int) -> str:
    """The body of an answer choosing option ``action`` (what `parse_action` reads back)."""
    return LETTERS[action]


def probe_actions(record: dict, rng: np.random.Generator, k: int) -> list[int]:
    """``k`` answers for the CPU/Warp parity check: every option in turn, in a random order."""
    del record
    return [int(a) for a in rng.permutation(np.resize(np.arange(len(OFFSETS_CM)), k))]


def describe(action: int) -> str:
    """The action in words, for videos and logs."""
    return _options()[action]


def random_answer(rng: np.random.Generator) -> str:
    """The body of a well-formed answer naming a uniformly random option (no physics in it)."""
    return LETTERS[int(rng.integers(len(OFFSETS_CM)))]


def action_value(action: int) -> float:
    """The action as one number (cm from the bottom block's centre), for spread and correlation."""
    return OFFSETS_CM[action]


def decisive(record: dict) -> float:
    """The scene parameter that decides the outcome: the centre (cm) of the options that stand."""
    margins = record["meta"]["static_margins"]
    return float(np.mean([o for o, m in zip(OFFSETS_CM, margins) if m > 0]))


def execute(record: dict, action, backend: str = "cpu") -> dict[str, float]:
    """Simulate ``action`` for ``record`` on ``backend`` and return the reward terms."""
    from embodied.envs import execute as run

    return run(record, action, backend)
