"""Slide world: a block pushed along a table slides to rest on Coulomb friction.

Irreversible because friction turns the block's kinetic energy into heat: forward, the block
decelerates uniformly (a = mu g) and stops; reversed, a resting block would set off by itself and
speed up. The block starts at t = 0 already moving (the push is not shown).

Calibration (``sim/slide/scene.xml``: 4 ms timestep, elliptic friction cones, table friction below
the block's so MuJoCo's max() rule picks the block's ``mu``): the stopping distance matches
v0^2 / (2 mu g) to within 1% (measured 0.3-0.8% short for mu 0.1-0.4, v0 0.8-1.5 m/s, in any
sliding direction: MuJoCo's soft friction constraint lets a little force go missing). The test
``test_slide_stopping_distance_matches_coulomb`` holds it to 2%; a wrong friction combination
(the table's coefficient winning) or pyramidal cones (friction depends on the direction, up to a
factor 1/sqrt(2) on the diagonal) would be tens of percent off.

``difficulty`` changes (see :data:`RANGES`):

* easy: slippery table (mu 0.05-0.12, like waxed wood or PTFE), long slides (0.6-0.85 m) lasting
  1.0-1.7 s, so at 2 fps several frames show the deceleration; larger blocks; small camera jitter.
* hard: ordinary wood/plastic friction (mu 0.12-0.35), short slides (0.25-0.6 m) over in
  0.4-1.0 s (one or two moving frames), smaller blocks, 2-4 static distractors on the table,
  larger camera jitter.
"""

from __future__ import annotations

from typing import Any

import mujoco
import numpy as np

from embodied.worlds.base import (
    G,
    SceneWorld,
    add_clutter,
    colours,
    sample_camera,
    sample_clutter,
)

TABLE_TOP = 0.4  # z of the table surface (sim/slide/scene.xml)
RANGES = {
    "easy": {"mu": (0.05, 0.12), "distance": (0.6, 0.85), "half": (0.05, 0.075)},
    "hard": {"mu": (0.12, 0.35), "distance": (0.25, 0.6), "half": (0.035, 0.055)},
}
SHAPES = ("box", "puck")  # puck: a flat cylinder


def sample_params(rng: np.random.Generator, difficulty: str) -> dict[str, Any]:
    """One episode's JSON parameters: block shape/size/colour, friction, initial velocity."""
    rng_ = RANGES[difficulty]
    shape = str(rng.choice(SHAPES))
    half = float(rng.uniform(*rng_["half"]))
    # Low blocks (height <= 0.8 x half-width) cannot tip: tipping needs mu > width / height.
    height = float(rng.uniform(0.4, 0.8)) * half
    size = [half, float(rng.uniform(0.7, 1.0)) * half, height] if shape == "box" else [half, height, 0.0]
    mu = float(rng.uniform(*rng_["mu"]))
    dist = float(rng.uniform(*rng_["distance"]))
    v0 = float(np.sqrt(2.0 * mu * G * dist))  # so that it stops after `dist` (Coulomb)
    sign = 1.0 if rng.random() < 0.5 else -1.0
    heading = float(np.deg2rad(rng.uniform(-10.0, 10.0)))  # mostly across the view, a little in depth
    direction = np.array([sign * np.cos(heading), np.sin(heading)])
    centre = np.array([rng.uniform(-0.08, 0.08), rng.uniform(0.0, 0.2)])
    start = centre - direction * dist / 2
    n_clutter = int(rng.integers(2, 5)) if difficulty == "hard" else 0
    lo, hi = np.minimum(start, start + direction * dist), np.maximum(start, start + direction * dist)
    keep_out = [(lo[0] - 0.12, hi[0] + 0.12, lo[1] - 0.12, hi[1] + 0.12)]
    clutter = sample_clutter(rng, n_clutter, keep_out, region=(-0.8, 0.8, -0.3, 0.5), z0=TABLE_TOP)
    return {
        "difficulty": difficulty,
        "block": {
            "shape": shape,
            "size": size,
            "rgba": colours(1, rng)[0],
            "pos": [float(start[0]), float(start[1]), TABLE_TOP + height],
            "yaw_deg": float(rng.uniform(-180.0, 180.0)),
            "linvel": [float(v0 * direction[0]), float(v0 * direction[1]), 0.0],
            "mu": mu,
            "density": float(rng.uniform(400.0, 900.0)),
        },
        "predicted_distance": dist,
        "camera": sample_camera(rng, difficulty),
        "clutter": clutter,
    }


class SlideWorld(SceneWorld):
    """A block sliding to rest on a table; ``reset(seed, difficulty=...)``."""

    scene = "slide"
    horizon = 3.0

    def sample_params(self, rng: np.random.Generator, difficulty: str, **options: Any) -> dict[str, Any]:
        if options:
            raise TypeError(f"unknown slide options {sorted(options)}")
        return sample_params(rng, difficulty)

    def build(self, spec: mujoco.MjSpec, params: dict[str, Any]) -> None:
        b = params["block"]
        yaw = np.deg2rad(b["yaw_deg"])
        body = spec.worldbody.add_body(
            name="block", pos=b["pos"], quat=[float(np.cos(yaw / 2)), 0.0, 0.0, float(np.sin(yaw / 2))]
        )
        body.add_freejoint(name="block")
        body.add_geom(
            name="block",
            type=mujoco.mjtGeom.mjGEOM_BOX if b["shape"] == "box" else mujoco.mjtGeom.mjGEOM_CYLINDER,
            size=b["size"],
            rgba=b["rgba"],
            density=b["density"],
            condim=3,
            friction=[b["mu"], 0.001, 0.0001],
        )
        add_clutter(spec, params["clutter"])

    def init_state(self, model: mujoco.MjModel, data: mujoco.MjData, params: dict[str, Any]) -> None:
        data.qvel[0:3] = params["block"]["linvel"]

    def extra_info(self) -> dict[str, Any]:
        start, end = self._qpos[0, 0:2], self._qpos[-1, 0:2]
        return {"distance": float(np.linalg.norm(end - start))}
