"""Dominoes world: a row of standing dominoes; the first is tipped and the chain falls.

Irreversible: each falling domino converts potential energy into the next one's motion and into
heat; forward, an upright row falls one after the other into a slanted pile; reversed, a pile
would stand itself up from the far end.

The first domino turns at t = 0 about its bottom front edge at ``push`` times the angular speed
that just tips it (:func:`embodied.worlds.base.tipping_speed`). Spacing is 45-65% of the domino
height, inside the range where a chain propagates (a spacing above the height breaks it). Contacts
use MuJoCo's default critically damped solref (see ``sim/dominoes/scene.xml``).

``difficulty`` (see :data:`RANGES`): easy = 6-8 large dominoes (18-22 cm tall) in a straight row;
hard = 9-12 smaller ones (12-16 cm) on a gently curved row, 2-4 static distractors, larger camera
jitter. Dominoes keep real proportions (width 0.45 x height, thickness 0.15 x height).
"""

from __future__ import annotations

from typing import Any

import mujoco
import numpy as np

from embodied.worlds.base import (
    SceneWorld,
    add_clutter,
    colours,
    rigid_rotation,
    sample_camera,
    sample_clutter,
    tipping_speed,
)

RANGES = {
    "easy": {"n": (6, 8), "height": (0.18, 0.22), "curve": 0.0},
    "hard": {"n": (9, 12), "height": (0.12, 0.16), "curve": 0.5},
}
SPACING = (0.45, 0.65)  # centre distance / domino height
PUSH = (1.1, 1.5)


def sample_params(rng: np.random.Generator, difficulty: str) -> dict[str, Any]:
    """One episode's JSON parameters: domino size, poses along the row, colours, push."""
    r = RANGES[difficulty]
    n = int(rng.integers(r["n"][0], r["n"][1] + 1))
    height = float(rng.uniform(*r["height"]))
    half = [0.075 * height, 0.225 * height, 0.5 * height]  # thickness along the row, width, height
    spacing = float(rng.uniform(*SPACING)) * height
    sign = 1.0 if rng.random() < 0.5 else -1.0  # the chain runs towards +x or -x
    curve = float(rng.uniform(-r["curve"], r["curve"]))  # y = curve * x^2 (1/m)
    y0 = float(rng.uniform(0.05, 0.2))
    # Walk along the curve in steps of `spacing` (arc length), from one end to the other.
    xs = [-sign * (n - 1) * spacing / 2]
    for _ in range(n - 1):
        slope = 2 * curve * xs[-1]
        xs.append(xs[-1] + sign * spacing / np.sqrt(1 + slope**2))
    pair = colours(2, rng)
    dominoes = [
        {
            "pos": [float(x), y0 + curve * float(x) ** 2, half[2]],
            "yaw_deg": float(np.rad2deg(np.arctan(2 * curve * x))),
            "rgba": pair[i % 2],
        }
        for i, x in enumerate(xs)
    ]
    n_clutter = int(rng.integers(2, 5)) if difficulty == "hard" else 0
    span = abs(xs[-1] - xs[0]) / 2 + 0.25
    return {
        "difficulty": difficulty,
        "half_size": half,
        "spacing": spacing,
        "dominoes": dominoes,
        "direction": sign,
        "push": float(rng.uniform(*PUSH)),
        "friction": float(rng.uniform(0.3, 0.5)),  # domino on domino (floor: 0.6, the max wins)
        "camera": sample_camera(rng, difficulty),
        "clutter": sample_clutter(rng, n_clutter, [(-span, span, y0 - 0.25, y0 + 0.25)]),
    }


class DominoesWorld(SceneWorld):
    """A chain of falling dominoes; ``reset(seed, difficulty=...)``; ``info["fallen"]``: count."""

    scene = "dominoes"
    horizon = 2.5

    def sample_params(self, rng: np.random.Generator, difficulty: str, **options: Any) -> dict[str, Any]:
        if options:
            raise TypeError(f"unknown dominoes options {sorted(options)}")
        return sample_params(rng, difficulty)

    def build(self, spec: mujoco.MjSpec, params: dict[str, Any]) -> None:
        for i, d in enumerate(params["dominoes"]):
            yaw = np.deg2rad(d["yaw_deg"])
            body = spec.worldbody.add_body(
                name=f"domino{i}", pos=d["pos"], quat=[float(np.cos(yaw / 2)), 0, 0, float(np.sin(yaw / 2))]
            )
            body.add_freejoint(name=f"domino{i}")
            body.add_geom(
                name=f"domino{i}",
                type=mujoco.mjtGeom.mjGEOM_BOX,
                size=params["half_size"],
                rgba=d["rgba"],
                density=700.0,  # wood
                condim=3,
                friction=[params["friction"], 0.005, 0.0001],
            )
        add_clutter(spec, params["clutter"])

    def init_state(self, model: mujoco.MjModel, data: mujoco.MjData, params: dict[str, Any]) -> None:
        mujoco.mj_kinematics(model, data)
        first = model.body("domino0").id
        yaw = np.deg2rad(params["dominoes"][0]["yaw_deg"])
        along = params["direction"] * np.array([np.cos(yaw), np.sin(yaw), 0.0])  # towards the row
        pivot = data.xpos[first] + along * params["half_size"][0] - [0.0, 0.0, params["half_size"][2]]
        axis = np.cross([0.0, 0.0, 1.0], along)  # turning about it tips the top along `along`
        omega = params["push"] * tipping_speed(model, data, [first], pivot, axis)
        rigid_rotation(model, data, [first], pivot, omega * axis)

    def extra_info(self) -> dict[str, Any]:
        """``fallen``: dominoes tilted over 30 degrees at the end of the rollout."""
        quat = self._qpos[-1].reshape(-1, 7)[:, 3:7]
        # tilt of the body z axis from vertical: cos = 1 - 2 (qx^2 + qy^2)
        cos_tilt = 1 - 2 * (quat[:, 1] ** 2 + quat[:, 2] ** 2)
        return {"fallen": int(np.sum(cos_tilt < np.cos(np.deg2rad(30))))}
