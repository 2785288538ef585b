"""Topple world: a tower of stacked blocks is pushed over, falls and scatters on the floor.

Irreversible because the fall turns potential energy into heat in contacts and friction: forward,
an upright stack tips, falls and its blocks come to rest scattered; reversed, scattered blocks would
jump up and assemble into a tower.

The push: at t = 0 the whole tower turns as one rigid body about the bottom block's edge (on the
floor, on the side it falls to) at ``push`` times the smallest angular speed that tips it over that
edge (:func:`embodied.worlds.base.tipping_speed`, from MuJoCo's masses and inertias), so every
episode topples, with ``push`` setting how violently. Levels are offset a little (an untidy stack).
Contacts use MuJoCo's default critically damped solref (no bounce, see ``sim/topple/scene.xml``).

``difficulty`` (see :data:`RANGES`): easy = 3-5 large blocks (half-width 5-6.5 cm), push 1.3-1.8x;
hard = 5-7 smaller blocks (3.5-5 cm), push 1.1-1.4x (a slower start), 2-4 static distractors,
larger camera jitter.
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
    "easy": {"n": (3, 5), "half": (0.05, 0.065), "push": (1.3, 1.8)},
    "hard": {"n": (5, 7), "half": (0.035, 0.05), "push": (1.1, 1.4)},
}
FRICTION = (0.5, 0.8)  # wood on wood / on a floor


def sample_params(rng: np.random.Generator, difficulty: str) -> dict[str, Any]:
    """One episode's JSON parameters: the stack (sizes, offsets, colours) and the push."""
    r = RANGES[difficulty]
    n = int(rng.integers(r["n"][0], r["n"][1] + 1))
    a = float(rng.uniform(*r["half"]))
    half = [a, a * float(rng.uniform(0.8, 1.0)), a * float(rng.uniform(0.6, 0.9))]
    sign = 1.0 if rng.random() < 0.5 else -1.0  # falls towards +x or -x
    base = [-sign * float(rng.uniform(0.1, 0.25)), float(rng.uniform(0.0, 0.15))]
    blocks, z = [], 0.0
    for i, rgba in enumerate(colours(n, rng)):
        dx, dy = (0.0, 0.0) if i == 0 else rng.uniform([-0.15 * a, -0.1 * a], [0.15 * a, 0.1 * a])
        z += half[2]
        blocks.append(
            {
                "pos": [base[0] + float(dx), base[1] + float(dy), z],
                "yaw_deg": float(rng.uniform(-8.0, 8.0)) if i else 0.0,
                "rgba": rgba,
            }
        )
        z += half[2]
    n_clutter = int(rng.integers(2, 5)) if difficulty == "hard" else 0
    fall = (min(base[0], base[0] + sign * 0.8), max(base[0], base[0] + sign * 0.8))
    keep_out = [(fall[0] - 0.1, fall[1] + 0.1, base[1] - 0.25, base[1] + 0.25)]
    return {
        "difficulty": difficulty,
        "half_size": half,
        "blocks": blocks,
        "direction": sign,
        "push": float(rng.uniform(*r["push"])),
        "friction": float(rng.uniform(*FRICTION)),
        "density": float(rng.uniform(400.0, 800.0)),
        "camera": sample_camera(rng, difficulty),
        "clutter": sample_clutter(rng, n_clutter, keep_out),
    }


class ToppleWorld(SceneWorld):
    """A pushed tower of blocks; ``reset(seed, difficulty=...)``."""

    scene = "topple"
    horizon = 3.0

    def sample_params(self, rng: np.random.Generator, difficulty: str, **options: Any) -> dict[str, Any]:
        if options:
            raise TypeError(f"unknown topple options {sorted(options)}")
        return sample_params(rng, difficulty)

    def build(self, spec: mujoco.MjSpec, params: dict[str, Any]) -> None:
        for i, b in enumerate(params["blocks"]):
            yaw = np.deg2rad(b["yaw_deg"])
            body = spec.worldbody.add_body(
                name=f"block{i}", pos=b["pos"], quat=[float(np.cos(yaw / 2)), 0, 0, float(np.sin(yaw / 2))]
            )
            body.add_freejoint(name=f"block{i}")
            body.add_geom(
                name=f"block{i}",
                type=mujoco.mjtGeom.mjGEOM_BOX,
                size=params["half_size"],
                rgba=b["rgba"],
                density=params["density"],
                condim=3,
                friction=[params["friction"], 0.005, 0.0001],
            )
        add_clutter(spec, params["clutter"])

    def init_state(self, model: mujoco.MjModel, data: mujoco.MjData, params: dict[str, Any]) -> None:
        mujoco.mj_kinematics(model, data)
        bodies = [model.body(f"block{i}").id for i in range(len(params["blocks"]))]
        sign, base = params["direction"], params["blocks"][0]["pos"]
        pivot = np.array([base[0] + sign * params["half_size"][0], base[1], 0.0])
        axis = np.array([0.0, sign, 0.0])  # right-handed: +y turns the top towards +x
        omega = params["push"] * tipping_speed(model, data, bodies, pivot, axis)
        rigid_rotation(model, data, bodies, pivot, omega * axis)
