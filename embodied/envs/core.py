"""What the interactive tasks share: episodes as jobs for a physics backend, action parsing, scenes.

An interactive task turns `(record, action)` into a :class:`Job`: a configured MuJoCo model (the task's
fixed scene with this episode's parameters written into model fields), an initial state and a control
schedule. A backend (:mod:`embodied.envs.backend`) runs jobs and returns a :class:`Trace` per job; the
task's ``outcome(record, action, trace)`` turns the trace into named reward terms. Because every
backend hands the same kind of trace to the same ``outcome`` function, the success label is the same
function of the simulated state whichever backend produced it.

Why per-episode parameters live in model fields (friction, mass, colour, ...) rather than in a freshly
compiled scene: MuJoCo Warp simulates many worlds at once only when they share one model structure,
with per-world values for "batched" fields. So each task has exactly one scene structure.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass, field

import mujoco
import numpy as np

from embodied.questions import parse_answer
from embodied.worlds import scene_path

DIFFICULTIES = ("easy", "hard")
READ_EVERY = 5
"""Physics steps between two readouts of the state into a trace (10 ms at the 2 ms timestep)."""

# Fields a job may set per episode, and the ones `mj_setConst` derives from them; all are batched
# per world in MuJoCo Warp (their array spec starts with "*").
SETTABLE_FIELDS = ("geom_friction", "geom_rgba", "geom_pos", "geom_size", "body_mass", "body_inertia")
DERIVED_FIELDS = ("body_subtreemass", "body_invweight0", "dof_invweight0")

_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)")


@dataclass
class Job:
    """One episode to simulate: model, initial state, and piecewise-constant controls.

    ``phases`` is a list of ``(n_steps, ctrl)`` with ``ctrl`` of shape ``(nu,)``; episodes of one task
    share the step counts (only the control values differ), so a batch advances in lockstep.
    """

    task: str
    seed: int
    model: mujoco.MjModel
    qpos: np.ndarray  # (nq,)
    qvel: np.ndarray  # (nv,)
    phases: list[tuple[int, np.ndarray]]
    fields: dict[str, np.ndarray] = field(default_factory=dict)
    warp_sizes: tuple[int, int] = (64, 256)
    """(contacts, constraint rows) per world that MuJoCo Warp allocates; overflow is an error, and
    smaller is faster. Each task sets them from the peak it reaches on the CPU backend, with headroom."""

    @property
    def n_steps(self) -> int:
        return sum(n for n, _ in self.phases)


@dataclass
class Trace:
    """States read every ``READ_EVERY`` steps, the initial state first: ``qpos (K, nq)``,
    ``qvel (K, nv)``, ``sensordata (K, nsensordata)``, ``time (K,)``."""

    qpos: np.ndarray
    qvel: np.ndarray
    sensordata: np.ndarray
    time: np.ndarray


class EnvError(RuntimeError):
    """A failure inside an environment; the message names the task and the seed."""


_BASE: dict[str, mujoco.MjModel] = {}


def base_model(task: str) -> mujoco.MjModel:
    """The compiled scene of ``task`` (compiled once per process, never modified): ``sim/<task>/scene.xml``,
    or the file given to :func:`add_scene`."""
    if task not in _BASE:
        _BASE[task] = mujoco.MjModel.from_xml_path(str(_SCENES.get(task) or scene_path(task)))
    return _BASE[task]


_SCENES: dict[str, str] = {}


def add_scene(task: str, path: str) -> None:
    """Use the MJCF file ``path`` as the scene of ``task`` (a task kept outside this package, whose module
    names it as ``SCENE``: :func:`embodied.envs.register` calls this)."""
    _SCENES[task] = str(path)
    _BASE.pop(task, None)


def configured_model(task: str, fields: dict[str, np.ndarray]) -> mujoco.MjModel:
    """A copy of the task's model with ``fields`` written in and the derived constants recomputed.

    ``fields`` maps a model field name (one of ``SETTABLE_FIELDS``) to its full new value.
    """
    bad = sorted(set(fields) - set(SETTABLE_FIELDS))
    if bad:
        raise ValueError(f"{task}: fields {bad} cannot vary per episode; settable: {SETTABLE_FIELDS}")
    model = copy.copy(base_model(task))
    for name, value in fields.items():
        getattr(model, name)[:] = value
    # body_subtreemass and the inverse weights (used to scale contact softness) follow the new masses.
    mujoco.mj_setConst(model, mujoco.MjData(model))
    return model


def name_id(model: mujoco.MjModel, kind: str, name: str) -> int:
    """Id of a named element (``kind``: body, geom, joint, actuator, sensor); errors name the scene."""
    obj = {"geom": mujoco.mjtObj.mjOBJ_GEOM, "body": mujoco.mjtObj.mjOBJ_BODY}.get(kind)
    obj = obj or getattr(mujoco.mjtObj, f"mjOBJ_{kind.upper()}")
    i = mujoco.mj_name2id(model, obj, name)
    if i < 0:
        raise KeyError(f"{kind} {name!r} not found in the scene; see the comment at the top of its XML")
    return i


def steps(model: mujoco.MjModel, seconds: float) -> int:
    """Physics steps in ``seconds``, rounded to whole readouts."""
    n = round(seconds / model.opt.timestep)
    return max(READ_EVERY, READ_EVERY * round(n / READ_EVERY))


# --- actions ----------------------------------------------------------------------------------------


def parse_letter(text: str, n_options: int) -> int | None:
    """Index of the one option letter inside the single ``<answer>`` block, or None."""
    content = parse_answer(text)
    if content is None:
        return None
    content = content.strip().strip("()").strip()
    if len(content) != 1 or not content.isalpha():
        return None
    index = ord(content.upper()) - ord("A")
    return index if 0 <= index < n_options and content.isupper() else None


def parse_numbers(text: str, ranges: list[tuple[float, float]]) -> tuple[float, ...] | None:
    """The numbers inside the single ``<answer>`` block, one per range and each inside it, or None.

    The block must hold exactly ``len(ranges)`` plain decimal numbers separated by commas and/or
    spaces, and nothing else (no units, no words): an answer that needs guessing executes nothing.
    """
    content = parse_answer(text)
    if content is None:
        return None
    parts = [p for p in re.split(r"[,\s]+", content) if p]
    if len(parts) != len(ranges) or not all(_NUMBER.fullmatch(p) for p in parts):
        return None
    values = tuple(float(p) for p in parts)
    for v, (lo, hi) in zip(values, ranges):
        if not (math.isfinite(v) and lo <= v <= hi):
            return None
    return values


def numeric_probes(
    good: float | tuple[float, ...],
    ranges: list[tuple[float, float]],
    digits: tuple[int, ...],
    rng: np.random.Generator,
    k: int,
):
    """``k`` numeric actions that cover both outcomes: even positions within 20% of the sound answer
    ``good`` (clipped to ``ranges``), odd ones uniform over ``ranges``; each coordinate rounded to its
    ``digits``. One range gives plain numbers, several give tuples."""
    r = np.array(ranges, dtype=float)

    def rounded(x: np.ndarray):
        values = tuple(round(float(v), d) for v, d in zip(x, digits))
        return values if len(values) > 1 else values[0]

    g = np.atleast_1d(np.asarray(good, dtype=float))
    near = [rounded(np.clip(g * rng.uniform(0.8, 1.2, g.size), r[:, 0], r[:, 1])) for _ in range(k)]
    return [rounded(rng.uniform(r[:, 0], r[:, 1])) if i % 2 else near[i] for i in range(k)]


def total(terms: dict[str, float], weights: dict[str, float]) -> dict[str, float]:
    """``terms`` plus ``reward/total``, their weighted sum (missing weights count 1)."""
    out = dict(terms)
    out["reward/total"] = float(sum(weights.get(k, 1.0) * v for k, v in terms.items()))
    return out


_RENDERERS: dict[tuple[int, int], object] = {}


def renderer(width: int, height: int):
    """One :class:`~embodied.worlds.render.FrameRenderer` per frame size, shared by the whole process."""
    from embodied.worlds.render import FrameRenderer

    if (width, height) not in _RENDERERS:
        _RENDERERS[(width, height)] = FrameRenderer(width, height)
    return _RENDERERS[(width, height)]


def clip_times(num_frames: int, fps: float) -> np.ndarray:
    """Times (s) of the clip's frames, starting at 0."""
    return np.arange(num_frames) / fps
