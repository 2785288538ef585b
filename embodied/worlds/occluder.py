"""Occluder world: an object rolls or slides behind a screen and stops; the screen is lifted away.

Backs the object-permanence question family. One episode, in time order::

    0 ............ object enters from the left or right, rolls (ball) or slides (cube, puck)
    hidden[0] .... object fully behind the screen (it comes to rest there)
    edit_time .... impossible outcomes edit the state here, while the object is hidden
    lift[0] ...... the screen starts rising; lift[1]: it is out of view
    reveal_time .. the place where physics says the object is is fully visible again

``reset(seed, outcome=..., difficulty=...)``; ``outcome`` in :data:`OUTCOMES`:

* ``possible``: nothing is edited; the object is revealed where it came to rest.
* ``vanished``: the object is removed (parked far out of view); the revealed place is empty.
* ``teleported``: the object is moved to another spot behind the screen (>= 0.15 m away), at rest.
* ``changed``: the object is swapped for its twin at the same pose: another colour (hue opposite)
  and, half of the time (``params["twin"]["shape"]``), another shape.

The same seed gives the same scene, trajectory and frames for every outcome up to ``edit_time``
(all random draws are made whatever the outcome), so outcomes are matched pairs.

``info`` (times in s, positions in m, world frame, floor at z = 0)::

    params       JSON scene parameters (object, twin, screen, times, camera, clutter)
    motion       [t0, t1]: the object's roll/slide until rest (irreversible motion)
    outcome      the outcome name
    hidden       [t0, t1]: the expected object is fully hidden (same for every outcome)
    edit_time    when an impossible outcome's edit happens (inside ``hidden``)
    lift         [t0, t1]: the screen moves up and out of view
    reveal_time  first time the expected object is fully visible again (>= lift[0])
    expected     {"pos", "shape", "rgba"}: what physics says is there after the reveal
    revealed     {"pos", "shape", "rgba"} actually there after the reveal, or None (vanished)

"Hidden"/"visible" are computed geometrically from the (jittered) camera: every corner of the
object's bounding cube projects inside the screen's front face / the object's projected box does
not overlap the screen's. Frames at ``t < edit_time`` are identical across outcomes; frames at
``t >= reveal_time`` show the difference.
"""

from __future__ import annotations

import colorsys
from typing import Any

import mujoco
import numpy as np

from embodied.worlds.base import (
    CONTROL_DT,
    SceneWorld,
    add_clutter,
    colours,
    rolling_deceleration,
    sample_camera,
    sample_clutter,
)

OUTCOMES = ("possible", "vanished", "teleported", "changed")
SHAPES = ("sphere", "box", "cylinder")  # sphere rolls, box and upright cylinder slide
SLIDE_MU = (0.1, 0.3)  # sliding friction: plastic or wood on a smooth table
ROLL_CRR = (0.05, 0.1)  # rolling resistance mu_roll / r: a ball on a mat or carpet
RADIUS = {"easy": (0.06, 0.075), "hard": (0.045, 0.06)}  # object half-extent (m)
START_X = 0.52  # |x| at release
LIFT_HEIGHT, LIFT_TIME = 1.3, 0.5  # screen rises 1.3 m in 0.5 s: out of the top of the frame
PARK = (30.0, 0.0)  # far out of view: where removed / unused bodies rest
_TYPES = {s: getattr(mujoco.mjtGeom, f"mjGEOM_{s.upper()}") for s in SHAPES}


def _snap(t: float) -> float:
    """Round up to a chunk boundary: events fire at multiples of CONTROL_DT."""
    return round(float(np.ceil(t / CONTROL_DT - 1e-9)) * CONTROL_DT, 6)


def _geom_size(shape: str, r: float) -> list[float]:
    # Every shape rests with its centre at z = r, so swapping shapes keeps the pose valid.
    return {"sphere": [r, 0, 0], "box": [r, r, r], "cylinder": [r, r, 0]}[shape]


def sample_params(rng: np.random.Generator, difficulty: str) -> dict[str, Any]:
    """One episode's JSON parameters; the draws do not depend on the outcome (matched pairs)."""
    r = float(rng.uniform(*RADIUS[difficulty]))
    shape = str(rng.choice(SHAPES))
    width = float(rng.uniform(0.55, 0.7))
    screen = {"x": float(rng.uniform(-0.1, 0.1)), "y": -0.05, "width": width, "height": 0.32}
    y = float(rng.uniform(0.15, 0.3))
    direction = 1.0 if rng.random() < 0.5 else -1.0  # +1: enters from the left
    slack = width / 2 - r - 0.05  # keep the whole object behind the screen at rest
    u = float(rng.uniform(0.5, 0.85)) * (1.0 if rng.random() < 0.5 else -1.0)
    rest_x, teleport_x = screen["x"] + u * slack, screen["x"] - u * slack
    dist = abs(rest_x - (-direction * START_X))
    if shape == "sphere":
        mu_roll = float(rng.uniform(*ROLL_CRR)) * r
        decel, friction = rolling_deceleration(mu_roll, r), [0.8, 0.001, mu_roll]
    else:
        mu = float(rng.uniform(*SLIDE_MU))
        decel, friction = mu * 9.81, [mu, 0.001, 0.0001]
    v0 = float(np.sqrt(2 * decel * dist))
    rgba, twin_rgba = _object_colours(rng)
    other = [s for s in SHAPES if s != shape]
    twin_shape = str(rng.choice(other)) if rng.random() < 0.5 else shape
    t_edit = _snap(v0 / decel + float(rng.uniform(0.3, 0.6)))
    t_lift = _snap(t_edit + float(rng.uniform(0.2, 0.5)))
    n_clutter = int(rng.integers(2, 5)) if difficulty == "hard" else 0
    clutter = sample_clutter(rng, n_clutter, [(-1.0, 1.0, -0.3, y + 0.12)])
    return {
        "difficulty": difficulty,
        "object": {
            "shape": shape,
            "size": _geom_size(shape, r),
            "radius": r,
            "rgba": rgba,
            "pos": [-direction * START_X, y, r],
            "yaw_deg": float(rng.uniform(-20, 20)),
            "linvel": [direction * v0, 0.0, 0.0],
            "friction": friction,
            "density": float(rng.uniform(300.0, 900.0)),
        },
        "twin": {"shape": twin_shape, "size": _geom_size(twin_shape, r), "rgba": twin_rgba},
        "screen": screen,
        "screen_rgba": [*(float(c) for c in rng.uniform(0.35, 0.55, size=3)), 1.0],
        "teleport_x": float(teleport_x),
        "edit_time": t_edit,
        "lift": [t_lift, round(t_lift + LIFT_TIME, 6)],
        "horizon": _snap(t_lift + LIFT_TIME + 1.0),
        "camera": sample_camera(rng, difficulty),
        "clutter": clutter,
    }


def _object_colours(rng: np.random.Generator) -> tuple[list[float], list[float]]:
    """A saturated colour and its twin's, with the hue turned half way round the wheel."""
    (rgba,) = colours(1, rng)
    h, s, v = colorsys.rgb_to_hsv(*rgba[:3])
    twin = [*colorsys.hsv_to_rgb((h + 0.5) % 1.0, s, v), 1.0]
    return [float(c) for c in rgba], [float(c) for c in twin]


class OccluderWorld(SceneWorld):
    """Object permanence scene; see the module docstring for the timeline and ``info`` keys."""

    scene = "occluder"

    def reset(self, seed: int | np.random.Generator, **options: Any) -> tuple[dict, dict]:
        """``options``: ``outcome`` (default "possible"), ``difficulty``, or ``params`` (replay).

        Scenes are redrawn from the same generator until the object is hidden at rest at the
        edit time (rare misses: rolling balls creep; deterministic for a seed either way).
        Replayed ``params`` take the given ``outcome`` if any, else their own.
        """
        replay = options.get("params")
        outcome = options.pop("outcome", replay["outcome"] if replay is not None else "possible")
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
        self._outcome = outcome
        if replay is not None:
            options["params"] = {**replay, "outcome": outcome}
        rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        for _ in range(1 if replay is not None else 20):
            obs, info = super().reset(rng, **dict(options))
            if info.pop("valid") or replay is not None:
                return obs, info
        raise RuntimeError("occluder: no valid scene in 20 draws; check the parameter ranges")

    def sample_params(self, rng: np.random.Generator, difficulty: str, **options: Any) -> dict[str, Any]:
        if options:
            raise TypeError(f"unknown occluder options {sorted(options)}")
        params = sample_params(rng, difficulty)
        params["outcome"] = self._outcome
        return params

    def build(self, spec: mujoco.MjSpec, params: dict[str, Any]) -> None:
        obj, twin, s = params["object"], params["twin"], params["screen"]
        yaw = np.deg2rad(obj["yaw_deg"])
        quat = [float(np.cos(yaw / 2)), 0.0, 0.0, float(np.sin(yaw / 2))]
        r = obj["radius"]
        for name, shape, size, rgba, pos, q in (
            ("obj", obj["shape"], obj["size"], obj["rgba"], obj["pos"], quat),
            ("twin", twin["shape"], twin["size"], twin["rgba"], [PARK[0] + 3, PARK[1], r], [1, 0, 0, 0]),
        ):
            body = spec.worldbody.add_body(name=name, pos=pos, quat=q)
            body.add_freejoint(name=name)
            body.add_geom(
                name=name,
                type=_TYPES[shape],
                size=size,
                rgba=rgba,
                density=obj["density"],
                condim=6 if shape == "sphere" else 3,  # rolling friction needs condim 6
                friction=obj["friction"] if shape == obj["shape"] else _twin_friction(shape),
            )
        screen = spec.worldbody.add_body(name="screen", mocap=True, pos=[s["x"], s["y"], s["height"] / 2])
        screen.add_geom(
            name="screen",
            type=mujoco.mjtGeom.mjGEOM_BOX,
            size=[s["width"] / 2, 0.01, s["height"] / 2],
            rgba=params["screen_rgba"],
            contype=0,  # a visual screen: the object passes behind it, never through it
            conaffinity=0,
        )
        add_clutter(spec, params["clutter"])

    def init_state(self, model: mujoco.MjModel, data: mujoco.MjData, params: dict[str, Any]) -> None:
        obj = params["object"]
        data.qvel[0:3] = obj["linvel"]
        if obj["shape"] == "sphere":  # start rolling without slipping: w = v / r about -x cross z
            r = obj["radius"]
            rot = np.zeros(9)
            mujoco.mju_quat2Mat(rot, data.qpos[3:7])
            w_world = np.array([0.0, obj["linvel"][0] / r, 0.0])
            data.qvel[3:6] = rot.reshape(3, 3).T @ w_world  # free joint: angular velocity in body frame

    def apply_events(self, model: mujoco.MjModel, data: mujoco.MjData, t: float) -> None:
        p = self.params
        s, (t0, t1) = p["screen"], p["lift"]
        a = min(max((t - t0) / (t1 - t0), 0.0), 1.0)
        data.mocap_pos[0] = [s["x"], s["y"], s["height"] / 2 + LIFT_HEIGHT * a * a * (3 - 2 * a)]
        if a >= 1.0:  # out of view: park it too, or its thin shadow stays on the floor
            data.mocap_pos[0, :2] = PARK
        if abs(t - p["edit_time"]) < 1e-6 and p["outcome"] != "possible":
            self._edit(data, p)

    @staticmethod
    def _edit(data: mujoco.MjData, p: dict[str, Any]) -> None:
        r, outcome = p["object"]["radius"], p["outcome"]
        pos, quat = data.qpos[0:3].copy(), data.qpos[3:7].copy()
        data.qvel[:] = 0.0
        if outcome == "teleported":
            data.qpos[0] = p["teleport_x"]
            return
        data.qpos[0:7] = [PARK[0], PARK[1], r, 1, 0, 0, 0]  # vanished and changed: remove it
        if outcome == "changed":
            data.qpos[7:10] = pos
            data.qpos[10:14] = quat if p["twin"]["shape"] == p["object"]["shape"] else [1, 0, 0, 0]

    def speeds(self, qpos: np.ndarray, qvel: np.ndarray) -> np.ndarray:
        return np.linalg.norm(qvel[:, 0:3], axis=1)  # the moving object only

    def extra_info(self) -> dict[str, Any]:
        ok = bool(self._speeds[round(self.params["edit_time"] / CONTROL_DT)] < self.rest_speed)
        info = occlusion_info(self.model, self._qpos[:, 0:3], self._mocap[:, 0], self.params)
        info["valid"] = info["valid"] and ok
        return info


def _twin_friction(shape: str) -> list[float]:
    return [0.8, 0.001, 0.005] if shape == "sphere" else [0.3, 0.001, 0.0001]


def pixels(model: mujoco.MjModel, points: np.ndarray, width: int, height: int) -> np.ndarray:
    """(N, 3) world points -> (N, 2) pixel (column, row) in a ``width`` x ``height`` frame of ``cam``."""
    uv = _project(model, np.atleast_2d(np.asarray(points, dtype=float)))
    # fovy spans the height; the horizontal extent scales with the aspect ratio
    col = (uv[:, 0] * height / width + 1.0) / 2.0 * width
    row = (1.0 - uv[:, 1]) / 2.0 * height
    return np.stack([col, row], axis=1)


def _project(model: mujoco.MjModel, points: np.ndarray) -> np.ndarray:
    """(..., 3) world points -> (..., 2) image coordinates in units of tan(fovy / 2) (y up)."""
    cam = model.camera("cam")
    rot = np.zeros(9)
    mujoco.mju_quat2Mat(rot, cam.quat)
    q = (points - cam.pos) @ rot.reshape(3, 3)  # camera-frame coordinates (x right, y up, -z forward)
    depth = np.maximum(-q[..., 2:], 1e-6)
    return q[..., :2] / depth / np.tan(np.deg2rad(cam.fovy[0]) / 2)


_SIGNS = np.array([[i, j, k] for i in (-1, 1) for j in (-1, 1) for k in (-1, 1)], dtype=float)
_FRONT = [0, 1, 5, 4]  # corners (-x, -z), (-x, +z), (+x, +z), (+x, -z) of the y = -half face


def _corners(centre: np.ndarray, half: np.ndarray) -> np.ndarray:
    """(..., 8, 3) corners of boxes with centres (..., 3) and half-extents (3,)."""
    return np.asarray(centre)[..., None, :] + _SIGNS * half


def _inside(points: np.ndarray, quad: np.ndarray) -> np.ndarray:
    """(...,) whether all points (..., N, 2) lie in the convex quads (..., 4, 2), either winding."""
    edges = np.roll(quad, -1, axis=-2) - quad
    rel = points[..., :, None, :] - quad[..., None, :, :]
    cross = edges[..., None, :, 0] * rel[..., 1] - edges[..., None, :, 1] * rel[..., 0]
    return np.all(cross >= 0, axis=(-2, -1)) | np.all(cross <= 0, axis=(-2, -1))


def occlusion_info(
    model: mujoco.MjModel, obj_pos: np.ndarray, screen_pos: np.ndarray, p: dict[str, Any]
) -> dict[str, Any]:
    """Hidden interval, reveal time and expected/revealed objects from the rollout traces.

    ``obj_pos`` (K, 3) and ``screen_pos`` (K, 3) are the object's and screen's centres per chunk.
    """
    r, s = p["object"]["radius"], p["screen"]
    k_edit = round(p["edit_time"] / CONTROL_DT)
    # The expected object: the real one until the edit (state k_edit is already edited), then it
    # stays where it rested (it is below rest speed: < 0.4 mm per chunk).
    expected = obj_pos.copy()
    expected[k_edit:] = obj_pos[k_edit - 1]
    half_obj = np.full(3, r)
    half_scr = np.array([s["width"] / 2, 0.01, s["height"] / 2])
    obj_uv = _project(model, _corners(expected, half_obj))  # (K, 8, 2)
    scr_uv = _project(model, _corners(screen_pos, half_scr))
    hidden = _inside(obj_uv, scr_uv[:, _FRONT])
    overlap = np.all(obj_uv.max(1) > scr_uv.min(1), axis=1) & np.all(obj_uv.min(1) < scr_uv.max(1), axis=1)
    visible = ~overlap & np.all(np.abs(obj_uv) < 1.0, axis=(1, 2))
    k0 = k1 = k_edit  # the hidden interval is the run of hidden chunks around the edit
    while k0 > 0 and hidden[k0 - 1]:
        k0 -= 1
    while k1 + 1 < len(hidden) and hidden[k1 + 1]:
        k1 += 1
    k_lift = round(p["lift"][0] / CONTROL_DT)
    after = np.flatnonzero(visible[k_lift:])
    k_reveal = k_lift + int(after[0]) if after.size else len(visible) - 1
    rest = expected[k_edit]
    tele = rest.copy()
    tele[0] = p["teleport_x"]
    tele_hidden = _inside(_project(model, _corners(tele, half_obj)), scr_uv[k_edit, _FRONT])
    obj, twin = p["object"], p["twin"]
    exp = {"pos": rest.tolist(), "shape": obj["shape"], "rgba": obj["rgba"]}
    revealed = {
        "possible": exp,
        "vanished": None,
        "teleported": {**exp, "pos": tele.tolist()},
        "changed": {"pos": rest.tolist(), "shape": twin["shape"], "rgba": twin["rgba"]},
    }[p["outcome"]]
    return {
        "outcome": p["outcome"],
        "hidden": [round(k0 * CONTROL_DT, 6), round(k1 * CONTROL_DT, 6)],
        "edit_time": p["edit_time"],
        "lift": p["lift"],
        "reveal_time": round(k_reveal * CONTROL_DT, 6),
        "expected": exp,
        "revealed": revealed,
        "valid": bool(hidden[k_edit] and tele_hidden and visible[-1]),
    }
