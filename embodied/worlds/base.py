"""Shared machinery of the scenes (slide, topple, dominoes, occluder, pendulum).

A scene subclasses :class:`SceneWorld` and supplies four hooks: ``sample_params`` (the episode's
JSON-serialisable parameters), ``build`` (add bodies to a copy of ``sim/<scene>/scene.xml``),
``init_state`` (velocities at t = 0) and optionally ``apply_events`` (scripted edits, e.g. lifting
the occluder) and ``speed`` (what "still moving" means).

Physics once, frames on demand: ``reset`` simulates the whole episode (``horizon`` seconds, physics
only, ~1-10 ms for these scenes) in chunks of :data:`CONTROL_DT` and keeps MuJoCo's full integration
state at every chunk boundary (``mjSTATE_INTEGRATION``: qpos, qvel, mocap, warm start ...). That
gives the motion interval (``info["motion"]``) before any frame is drawn, and ``record(times)`` then
restores the nearest earlier state, steps the remaining < 10 physics steps and renders ONLY the
requested frames. Restoring an integration state continues the trajectory bit-exactly, so
``record`` and ``step`` see the same episode, and scripted events (applied at chunk boundaries, in
the rollout as in ``step``) are part of the cached states. (Exception: scenes that enable MuJoCo's
sleeping, dominoes and topple, restore states with every body awake; frames stay deterministic,
and differ from the uninterrupted trajectory by far less than a pixel.)
"""

from __future__ import annotations

import colorsys
import json
from collections.abc import Callable, Sequence
from typing import Any

import mujoco
import numpy as np

from embodied.worlds import scene_path
from embodied.worlds.render import FrameRenderer

CONTROL_DT = 0.02  # s: one step() call and the spacing of cached states
DIFFICULTIES = ("easy", "hard")
REST_WINDOW = 0.1  # s: speed must stay below rest_speed this long to count as rest
_STATE = mujoco.mjtState.mjSTATE_INTEGRATION
# Camera jitter per difficulty: (position offset m, rotation offset deg), uniform in +-range.
CAMERA_JITTER = {"easy": (0.04, 2.0), "hard": (0.1, 5.0)}


def as_rng(seed: int | np.random.Generator) -> np.random.Generator:
    """An explicit Generator from a seed (or the Generator itself, advanced in place)."""
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def check_difficulty(difficulty: str) -> str:
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty must be one of {DIFFICULTIES}, got {difficulty!r}")
    return difficulty


def sample_camera(
    rng: np.random.Generator, difficulty: str = "easy", ranges: tuple[float, float] | None = None
) -> dict[str, list[float]]:
    """Static per-episode offset of camera ``cam`` around its nominal pose in the scene XML, within
    ``ranges`` (position m, rotation deg) or else the difficulty's :data:`CAMERA_JITTER`."""
    dpos, drot = ranges or CAMERA_JITTER[difficulty]
    return {
        "pos_offset": rng.uniform(-dpos, dpos, size=3).tolist(),
        "rot_offset_deg": rng.uniform(-drot, drot, size=3).tolist(),  # about camera x, y, z
    }


def jitter_camera(model: mujoco.MjModel, camera: dict[str, Any]) -> None:
    """Offset camera ``cam`` by ``camera`` (from :func:`sample_camera`), rotating in its own frame."""
    cam = model.camera("cam")
    cam.pos += np.asarray(camera["pos_offset"])
    rotvec = np.deg2rad(np.asarray(camera["rot_offset_deg"]))
    angle = float(np.linalg.norm(rotvec))
    delta, out = np.zeros(4), np.zeros(4)
    mujoco.mju_axisAngle2Quat(delta, rotvec / max(angle, 1e-12), angle)
    mujoco.mju_mulQuat(out, cam.quat.copy(), delta)
    cam.quat[:] = out


def colours(
    n: int, rng: np.random.Generator, avoid_hue: float | None = None, spread: float = 0.05
) -> list[list[float]]:
    """``n`` saturated RGBA colours with hues spread around the wheel (optionally away from one), each
    hue jittered by up to ``spread``."""
    start = rng.uniform(0.0, 1.0) if avoid_hue is None else avoid_hue + 0.5 / max(n, 1) + 0.5 / (n + 1)
    step = n + (avoid_hue is not None)
    hues = [(start + k / step + rng.uniform(-spread, spread)) % 1.0 for k in range(n)]
    return [[*colorsys.hsv_to_rgb(h, rng.uniform(0.75, 1.0), rng.uniform(0.8, 1.0)), 1.0] for h in hues]


def sample_clutter(
    rng: np.random.Generator,
    n: int,
    keep_out: Sequence[tuple[float, float, float, float]],
    region: tuple[float, float, float, float] = (-0.7, 0.7, -0.1, 0.6),
    z0: float = 0.0,
) -> list[dict[str, Any]]:
    """``n`` static distractors standing at height ``z0`` in ``region``, outside the ``keep_out``
    boxes ``(x0, x1, y0, y1)`` where the action happens.

    Clutter is welded to the world (no degrees of freedom), so it costs collision checks only.
    """
    items: list[dict[str, Any]] = []
    for _ in range(200 * n):
        if len(items) == n:
            break
        x, y = rng.uniform(region[0], region[1]), rng.uniform(region[2], region[3])
        r = float(rng.uniform(0.03, 0.06))
        if any(x0 - r < x < x1 + r and y0 - r < y < y1 + r for x0, x1, y0, y1 in keep_out):
            continue
        if any(np.hypot(x - c["pos"][0], y - c["pos"][1]) < r + c["r"] + 0.02 for c in items):
            continue
        shape = str(rng.choice(["box", "cylinder", "sphere"]))
        grey = float(rng.uniform(0.35, 0.75))
        items.append({"shape": shape, "r": r, "pos": [float(x), float(y), z0 + r], "rgb": [grey] * 3})
    return items


def add_clutter(spec: mujoco.MjSpec, items: Sequence[dict[str, Any]]) -> None:
    """Add :func:`sample_clutter`'s shapes as static, unsaturated (grey) world geoms."""
    types = {"box": mujoco.mjtGeom.mjGEOM_BOX, "cylinder": mujoco.mjtGeom.mjGEOM_CYLINDER}
    for i, c in enumerate(items):
        gtype = types.get(c["shape"], mujoco.mjtGeom.mjGEOM_SPHERE)
        spec.worldbody.add_geom(
            name=f"clutter{i}", type=gtype, size=[c["r"], c["r"], c["r"]], pos=c["pos"], rgba=[*c["rgb"], 1]
        )


def add_free_box(
    spec: mujoco.MjSpec,
    name: str,
    pos: Sequence[float],
    yaw_deg: float,
    half_size: Sequence[float],
    rgba: Sequence[float],
    density: float,
    friction: float,
) -> None:
    """A free-floating box (body, joint and geom all called `name`), turned by `yaw_deg` about z."""
    yaw = np.deg2rad(yaw_deg)
    body = spec.worldbody.add_body(
        name=name, pos=pos, quat=[float(np.cos(yaw / 2)), 0, 0, float(np.sin(yaw / 2))]
    )
    body.add_freejoint(name=name)
    body.add_geom(
        name=name,
        type=mujoco.mjtGeom.mjGEOM_BOX,
        size=half_size,
        rgba=rgba,
        density=density,
        condim=3,
        friction=[friction, 0.005, 0.0001],
    )


def free_body_speeds(model: mujoco.MjModel, qvel: np.ndarray, size: float = 0.05) -> np.ndarray:
    """(K,) fastest free body per row of a (K, nv) qvel trace: |v| + ``size`` * |w| (m/s)."""
    best = np.zeros(qvel.shape[0])
    for j in np.flatnonzero(model.jnt_type == mujoco.mjtJoint.mjJNT_FREE):
        v = qvel[:, model.jnt_dofadr[j] : model.jnt_dofadr[j] + 6]
        best = np.maximum(best, np.linalg.norm(v[:, :3], axis=1) + size * np.linalg.norm(v[:, 3:], axis=1))
    return best


def motion_interval(speeds: np.ndarray, dt: float, rest_speed: float) -> tuple[float, float]:
    """``[first moving time, time at rest]`` from a speed trace sampled every ``dt`` seconds.

    Rest = speed below ``rest_speed`` for :data:`REST_WINDOW`; never at rest -> end of the trace.
    """
    moving = np.flatnonzero(speeds >= rest_speed)
    if moving.size == 0:
        return 0.0, 0.0
    start, last = int(moving[0]), int(moving[-1])
    window = round(REST_WINDOW / dt)
    end = (last + 1) * dt if last + window < speeds.size else (speeds.size - 1) * dt
    return round(start * dt, 6), round(end, 6)


class SceneWorld:
    """Gymnasium-shaped passive scene; subclasses define the scene (see the module docstring).

    ``reset(seed, **options) -> (obs, info)`` with ``info["params"]`` (JSON) and ``info["motion"]``
    ``[t0, t1]`` (s): the interval of irreversible motion, for choosing arrow-of-time clip windows.
    """

    scene: str = ""  # folder under sim/
    horizon: float = 4.0  # s simulated (and cached) at reset
    rest_speed: float = 0.02  # m/s
    frame_lag: int = 0  # physics steps between a frame's time and the state it shows

    def __init__(self, width: int = 128, height: int = 128, difficulty: str = "easy") -> None:
        self.width, self.height = width, height
        self.difficulty = check_difficulty(difficulty)
        self._base = mujoco.MjSpec.from_file(str(scene_path(self.scene)))
        self._renderer = FrameRenderer(width, height)
        self.model: mujoco.MjModel | None = None
        self.data: mujoco.MjData | None = None
        self.params: dict[str, Any] = {}
        self.info: dict[str, Any] = {}
        # rollout traces, one row per chunk boundary k (time k * CONTROL_DT)
        self._states = self._qpos = self._qvel = self._mocap = self._speeds = np.zeros((0, 0))
        self._interval = (0.0, 0.0)  # measured [first moving time, time at rest]

    # --- hooks ----------------------------------------------------------------------------------
    def sample_params(self, rng: np.random.Generator, difficulty: str, **options: Any) -> dict[str, Any]:
        raise NotImplementedError

    def build(self, spec: mujoco.MjSpec, params: dict[str, Any]) -> None:
        raise NotImplementedError

    def finalize(self, model: mujoco.MjModel, params: dict[str, Any]) -> None:
        """Edit the compiled model where a value needs derived quantities (inertia ...)."""

    def init_state(self, model: mujoco.MjModel, data: mujoco.MjData, params: dict[str, Any]) -> None:
        """Set t = 0 velocities (poses come from the spec); default: everything at rest."""

    def apply_events(self, model: mujoco.MjModel, data: mujoco.MjData, t: float) -> None:
        """Scripted edits at chunk boundary ``t`` (a multiple of CONTROL_DT); default: none."""

    def speeds(self, qpos: np.ndarray, qvel: np.ndarray) -> np.ndarray:
        """(K,) speed (m/s) per chunk from (K, nq) / (K, nv) traces: what "still moving" means."""
        del qpos
        return free_body_speeds(self.model, qvel)

    def extra_info(self) -> dict[str, Any]:
        """Scene-specific info from the rollout traces (``self._qpos``, ``self._qvel``, ...)."""
        return {}

    def motion(self) -> list[float]:
        """``info["motion"]``: the interval clip windows are drawn within; default: the measured one."""
        return list(self._interval)

    # --- episode --------------------------------------------------------------------------------
    def reset(self, seed: int | np.random.Generator, **options: Any) -> tuple[dict, dict]:
        """New episode; same seed and options -> same params, states and frames.

        Options: ``difficulty`` ("easy" | "hard", default: the constructor's) plus the scene's own options,
        or ``params``: replay a stored ``info["params"]`` exactly (nothing is drawn then). ``simulate``
        (s): simulate only that much now, for a caller that records no later frame (``record`` simulates
        the rest on demand, so the frames are the same); ``info["motion"]`` then covers only that span.
        """
        rng = as_rng(seed)
        difficulty = check_difficulty(options.pop("difficulty", self.difficulty))
        simulate = options.pop("simulate", None)
        replay = options.pop("params", None)
        if replay is not None:
            self.params = json.loads(json.dumps(replay))  # a private copy, JSON types only
        else:
            self.params = self.sample_params(rng, difficulty, **options)
        self.horizon = float(self.params.get("horizon", type(self).horizon))
        spec = self._base.copy()
        spec.visual.global_.offwidth = max(self.width, spec.visual.global_.offwidth)
        spec.visual.global_.offheight = max(self.height, spec.visual.global_.offheight)
        self.build(spec, self.params)
        self.model = spec.compile()
        self.finalize(self.model, self.params)
        jitter_camera(self.model, self.params["camera"])
        self._renderer.set_model(self.model)
        self._rollout(self.horizon if simulate is None else min(self.horizon, float(simulate)))
        self.data = self._data_at(0)
        self._interval = motion_interval(self._speeds, CONTROL_DT, self.rest_speed)
        self.info = {"params": self.params, "motion": self.motion(), **self.extra_info()}
        return self._obs(), self.info

    def _rollout(self, span: float) -> None:
        """Simulate ``span`` s (the horizon), caching the integration state and speed at every chunk."""
        model = self.model
        data = mujoco.MjData(model)
        self.init_state(model, data, self.params)
        mujoco.mj_forward(model, data)
        self.apply_events(model, data, 0.0)
        n_chunks = max(1, round(span / CONTROL_DT))
        n_sub = round(CONTROL_DT / model.opt.timestep)
        states = np.empty((n_chunks + 1, mujoco.mj_stateSize(model, _STATE)))
        qpos, qvel = np.empty((n_chunks + 1, model.nq)), np.empty((n_chunks + 1, model.nv))
        mocap = np.empty((n_chunks + 1, model.nmocap, 3))
        for k in range(n_chunks + 1):
            if k:
                mujoco.mj_step(model, data, nstep=n_sub)
                self.apply_events(model, data, round(k * CONTROL_DT, 6))
            mujoco.mj_getState(model, data, states[k], _STATE)
            qpos[k], qvel[k], mocap[k] = data.qpos, data.qvel, data.mocap_pos
        self._states, self._qpos, self._qvel, self._mocap = states, qpos, qvel, mocap
        self._speeds = self.speeds(qpos, qvel)

    def _data_at(self, k: int) -> mujoco.MjData:
        data = mujoco.MjData(self.model)
        mujoco.mj_setState(self.model, data, self._states[k], _STATE)
        mujoco.mj_forward(self.model, data)
        return data

    def _obs(self) -> dict[str, Any]:
        d = self.data
        return {"qpos": d.qpos.copy(), "qvel": d.qvel.copy(), "time": float(d.time)}

    def step(self, action: Any = None) -> tuple[dict, float, bool, bool, dict]:
        """Advance CONTROL_DT s (events included); terminated once at rest after the motion."""
        del action  # passive scene
        if self.model is None or self.data is None:
            raise RuntimeError("call reset() before step()")
        mujoco.mj_step(self.model, self.data, nstep=round(CONTROL_DT / self.model.opt.timestep))
        t = round(self.data.time, 6)
        self.apply_events(self.model, self.data, t)
        mujoco.mj_forward(self.model, self.data)  # poses of the new state (for obs and render)
        t_rest = self._interval[1]
        terminated = t_rest < self.horizon and t >= t_rest - 1e-9
        truncated = not terminated and t >= self.horizon - 1e-9
        speed = float(self.speeds(self.data.qpos[None], self.data.qvel[None])[0])
        return self._obs(), 0.0, terminated, truncated, {"speed": speed}

    def render(self) -> np.ndarray:
        """(H, W, 3) uint8 frame of the current state from camera ``cam``."""
        if self.model is None or self.data is None:
            raise RuntimeError("call reset() before render()")
        return self._renderer.render(self.data, "cam")

    def record(self, times: Sequence[float]) -> np.ndarray:
        """(T, H, W, 3) uint8 frames at ``times`` (s, ascending); renders only those T frames.

        Each frame restores the cached state at or before its time and steps the remainder, so
        the episode's own state (``step``) is untouched. Times past the horizon extend the cache.
        """
        return self.record_observed(times)[0]

    def record_observed(
        self, times: Sequence[float], observe: Callable[[mujoco.MjModel, mujoco.MjData], Any] | None = None
    ) -> tuple[np.ndarray, list]:
        """`record`, plus `observe(model, data)` at each frame's state (the simulator's ground truth for
        what the frame shows); the list is empty without `observe`."""
        if self.model is None:
            raise RuntimeError("call reset() before record()")
        t = np.asarray(times, dtype=float)
        if t.ndim != 1 or (t.size and (t[0] < 0 or np.any(np.diff(t) < 0))):
            raise ValueError("times must be a 1-D ascending sequence of non-negative seconds")
        model, model_dt = self.model, self.model.opt.timestep
        n_sub = round(CONTROL_DT / model_dt)
        frames = np.empty((t.size, self.height, self.width, 3), dtype=np.uint8)
        data = mujoco.MjData(model)
        seen: list = []
        for i, ti in enumerate(t):
            target = max(0, round(ti / model_dt) - self.frame_lag)  # physics steps since t = 0
            k = target // n_sub
            if k >= len(self._states):
                self._extend(k)
            mujoco.mj_setState(model, data, self._states[k], _STATE)
            if target > k * n_sub:
                mujoco.mj_step(model, data, nstep=target - k * n_sub)
            mujoco.mj_kinematics(model, data)  # poses of exactly this state, not the pre-step ones
            mujoco.mj_camlight(model, data)
            frames[i] = self._renderer.render(data, "cam")
            if observe is not None:
                seen.append(observe(model, data))
        return frames, seen

    def _extend(self, k: int) -> None:
        """Continue the cached rollout past the horizon up to chunk ``k`` (events still fire)."""
        model, n = self.model, len(self._states)
        data = mujoco.MjData(model)
        mujoco.mj_setState(model, data, self._states[-1], _STATE)
        more = np.empty((k + 1 - n, self._states.shape[1]))
        n_sub = round(CONTROL_DT / model.opt.timestep)
        for j in range(k + 1 - n):
            mujoco.mj_step(model, data, nstep=n_sub)
            self.apply_events(model, data, round((n + j) * CONTROL_DT, 6))
            mujoco.mj_getState(model, data, more[j], _STATE)
        self._states = np.concatenate([self._states, more])

    def close(self) -> None:
        """Release model-bound GL resources (the process-wide GL context is kept for reuse)."""
        self._renderer.close()
        self.model = self.data = None


G = 9.81  # m/s^2, matches MuJoCo's default gravity in every scene


def sliding_distance(v0: float, mu: float) -> float:
    """Coulomb friction stopping distance v0^2 / (2 mu g) of a block sliding on a flat floor (m)."""
    return v0**2 / (2.0 * mu * G)


def rolling_deceleration(mu_roll: float, radius: float) -> float:
    """Deceleration (m/s^2) of a solid ball rolling without slipping against rolling friction.

    MuJoCo's rolling friction is a torque up to ``mu_roll * N`` (``mu_roll`` in metres); with
    I = 2/5 m r^2 the ball decelerates at 5 mu_roll g / (7 r).
    """
    return 5.0 * mu_roll * G / (7.0 * radius)


def rigid_rotation(
    model: mujoco.MjModel, data: mujoco.MjData, bodies: Sequence[int], pivot: np.ndarray, omega: np.ndarray
) -> None:
    """Give free ``bodies`` the velocities of one rigid body turning at ``omega`` (rad/s, world)
    about the point ``pivot`` (a push that tips a tower or a domino about its bottom edge).

    ``data`` must hold current poses (run ``mj_kinematics`` first). A free joint's linear velocity
    is that of the body frame's origin in world coordinates; its angular velocity is in body axes.
    """
    for b in bodies:
        dof = model.jnt_dofadr[model.body_jntadr[b]]
        data.qvel[dof : dof + 3] = np.cross(omega, data.xpos[b] - pivot)
        data.qvel[dof + 3 : dof + 6] = data.xmat[b].reshape(3, 3).T @ omega


def tipping_speed(
    model: mujoco.MjModel, data: mujoco.MjData, bodies: Sequence[int], pivot: np.ndarray, axis: np.ndarray
) -> float:
    """Smallest angular speed (rad/s) about the horizontal ``axis`` through ``pivot`` that tips
    ``bodies`` (as one rigid body) over the pivot edge: (1/2) I w^2 = M g (lift of the centre of mass).
    """
    axis = axis / np.linalg.norm(axis)
    mass = sum(model.body_mass[b] for b in bodies)
    com = sum(model.body_mass[b] * data.xipos[b] for b in bodies) / mass
    rel = com - pivot
    arm = rel - axis * (rel @ axis)  # centre of mass relative to the axis, perpendicular to it
    lift = np.linalg.norm(arm) - arm[2]  # it rises until it is straight above the edge
    inertia = 0.0
    for b in bodies:
        rot = data.ximat[b].reshape(3, 3)
        i_world = rot @ np.diag(model.body_inertia[b]) @ rot.T
        r = data.xipos[b] - pivot
        r_perp = r - axis * (r @ axis)
        inertia += axis @ i_world @ axis + model.body_mass[b] * (r_perp @ r_perp)
    return float(np.sqrt(2.0 * mass * G * lift / inertia))
