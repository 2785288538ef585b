"""Pendulum world: a damped pendulum released from rest swings with a decaying amplitude.

Irreversible because the damping turns mechanical energy into heat: forward, each swing is lower
than the one before; reversed, the swings would grow by themselves.

Damping model and calibration: a viscous hinge damping ``b`` (N m s/rad, MuJoCo ``dof_damping``)
gives, for small angles, I th'' + b th' + m g l th = 0, so the amplitude decays as exp(-t / tau)
with tau = 2 I / b (I: moment of inertia about the pivot, read from MuJoCo's mass matrix). Each
episode draws the decay time ``tau`` and sets b = 2 I / tau after compiling, so the configured
quantity is the one the viewer sees. The implicitfast integrator treats joint damping implicitly;
``test_pendulum_amplitude_decays_at_the_configured_rate`` measures successive swing peaks and
fits tau to within 3% of the configured value (the residual comes from the finite amplitude: a
pendulum is not a linear oscillator at 15-50 degrees).

``difficulty`` (see :data:`RANGES`): easy = strongly damped (tau 1.5-3 s, quality factor Q ~ 3-5,
like a pendulum with a paddle in water) and large release angles (30-50 deg), so 4-8 frames at 2 fps
show the amplitude shrink; hard = lightly damped (tau 5-10 s, Q ~ 8-17, a light bob in air),
smaller angles (15-30 deg), 2-4 static distractors, larger camera jitter. Rod length 0.6-1.0 m
(period 1.6-2.1 s).
"""

from __future__ import annotations

from typing import Any

import mujoco
import numpy as np

from embodied.worlds.base import SceneWorld, add_clutter, colours, sample_camera, sample_clutter

PIVOT = (0.0, 0.1, 1.3)  # site "pivot" in sim/pendulum/scene.xml
RANGES = {
    "easy": {"tau": (1.5, 3.0), "angle_deg": (30.0, 50.0)},
    "hard": {"tau": (5.0, 10.0), "angle_deg": (15.0, 30.0)},
}
BOBS = ("sphere", "box", "cylinder")
_TYPES = {s: getattr(mujoco.mjtGeom, f"mjGEOM_{s.upper()}") for s in BOBS}


def sample_params(rng: np.random.Generator, difficulty: str) -> dict[str, Any]:
    """One episode's JSON parameters: rod length, bob, release angle, decay time."""
    r = RANGES[difficulty]
    shape = str(rng.choice(BOBS))
    n_clutter = int(rng.integers(2, 5)) if difficulty == "hard" else 0
    rod_rgba, bob_rgba = colours(2, rng)
    sign = 1.0 if rng.random() < 0.5 else -1.0
    return {
        "difficulty": difficulty,
        "length": float(rng.uniform(0.6, 1.0)),  # pivot to bob centre (m)
        "bob": {"shape": shape, "radius": float(rng.uniform(0.06, 0.09)), "rgba": bob_rgba},
        "rod_rgba": [0.3, 0.3, 0.32, 1.0] if rng.random() < 0.5 else rod_rgba,
        "angle_deg": sign * float(rng.uniform(*r["angle_deg"])),
        "tau": float(rng.uniform(*r["tau"])),  # amplitude decay time (s)
        "camera": sample_camera(rng, difficulty),
        "clutter": sample_clutter(rng, n_clutter, [(-1.0, 1.0, -0.3, 0.3)], region=(-0.9, 0.9, 0.3, 0.8)),
    }


class PendulumWorld(SceneWorld):
    """A damped pendulum; ``reset(seed, difficulty=...)``; ``info["tau"]``: configured decay time."""

    scene = "pendulum"
    horizon = 5.0

    def sample_params(self, rng: np.random.Generator, difficulty: str, **options: Any) -> dict[str, Any]:
        if options:
            raise TypeError(f"unknown pendulum options {sorted(options)}")
        return sample_params(rng, difficulty)

    def build(self, spec: mujoco.MjSpec, params: dict[str, Any]) -> None:
        length, bob = params["length"], params["bob"]
        rad = bob["radius"]
        body = spec.worldbody.add_body(name="pendulum", pos=list(PIVOT))
        body.add_joint(name="hinge", type=mujoco.mjtJoint.mjJNT_HINGE, axis=[0, 1, 0])
        body.add_geom(  # a thin aluminium-like rod from the pivot to the bob
            name="rod",
            type=mujoco.mjtGeom.mjGEOM_CAPSULE,
            fromto=[0, 0, 0, 0, 0, -(length - rad)],
            size=[0.012, 0, 0],
            rgba=params["rod_rgba"],
            density=2700.0,
            contype=0,
            conaffinity=0,
        )
        size = {"sphere": [rad, 0, 0], "box": [rad, rad, rad], "cylinder": [rad, 0.6 * rad, 0]}[bob["shape"]]
        # cylinders face the camera (axis along y) so they read as discs
        quat = [0.7071068, 0.7071068, 0, 0] if bob["shape"] == "cylinder" else [1, 0, 0, 0]
        body.add_geom(
            name="bob",
            type=_TYPES[bob["shape"]],
            size=size,
            pos=[0, 0, -length],
            quat=quat,
            rgba=bob["rgba"],
            density=2000.0,
            contype=0,
            conaffinity=0,
        )
        add_clutter(spec, params["clutter"])

    def finalize(self, model: mujoco.MjModel, params: dict[str, Any]) -> None:
        """Hinge damping b = 2 I / tau, with I about the pivot from the mass matrix."""
        data = mujoco.MjData(model)
        mujoco.mj_forward(model, data)
        full = np.zeros((model.nv, model.nv))
        mujoco.mj_fullM(model, data, full)
        inertia = float(full[0, 0])  # the single hinge: inertia about the pivot (+ armature)
        model.dof_damping[0] = 2.0 * inertia / params["tau"]

    def init_state(self, model: mujoco.MjModel, data: mujoco.MjData, params: dict[str, Any]) -> None:
        data.qpos[0] = np.deg2rad(params["angle_deg"])  # released at rest

    def speeds(self, qpos: np.ndarray, qvel: np.ndarray) -> np.ndarray:
        return np.abs(qvel[:, 0]) * self.params["length"]  # bob speed (m/s)

    def extra_info(self) -> dict[str, Any]:
        return {"tau": self.params["tau"], "damping": float(self.model.dof_damping[0])}
