"""Carry: grip force and lift speed for an object so that it is neither dropped nor crushed.

The clip shows a two-finger gripper around a block whose material (foam, wood, glass or steel) is told
by its look; material sets mass, friction and strength. The policy answers a grip force (N) and a lift
speed (m/s). MuJoCo then closes the fingers with that force for 0.4 s, lifts at that speed for 1 s and
holds for 0.6 s. Friction must carry weight plus inertia: 2 mu F >= m (g + a), where a faster lift
means a larger acceleration at the start; a squeeze above the material's strength (read from touch
sensors on the finger pads, the peak over the episode) crushes it; too slow a lift does not reach the
required height in time.

Reward terms: ``reward/success``, ``reward/dropped`` (-1: slipped out), ``reward/crushed`` (-1: peak
pad force above strength), ``reward/too_low`` (-1: the hand did not rise to the required height).
"""

from __future__ import annotations

import numpy as np

from embodied.envs import core

NAME = "carry"
NUMERIC = True  # the answer is numbers (False: a lettered option)
VERSION = 1
"""Bumped whenever what `make_episode` makes for a seed changes (the dataset manifest records it)."""
RANK = 1  # its place in the default env.tasks
# name: (rgba, friction, mass kg, strength N). Strength is the largest pad force the object survives.
MATERIALS = {
    "foam": ((0.95, 0.85, 0.30, 1.0), 0.9, 0.05, 5.0),
    "wood": ((0.55, 0.33, 0.15, 1.0), 0.5, 0.30, 60.0),
    "glass": ((0.55, 0.80, 0.95, 0.55), 0.2, 0.40, 25.0),
    "steel": ((0.45, 0.47, 0.52, 1.0), 0.35, 1.20, 150.0),
}
FORCE_RANGE = (0.0, 50.0)
SPEED_RANGE = (0.05, 0.5)
TARGET_HEIGHT = {"easy": 0.10, "hard": 0.25}  # m the object must rise within the lift phase
CLOSE_S, LIFT_S, HOLD_S = 0.4, 1.0, 0.6
LIFT_TAU = 0.15  # s: time constant of the lift servo's command filter (sim/carry/scene.xml)
SLIP_TOL = 0.03  # m: the object may lag the hand by this much before it counts as dropped
WARP_SIZES = (32, 96)  # peak on CPU: see core.Job.warp_sizes
WEIGHTS = {"reward/success": 1.0, "reward/dropped": 0.5, "reward/crushed": 0.5, "reward/too_low": 0.25}
FAILURES = ("reward/dropped", "reward/crushed", "reward/too_low")
CORRECTIONS = {"reward/dropped": (0, 1), "reward/crushed": (0, -1), "reward/too_low": (1, 1)}
"""After each failure, the action's coordinate that should move and its sign: grip harder (dropped), softer
(crushed), lift faster (too low)."""
WORST_OUTCOME = -1.25
"""The lowest reward/total of an executed action: dropped, crushed and too low at once."""
CONSTANT_GRID = [
    (f, v) for f in (0.5, 1, 2, 3, 4, 6, 8, 10, 13, 16, 20, 25, 32, 40, 50) for v in (0.15, 0.25, 0.4)
]
"""The best-constant baseline's answers: a grid over the stated force and speed ranges."""
DECIDED_BY = "the grip force a sound answer uses (set by the material)"
GRID_FORCES = (2.0, 6.0, 15.0, 30.0)
GRID_SPEEDS = (0.2, 0.4)
"""`env.answer=grid`: the lettered options are every force x speed pair, force by force (A: 2 N at 0.20
m/s, B: 2 N at 0.40 m/s, ..., H: 30 N at 0.40 m/s); the same for every episode, so they carry no hint of
the answer. The forces sit in the ranges that work per material on hard episodes (foam <= 3-4 N, wood
4-40 N, glass 13-16 N, steel >= 20-25 N; 0.3-0.5 m/s); 0.20 m/s reaches 10 cm (easy) but not 25 cm
(hard) in one second. Listing them speed by speed instead (A-D at 0.40 m/s) measured worse on seed 0
(one constant, 0.467, against 0.617; docs/environments.md, "Answers as a grid of options")."""
PROBE_DIGITS = (2, 3)  # parity probes: force to 0.01 N, speed to 0.001 m/s


def question(difficulty: str) -> str:
    h = TARGET_HEIGHT[difficulty] * 100
    return (
        f"The gripper will squeeze this block and then lift it: it must rise at least {h:.0f} cm within "
        "one second, without slipping out of the fingers and without being crushed. Choose the grip force "
        f"in newtons ({FORCE_RANGE[0]:.0f} to {FORCE_RANGE[1]:.0f}) and the lift speed in metres per second "
        f"({SPEED_RANGE[0]:.2f} to {SPEED_RANGE[1]:.2f}). Answer with the two numbers separated by a comma, "
        "e.g. <answer>12.5, 0.20</answer>."
    )


def sample_object(rng: np.random.Generator) -> dict:
    """A material and this object's mass and strength (within 15% of the material's)."""
    name = str(rng.choice(sorted(MATERIALS)))
    _, mu, mass, strength = MATERIALS[name]
    return {
        "material": name,
        "friction": mu,
        "mass": float(mass * rng.uniform(0.85, 1.15)),
        "strength": float(strength * rng.uniform(0.85, 1.15)),
    }


def _model(obj: dict):
    base = core.base_model(NAME)
    geom, body = core.name_id(base, "geom", "obj"), core.name_id(base, "body", "obj")
    friction, rgba = base.geom_friction.copy(), base.geom_rgba.copy()
    friction[geom, 0] = obj["friction"]
    rgba[geom] = MATERIALS[obj["material"]][0]
    mass, inertia = base.body_mass.copy(), base.body_inertia.copy()
    inertia[body] *= obj["mass"] / mass[body]  # same shape: inertia scales with mass
    mass[body] = obj["mass"]
    fields = {"geom_friction": friction, "geom_rgba": rgba, "body_mass": mass, "body_inertia": inertia}
    return core.configured_model(NAME, fields), fields


def _job(seed: int, obj: dict, force: float, speed: float, lift: bool = True) -> core.Job:
    model, fields = _model(obj)
    close = np.array([0.0, force, force])
    phases = [(core.steps(model, CLOSE_S), close)]
    if lift:
        phases += [(core.steps(model, LIFT_S), np.array([speed, force, force]))]
        phases += [(core.steps(model, HOLD_S), close)]
    return core.Job(
        NAME, seed, model, model.qpos0.copy(), np.zeros(model.nv), phases, fields, warp_sizes=WARP_SIZES
    )


def make_episode(
    seed: int,
    difficulty: str = "easy",
    width: int = 112,
    height: int = 112,
    num_frames: int = 4,
    fps: float = 2.0,
) -> tuple[dict, np.ndarray]:
    """Sample an object from ``seed`` and render the open gripper around it: ``(record, frames)``."""
    from embodied.envs.backend import simulate_cpu

    if difficulty not in core.DIFFICULTIES:
        raise ValueError(f"difficulty {difficulty!r}; choose one of {core.DIFFICULTIES}")
    obj = sample_object(np.random.default_rng(seed))
    job = _job(seed, obj, 0.0, 0.0, lift=False)
    job.phases = [(core.steps(job.model, (num_frames - 1) / fps + 0.01), job.phases[0][1])]
    view = core.renderer(width, height) if num_frames else None  # 0 frames: the record alone
    _, frames = simulate_cpu(job, core.clip_times(num_frames, fps), view)
    record = {
        "task": NAME,
        "question": question(difficulty),
        "options": [],
        "answer": "",
        "meta": {
            "seed": int(seed),
            "difficulty": difficulty,
            "fps": fps,
            "num_frames": num_frames,
            "interactive": True,
            "scene": obj,
            "target_height": TARGET_HEIGHT[difficulty],
        },
    }
    return record, frames


def parse_action(text: str) -> tuple[float, float] | None:
    """``(grip force N, lift speed m/s)`` from ``<answer>F, v</answer>``, both inside their ranges."""
    return core.parse_numbers(text, [FORCE_RANGE, SPEED_RANGE])  # type: ignore[return-value]


def job(record: dict, action: tuple[float, float]) -> core.Job:
    return _job(record["meta"]["seed"], record["meta"]["scene"], action[0], action[1])


def outcome(record: dict, action: tuple[float, float], trace: core.Trace) -> dict[str, float]:
    """Terms from the trace: object height vs hand height at the end, peak pad force over the episode."""
    del action
    meta = record["meta"]
    hand_rise = float(trace.qpos[-1, 7])  # joint "lift" follows the object's free joint (7 qpos)
    obj_rise = float(trace.qpos[-1, 2] - trace.qpos[0, 2])
    dropped = hand_rise - obj_rise > SLIP_TOL
    crushed = float(trace.sensordata.max()) > meta["scene"]["strength"]
    too_low = hand_rise < meta["target_height"]
    ok = not (dropped or crushed or too_low)
    terms = {
        "reward/success": float(ok),
        "reward/dropped": -1.0 if dropped else 0.0,
        "reward/crushed": -1.0 if crushed else 0.0,
        "reward/too_low": -1.0 if too_low else 0.0,
    }
    return core.total(terms, WEIGHTS)


def good_action(record: dict) -> tuple[float, float]:
    """A physically sound answer worked out from the hidden parameters (for tests and sanity checks):
    twice the grip that friction needs at the peak acceleration, capped at 60% of the strength, and a
    speed that reaches the height with 30% to spare."""
    obj, h = record["meta"]["scene"], record["meta"]["target_height"]
    speed = min(SPEED_RANGE[1], 1.3 * h / (LIFT_S - LIFT_TAU))
    need = obj["mass"] * (9.81 + speed / LIFT_TAU) / (2 * obj["friction"])
    return (round(min(2 * need, 0.6 * obj["strength"], FORCE_RANGE[1]), 1), round(speed, 2))


def answer_grid(record: dict) -> tuple[str, list[tuple[tuple[float, float], str]]]:
    """`env.answer=grid`: the question asking for a lettered option and the options as
    ``(action, text)``, every pair of `GRID_FORCES` and `GRID_SPEEDS` (the same for every episode)."""
    h = record["meta"]["target_height"] * 100
    q = (
        f"The gripper will squeeze this block and then lift it: it must rise at least {h:.0f} cm within "
        "one second, without slipping out of the fingers and without being crushed. Which grip force and "
        "lift speed should it use?"
    )
    return q, [((f, v), f"grip {f:.0f} N, lift {v:.2f} m/s") for f in GRID_FORCES for v in GRID_SPEEDS]


def format_action(action: tuple[float, float]) -> str:
    """The body of an answer with this grip force and lift speed (what `parse_action` reads back)."""
    return f"{action[0]:.2f}, {action[1]:.3f}"


def probe_actions(record: dict, rng: np.random.Generator, k: int) -> list[tuple[float, float]]:
    """``k`` answers for the CPU/Warp parity check: half near `good_action`, half uniform over the ranges
    (`core.numeric_probes`)."""
    return core.numeric_probes(good_action(record), [FORCE_RANGE, SPEED_RANGE], PROBE_DIGITS, rng, k)


def describe(action: tuple[float, float]) -> str:
    return f"grip {action[0]:.1f} N, lift {action[1]:.2f} m/s"


def random_answer(rng: np.random.Generator) -> str:
    """The body of a well-formed answer on a coarse grid: a whole number of newtons and a speed in steps
    of 0.05 m/s, uniformly over the stated ranges (no physics in it)."""
    force = int(rng.integers(int(FORCE_RANGE[0]), int(FORCE_RANGE[1]) + 1))
    return f"{force}, {0.05 * int(rng.integers(1, round(SPEED_RANGE[1] / 0.05) + 1)):.2f}"


def action_value(action: tuple[float, float]) -> float:
    """The action as one number, the grip force (N): what the material decides."""
    return float(action[0])


def decisive(record: dict) -> float:
    """The scene parameter that decides the outcome: the grip force a sound answer uses (`good_action`)."""
    return float(good_action(record)[0])


def execute(record: dict, action, backend: str = "cpu") -> dict[str, float]:
    """Simulate ``action`` for ``record`` on ``backend`` and return the reward terms."""
    from embodied.envs import execute as run

    return run(record, action, backend)
