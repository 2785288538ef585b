"""Drop world: 1-4 rigid objects dropped onto a floor, bouncing with energy loss, coming to rest.

The scene is built for clearly irreversible physics (the arrow-of-time family): objects fall, lose
energy at every bounce and stop. Played backwards, objects would leap off the floor.

Model strategy (measured on 1 CPU core, 4 objects): compiling a fresh model per episode with
``mujoco.MjSpec`` costs ~0.7 ms, rebinding the renderer's ``MjrContext`` + ``MjvScene`` ~4-5 ms,
against ~45 ms for the 8 rendered frames and ~20 ms of physics (3.5 s at 2 ms) of a clip;
end to end ~13 episodes/s at 128x128 on one core. A fixed model with ``max_objects`` slots
whose geom types/sizes are rewritten per episode would save those ~5 ms, but must keep masses,
inertias, ``geom_rbound``/``geom_aabb`` and contact parameters consistent by hand (a silent source
of wrong physics). So each episode compiles its own model (MuJoCo computes every derived
quantity), while ONE GL context is shared by the whole process (:mod:`embodied.worlds.render`).

Restitution calibration (sphere r=6 cm dropped from 1 m onto the floor, 2 ms timestep, contact
``solref = (0.02, dampratio)``; rebound = apex after first contact / drop height). A *lower*
damping ratio also means a *stiffer* contact spring in MuJoCo's parametrisation, and below ~0.1
the stiff spring is under-resolved at 2 ms and injects energy (rebound > 1):

====================  ======  ======  ======  ======  ======  ======  ======  ======  ======
dampratio             0.05    0.1     0.15    0.2     0.3     0.4     0.5     0.7     1.0
rebound, tc = 0.02    5.16    0.59    0.44    0.35    0.20    0.12    0.075   0.025   0.000
rebound, tc = 0.01    122     6.1     0.60    0.47    0.24    0.14    0.085   0.033   0.006
rebound, tc = 0.005   706     128     27.8    8.4     1.42    0.35    0.11    0.051   0.012
====================  ======  ======  ======  ======  ======  ======  ======  ======  ======

The same ratios hold for radii 7-11 cm; from 0.3 m the range gives 0.46 / 0.069.
We therefore fix ``timeconst = 0.02`` and draw ``dampratio`` from :data:`DAMPRATIO_RANGE`
(rebound ~45% down to ~6% of drop height), well clear of the energy-gain cliff; the floor's
``solmix = 0`` makes each object's own solref govern its floor contacts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mujoco
import numpy as np

from embodied.worlds.base import REST_WINDOW, SceneWorld, colours, jitter_camera, sample_camera

# Ellipsoids were tried and dropped: they keep rocking on the floor for 4+ s (MuJoCo's soft
# contact on a curved, non-spherical surface), which breaks the "at rest by ~2.5 s" contract.
SHAPES = ("sphere", "box", "capsule", "cylinder")
TIMECONST = 0.02
DAMPRATIO_RANGE = (0.15, 0.5)
DROP_HEIGHT_RANGE = (0.5, 1.0)  # metres from floor to the object's lowest point
SIZE_RANGE = (0.08, 0.11)  # characteristic radius, metres
REST_SPEED = 0.02  # m/s: below this, an object counts as at rest
# Every episode is at rest by then (tests/test_worlds.py checks 20 seeds). Reported as
# info["motion"] = [0, REST_BOUND]: a bound that clip windows are drawn within, the same for every episode.
REST_BOUND = 2.5
CAMERA_JITTER = (0.08, 3.0)  # position offset m, rotation offset deg: uniform in +-range
HUE_JITTER = 0.08
FRICTION = (0.9, 0.02, 0.02)  # slide, torsion, roll: rolling friction stops rolling balls
# Viscous damping on the rotational dofs only (N m s/rad): stops edge-rolling cylinders and long
# spins; it can only remove energy, and leaves the vertical bounce (the calibration) untouched.
ANGULAR_DAMPING = 0.005
_GEOM_TYPES = {s: getattr(mujoco.mjtGeom, f"mjGEOM_{s.upper()}") for s in SHAPES}


def _size(shape: str, r: float, rng: np.random.Generator) -> list[float]:
    """Geom size vector for ``shape`` with characteristic radius ``r`` (MuJoCo conventions)."""
    if shape == "sphere":
        return [r, 0.0, 0.0]
    if shape == "box":
        return [float(r * rng.uniform(0.6, 1.0)) for _ in range(3)]
    if shape == "capsule":
        return [0.7 * r, float(r * rng.uniform(0.6, 1.2)), 0.0]
    if shape == "cylinder":
        return [r, float(r * rng.uniform(0.5, 1.0)), 0.0]
    if shape == "ellipsoid":
        return [float(r * rng.uniform(0.6, 1.1)) for _ in range(3)]
    raise ValueError(f"unknown shape {shape!r}")


def _bound_radius(shape: str, size: list[float]) -> float:
    """Radius of a sphere enclosing the geom, used to keep release poses apart."""
    if shape == "box":
        return float(np.linalg.norm(size))
    if shape == "capsule":
        return size[0] + size[1]
    if shape == "cylinder":
        return float(np.hypot(size[0], size[1]))
    return max(size)


def _place(radii: list[float], rng: np.random.Generator) -> list[list[float]]:
    """Release centres whose bounding spheres do not overlap (rejection sampling in 3-D).

    Objects may share xy (then they collide in flight); only interpenetration at release is
    excluded. A centre sits at drop height + bounding radius, so the lowest point is at least
    the drop height above the floor.
    """
    placed: list[np.ndarray] = []
    for i, ri in enumerate(radii):
        # One object at a time: whole-set rejection fails too often with four large objects.
        for _ in range(1000):
            xy = rng.uniform([-0.3, -0.2], [0.3, 0.2])
            p = np.array([xy[0], xy[1], rng.uniform(*DROP_HEIGHT_RANGE) + ri])
            if all(np.linalg.norm(p - q) - (ri + radii[j]) - 0.01 > 0 for j, q in enumerate(placed)):
                placed.append(p)
                break
        else:
            raise RuntimeError(f"could not place object {i} without overlap")
    return [p.tolist() for p in placed]


def sample_params(rng: np.random.Generator, max_objects: int = 4) -> dict[str, Any]:
    """Draw one episode's scene parameters (JSON-serialisable: ints, floats, strings, lists)."""
    n = int(rng.integers(1, max_objects + 1))
    shapes = [str(s) for s in rng.choice(SHAPES, size=n)]
    sizes = [_size(s, float(rng.uniform(*SIZE_RANGE)), rng) for s in shapes]
    radii = [_bound_radius(s, z) for s, z in zip(shapes, sizes, strict=True)]
    pos = _place(radii, rng)
    rgba = colours(n, rng, spread=HUE_JITTER)
    objects = []
    for i in range(n):
        quat = rng.normal(size=4)
        objects.append(
            {
                "shape": shapes[i],
                "size": [float(v) for v in sizes[i]],
                "rgba": [float(v) for v in rgba[i]],
                "pos": pos[i],
                "quat": (quat / np.linalg.norm(quat)).tolist(),
                "linvel": [*rng.uniform(-0.2, 0.2, size=2).tolist(), 0.0],
                "angvel": rng.uniform(-3.0, 3.0, size=3).tolist(),
                "dampratio": float(rng.uniform(*DAMPRATIO_RANGE)),
                "density": float(rng.uniform(400.0, 1200.0)),
            }
        )
    camera = sample_camera(rng, ranges=CAMERA_JITTER)
    return {"n_objects": n, "objects": objects, "camera": camera, "timeconst": TIMECONST}


def add_objects(spec: mujoco.MjSpec, params: dict[str, Any]) -> None:
    """This episode's objects, each a free body with its calibrated contact (the floor's solmix = 0 lets the
    object's solref win on floor contacts)."""
    spec.geom("floor").solmix = 0.0
    for i, obj in enumerate(params["objects"]):
        body = spec.worldbody.add_body(name=f"obj{i}", pos=obj["pos"], quat=obj["quat"])
        body.add_freejoint(name=f"obj{i}")
        body.add_geom(
            name=f"obj{i}",
            type=_GEOM_TYPES[obj["shape"]],
            size=obj["size"],
            rgba=obj["rgba"],
            density=obj["density"],
            condim=6,
            friction=list(FRICTION),
            solref=[params["timeconst"], obj["dampratio"]],
            solmix=1.0,
        )


def damp_rotation(model: mujoco.MjModel) -> None:
    """Viscous damping on every object's rotational dofs (6 dofs per free object: 3 linear, 3 angular)."""
    model.dof_damping[:] = np.tile([0.0, 0.0, 0.0, *[ANGULAR_DAMPING] * 3], model.nv // 6)


def build_model(
    base: mujoco.MjSpec, params: dict[str, Any], width: int = 128, height: int = 128
) -> mujoco.MjModel:
    """Compile the base scene plus this episode's objects (as `DropWorld.reset` does, for calibration and
    tests); MuJoCo derives mass and inertia."""
    spec = base.copy()
    spec.visual.global_.offwidth = max(width, spec.visual.global_.offwidth)
    spec.visual.global_.offheight = max(height, spec.visual.global_.offheight)
    add_objects(spec, params)
    model = spec.compile()
    damp_rotation(model)
    jitter_camera(model, params["camera"])
    return model


def total_energy(model: mujoco.MjModel, data: mujoco.MjData) -> float:
    """Potential + kinetic energy (J), the quantity a bounce must never increase.

    After ``mj_step`` the body poses and mass matrix in ``data`` still describe the state
    *before* the integration, so they are recomputed first (without touching the solver's warm
    start, which would perturb the trajectory).
    """
    mujoco.mj_fwdPosition(model, data)
    mujoco.mj_energyPos(model, data)
    mujoco.mj_energyVel(model, data)
    return float(data.energy[0] + data.energy[1])


def lowest_points(model: mujoco.MjModel, data: mujoco.MjData) -> np.ndarray:
    """Height (m) of each dropped object's lowest point above the floor, from its pose and shape."""
    out = []
    for i in range(model.ngeom):
        if not model.geom(i).name.startswith("obj"):
            continue
        size, up = model.geom_size[i], data.geom_xmat[i].reshape(3, 3)[2]  # row 2: local axes' z parts
        kind, z = model.geom_type[i], data.geom_xpos[i][2]
        if kind == mujoco.mjtGeom.mjGEOM_SPHERE:
            reach = size[0]
        elif kind == mujoco.mjtGeom.mjGEOM_BOX:
            reach = float(np.abs(up) @ size)
        elif kind == mujoco.mjtGeom.mjGEOM_CAPSULE:
            reach = size[0] + size[1] * abs(up[2])
        else:  # cylinder: rim radius projected on z, plus the half height along the axis
            reach = size[0] * np.sqrt(max(0.0, 1.0 - up[2] ** 2)) + size[1] * abs(up[2])
        out.append(z - reach)
    return np.asarray(out)


def image_x(model: mujoco.MjModel, data: mujoco.MjData, camera: str = "cam") -> np.ndarray:
    """Horizontal image position of each dropped object's centre, -1 (left edge) .. 1 (right edge)."""
    cam = model.camera(camera)
    pos, rot = data.cam_xpos[cam.id], data.cam_xmat[cam.id].reshape(3, 3)
    fovy = np.deg2rad(model.cam_fovy[cam.id])
    xs = []
    for i in range(model.ngeom):
        if model.geom(i).name.startswith("obj"):
            local = rot.T @ (data.geom_xpos[i] - pos)  # camera looks along its -z
            xs.append(local[0] / max(-local[2], 1e-6) / np.tan(fovy / 2))
    return np.asarray(xs)


def single_drop_params(
    shape: str = "sphere",
    size: Sequence[float] = (0.06, 0.0, 0.0),
    height: float = 1.0,
    dampratio: float = DAMPRATIO_RANGE[0],
    timeconst: float = TIMECONST,
) -> dict[str, Any]:
    """Params for one object released at rest with its lowest point ``height`` above the floor.

    For calibration and tests: the same code path as random episodes, minus the randomness.
    """
    radius = _bound_radius(shape, list(size))
    obj = {
        "shape": shape,
        "size": [float(v) for v in size],
        "rgba": [0.9, 0.2, 0.1, 1.0],
        "pos": [0.0, 0.0, height + radius],
        "quat": [1.0, 0.0, 0.0, 0.0],
        "linvel": [0.0, 0.0, 0.0],
        "angvel": [0.0, 0.0, 0.0],
        "dampratio": dampratio,
        "density": 800.0,
    }
    camera = {"pos_offset": [0.0, 0.0, 0.0], "rot_offset_deg": [0.0, 0.0, 0.0]}
    return {"n_objects": 1, "objects": [obj], "camera": camera, "timeconst": timeconst}


class DropWorld(SceneWorld):
    """1-4 objects dropped onto a floor; ``reset(seed)`` (a ``difficulty`` option changes nothing here).

    ``info["motion"]`` is ``[0, REST_BOUND]`` for every episode, and each frame shows the poses of the
    physics step before its time: that is how drop clips have always been rendered (the poses MuJoCo
    computed inside its last step), and the shipped tiny base was pretrained on exactly those frames.
    """

    scene = "drop"
    horizon = REST_BOUND + 2 * REST_WINDOW  # s simulated at reset: past the rest bound, so rest is measured
    rest_speed = REST_SPEED
    frame_lag = 1

    def __init__(self, width: int = 128, height: int = 128, max_objects: int = 4, difficulty: str = "easy"):
        if not 1 <= max_objects <= 4:
            raise ValueError("max_objects must be in 1..4 (the drop area fits four objects)")
        super().__init__(width, height, difficulty)
        self.max_objects = max_objects

    def sample_params(self, rng: np.random.Generator, difficulty: str, **options: Any) -> dict[str, Any]:
        if options:
            raise TypeError(f"unknown drop options {sorted(options)}")
        return sample_params(rng, self.max_objects)

    def build(self, spec: mujoco.MjSpec, params: dict[str, Any]) -> None:
        add_objects(spec, params)

    def finalize(self, model: mujoco.MjModel, params: dict[str, Any]) -> None:
        damp_rotation(model)

    def init_state(self, model: mujoco.MjModel, data: mujoco.MjData, params: dict[str, Any]) -> None:
        for i, obj in enumerate(params["objects"]):
            # Free-joint velocity: linear in world frame, angular in the body frame.
            data.qvel[6 * i : 6 * i + 6] = [*obj["linvel"], *obj["angvel"]]

    def speeds(self, qpos: np.ndarray, qvel: np.ndarray) -> np.ndarray:
        """Fastest object's translational speed per row (rotation alone does not count as moving)."""
        del qpos
        return np.linalg.norm(qvel.reshape(len(qvel), -1, 6)[:, :, :3], axis=2).max(axis=1)

    def motion(self) -> list[float]:
        return [0.0, REST_BOUND]
