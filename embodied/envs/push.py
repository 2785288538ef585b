"""Push: the impulse that makes a puck stop inside a target zone, friction known only from a demo.

The clip is a demonstration: the puck, struck with a stated impulse, slides and stops. The same puck is
then put back on the start line and the policy answers the impulse (N s) that makes it stop inside the
green zone. With Coulomb friction the sliding distance grows with the square of the launch speed, so
the demo's distance calibrates the unknown friction: J = J_demo sqrt(D / d_demo). MuJoCo decides.

Reward terms: ``reward/success`` (at rest inside the zone after 3 s), ``reward/closeness`` (1 at the
zone's centre, falling linearly to 0 at one target distance away), ``reward/overshoot`` (-1: past
the zone) and ``reward/short`` (-1: before it).
"""

from __future__ import annotations

import numpy as np

from embodied.envs import core

NAME = "push"
NUMERIC = True  # the answer is numbers (False: a lettered option)
VERSION = 1
"""Bumped whenever what `make_episode` makes for a seed changes (the dataset manifest records it)."""
RANK = 2  # its place in the default env.tasks
START_X = -0.35  # m, the puck's start (the black line in sim/push/scene.xml)
MASS = 0.2  # kg, as in the scene
FRICTION_RANGE = (0.1, 0.5)
DEMO_DISTANCE = (0.15, 0.4)  # m the demonstration slides
TARGET_DISTANCE = (0.2, 0.65)  # m from the start line to the zone's centre
ZONE_HALF = {"easy": 0.08, "hard": 0.04}  # m, half the zone's length along the push
IMPULSE_RANGE = (0.0, 1.0)
SLIDE_S = 3.0
REST_SPEED = 0.02  # m/s
WARP_SIZES = (16, 32)  # peak on CPU: see core.Job.warp_sizes
WEIGHTS = {"reward/success": 1.0, "reward/closeness": 0.5, "reward/overshoot": 0.25, "reward/short": 0.25}
FAILURES = ("reward/short", "reward/overshoot")
CORRECTIONS = {"reward/short": (0, 1), "reward/overshoot": (0, -1)}
"""After each failure, the action's coordinate that should move and its sign: a harder or softer strike."""
WORST_OUTCOME = -0.25
"""The lowest reward/total of an executed action: short or past the zone (never both), closeness 0."""
CONSTANT_GRID = [round(0.05 * i, 2) for i in range(1, 21)]
"""The best-constant baseline's answers: impulses in steps of 0.05 N s over the stated range."""
DECIDED_BY = "the impulse that stops the puck at the zone's centre"
GRID_RATIOS = (0.7, 0.8, 0.95, 1.1, 1.3, 1.5, 1.8, 2.1)
"""`env.answer=grid`: the lettered options are these multiples of the demo's stated impulse, spaced
geometrically over what J = J_demo sqrt(D / d_demo) can need (0.71-2.08 with the sampled distances), so a
policy picks the option from the two distances in the clip alone. Fixed multiples carry no hint of the
answer; on hard episodes (8 cm zones) one of them lands in the zone on about two thirds of episodes."""
PROBE_DIGITS = (4,)  # parity probes: impulse to 0.0001 N s


def question(demo_impulse: float) -> str:
    return (
        f"In the video the puck is struck with an impulse of {demo_impulse:.2f} N s and slides to a stop. "
        "It is put back on the black start line. What impulse (in N s, from "
        f"{IMPULSE_RANGE[0]:.2f} to {IMPULSE_RANGE[1]:.2f}) makes it stop inside the green zone? "
        "Answer with one number, e.g. <answer>0.35</answer>."
    )


def sample_scene(rng: np.random.Generator, difficulty: str) -> dict:
    """Friction, the demo's impulse (rounded to 0.01 N s, as stated) and the zone."""
    mu = float(rng.uniform(*FRICTION_RANGE))
    d_demo = float(rng.uniform(*DEMO_DISTANCE))
    demo_impulse = round(MASS * float(np.sqrt(2 * mu * 9.81 * d_demo)), 2)
    return {
        "friction": mu,
        "demo_impulse": demo_impulse,
        "target": float(rng.uniform(*TARGET_DISTANCE)),
        "zone_half": ZONE_HALF[difficulty],
    }


def _job(seed: int, scene: dict, impulse: float, seconds: float = SLIDE_S) -> core.Job:
    base = core.base_model(NAME)
    puck, zone = core.name_id(base, "geom", "puck"), core.name_id(base, "geom", "zone")
    friction, pos, size = base.geom_friction.copy(), base.geom_pos.copy(), base.geom_size.copy()
    friction[puck, 0] = scene["friction"]
    pos[zone, 0] = START_X + scene["target"]
    size[zone, 0] = scene["zone_half"]
    fields = {"geom_friction": friction, "geom_pos": pos, "geom_size": size}
    model = core.configured_model(NAME, fields)
    qvel = np.zeros(model.nv)
    qvel[0] = impulse / MASS  # an impulse J sets the speed J / m at once
    phases = [(core.steps(model, seconds), np.zeros(model.nu))]
    return core.Job(NAME, seed, model, model.qpos0.copy(), qvel, phases, fields, warp_sizes=WARP_SIZES)


def make_episode(
    seed: int,
    difficulty: str = "easy",
    width: int = 112,
    height: int = 112,
    num_frames: int = 4,
    fps: float = 2.0,
) -> tuple[dict, np.ndarray]:
    """Sample friction and a zone from ``seed`` and render the demonstration: ``(record, frames)``."""
    from embodied.envs.backend import simulate_cpu

    if difficulty not in core.DIFFICULTIES:
        raise ValueError(f"difficulty {difficulty!r}; choose one of {core.DIFFICULTIES}")
    scene = sample_scene(np.random.default_rng(seed), difficulty)
    times = core.clip_times(num_frames, fps)
    job = _job(seed, scene, scene["demo_impulse"], seconds=(float(times[-1]) if num_frames else 0.0) + 0.01)
    view = core.renderer(width, height) if num_frames else None  # 0 frames: the record alone
    _, frames = simulate_cpu(job, times, view)
    record = {
        "task": NAME,
        "question": question(scene["demo_impulse"]),
        "options": [],
        "answer": "",
        "meta": {
            "seed": int(seed),
            "difficulty": difficulty,
            "fps": fps,
            "num_frames": num_frames,
            "interactive": True,
            "scene": scene,
        },
    }
    return record, frames


def parse_action(text: str) -> float | None:
    """The impulse (N s) from ``<answer>J</answer>``, inside IMPULSE_RANGE; None if unparseable."""
    values = core.parse_numbers(text, [IMPULSE_RANGE])
    return None if values is None else values[0]


def job(record: dict, action: float) -> core.Job:
    return _job(record["meta"]["seed"], record["meta"]["scene"], action)


def outcome(record: dict, action: float, trace: core.Trace) -> dict[str, float]:
    """Terms from where the puck came to rest relative to the zone."""
    del action
    scene = record["meta"]["scene"]
    travelled = float(trace.qpos[-1, 0]) - START_X
    error = travelled - scene["target"]
    at_rest = float(np.linalg.norm(trace.qvel[-1, :3])) < REST_SPEED
    inside = abs(error) <= scene["zone_half"]
    terms = {
        "reward/success": float(inside and at_rest),
        "reward/closeness": max(0.0, 1.0 - abs(error) / scene["target"]),
        "reward/overshoot": -1.0 if error > scene["zone_half"] else 0.0,
        "reward/short": -1.0 if error < -scene["zone_half"] else 0.0,
    }
    return core.total(terms, WEIGHTS)


def good_action(record: dict) -> float:
    """Calibrated from the demo alone, as the policy must: J = J_demo sqrt(D / d_demo), where d_demo is
    the demo's sliding distance, measured here by simulating the demo (the policy sees it in the clip)."""
    from embodied.envs.backend import simulate_cpu

    scene = record["meta"]["scene"]
    trace, _ = simulate_cpu(_job(record["meta"]["seed"], scene, scene["demo_impulse"]))
    d_demo = float(trace.qpos[-1, 0]) - START_X
    return round(scene["demo_impulse"] * float(np.sqrt(scene["target"] / d_demo)), 3)


def answer_grid(record: dict) -> tuple[str, list[tuple[float, str]]]:
    """`env.answer=grid`: the question asking for a lettered option and the options as ``(impulse,
    text)``: `GRID_RATIOS` times the demo's impulse (within the impulse range, to 0.0001 N s)."""
    demo = record["meta"]["scene"]["demo_impulse"]
    q = (
        f"In the video the puck is struck with an impulse of {demo:.2f} N s and slides to a stop. "
        "It is put back on the black start line. Which impulse makes it stop inside the green zone?"
    )
    options = []
    for r in GRID_RATIOS:
        j = round(min(IMPULSE_RANGE[1], max(IMPULSE_RANGE[0], r * demo)), 4)
        options.append((j, f"{r:g} times the demo's impulse ({j:.2f} N s)"))
    return q, options


def format_action(action: float) -> str:
    """The body of an answer with this impulse (what `parse_action` reads back)."""
    return f"{action:.4f}"


def probe_actions(record: dict, rng: np.random.Generator, k: int) -> list[float]:
    """``k`` answers for the CPU/Warp parity check: half near `good_action`, half uniform over the ranges
    (`core.numeric_probes`)."""
    return core.numeric_probes(good_action(record), [IMPULSE_RANGE], PROBE_DIGITS, rng, k)


def describe(action: float) -> str:
    return f"impulse {action:.2f} N s"


def random_answer(rng: np.random.Generator) -> str:
    """The body of a well-formed answer: an impulse in steps of 0.05 N s over the stated range."""
    return f"{0.05 * int(rng.integers(1, round(IMPULSE_RANGE[1] / 0.05) + 1)):.2f}"


def action_value(action: float) -> float:
    """The action as one number, the impulse (N s)."""
    return float(action)


def decisive(record: dict) -> float:
    """The scene parameter that decides the outcome: the impulse that stops the puck at the zone's centre
    (Coulomb friction: J = m sqrt(2 mu g D))."""
    scene = record["meta"]["scene"]
    return float(MASS * np.sqrt(2 * scene["friction"] * 9.81 * scene["target"]))


def execute(record: dict, action, backend: str = "cpu") -> dict[str, float]:
    """Simulate ``action`` for ``record`` on ``backend`` and return the reward terms."""
    from embodied.envs import execute as run

    return run(record, action, backend)
