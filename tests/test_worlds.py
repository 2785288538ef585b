"""Drop world: real MuJoCo physics and real offscreen rendering, no mocks.

The physics tests guard the property the arrow-of-time task depends on: a dropped object must
lose energy. DESIGN.md records that a badly chosen contact damping made objects bounce higher
than they fell, which would teach the model the reverse of physics.
"""

from __future__ import annotations

import json

import mujoco
import numpy as np
import pytest

from embodied.worlds import scene_path
from embodied.worlds.base import CONTROL_DT, SceneWorld
from embodied.worlds.drop import (
    DAMPRATIO_RANGE,
    DROP_HEIGHT_RANGE,
    REST_BOUND,
    SHAPES,
    DropWorld,
    build_model,
    single_drop_params,
    total_energy,
)

CLIP_TIMES = [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5]  # 8 frames at 2 fps


@pytest.fixture(scope="module")
def world() -> DropWorld:
    w = DropWorld(width=112, height=112)
    yield w
    w.close()


@pytest.fixture(scope="module")
def base() -> mujoco.MjSpec:
    return mujoco.MjSpec.from_file(str(scene_path("drop")))


def test_scene_path_finds_repo_scene_and_names_both_places_when_missing() -> None:
    assert scene_path("drop").name == "scene.xml"
    with pytest.raises(FileNotFoundError, match="installed package.*sim/"):
        scene_path("no_such_scene")


@pytest.mark.parametrize("dampratio", DAMPRATIO_RANGE)
@pytest.mark.parametrize("height", [0.3, 1.0])
def test_sphere_rebounds_lower_than_it_fell_and_never_gains_energy(
    base: mujoco.MjSpec, dampratio: float, height: float
) -> None:
    radius = 0.08
    model = build_model(base, single_drop_params("sphere", (radius, 0, 0), height, dampratio))
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)
    e0 = total_energy(model, data)  # potential relative to z = 0 plus zero kinetic
    energies, flight, touched, apex = [], [], False, 0.0
    while data.time < 3.0:
        mujoco.mj_step(model, data)
        energies.append(total_energy(model, data))
        if data.ncon:
            touched = True
        else:
            flight.append(energies[-1])
            if touched:
                apex = max(apex, float(data.qpos[2]) - radius)
    # Apex after first contact = the first rebound's apex (later ones are lower when energy
    # only decreases, which the checks below enforce).
    rebound = apex / height
    assert 0.03 < rebound < 0.65, f"rebound / drop height = {rebound:.3f}"
    # Semi-implicit Euler loses ~m g^2 dt^2 / 2 per step in flight; allow 0.1% slack only.
    tol = 1e-3 * e0
    assert max(energies) <= e0 + tol, max(energies) / e0
    # In contact, energy hides in the soft contact's spring and partly comes back, so compare
    # flight phases: each flight must carry no more energy than every earlier one.
    flight = np.asarray(flight)
    assert np.all(flight <= np.minimum.accumulate(flight) + tol)
    assert energies[-1] <= flight.min() + tol
    assert energies[-1] < 0.9 * e0  # and the drop visibly dissipated energy


def test_same_seed_same_params_and_frames_different_seed_different_params(
    world: DropWorld,
) -> None:
    _, info_a = world.reset(7)
    frames_a = world.record(CLIP_TIMES[:4])
    _, info_b = world.reset(np.random.default_rng(7))
    frames_b = world.record(CLIP_TIMES[:4])
    assert info_a["params"] == info_b["params"]
    assert np.array_equal(frames_a, frames_b)
    _, info_c = world.reset(8)
    assert info_c["params"] != info_a["params"]


def test_record_shape_motion_early_and_rest_late(world: DropWorld) -> None:
    world.reset(0)
    frames = world.record(CLIP_TIMES)
    assert frames.shape == (8, 112, 112, 3) and frames.dtype == np.uint8
    diff = [
        np.abs(a.astype(int) - b.astype(int)).mean() for a, b in zip(frames[:-1], frames[1:], strict=True)
    ]
    assert diff[0] > 1.0, diff  # falling objects change the picture
    assert diff[-1] < 0.05, diff  # t = 3.0 -> 3.5 s: at rest
    assert frames.std() > 10  # not a blank image
    # render() shows the same state as record() at t = 0
    assert np.array_equal(world.render(), frames[0])


def test_drop_is_a_scene_world(world: DropWorld) -> None:
    assert isinstance(world, SceneWorld)
    _, info = world.reset(3, difficulty="hard")  # drop has one difficulty; the option is accepted
    assert info["motion"] == [0.0, REST_BOUND]


def test_objects_come_to_rest_within_bound(world: DropWorld) -> None:
    bound = REST_BOUND  # s after release; the task cuts clips assuming fall, bounces, then rest
    for seed in range(20):
        world.reset(seed)
        terminated, t = False, 0.0
        while not terminated and t < 4.0:
            obs, reward, terminated, truncated, _ = world.step()
            t = obs["time"]
            assert reward == 0.0 and not truncated
        assert terminated, f"seed {seed} still moving at {t:.2f} s"
        # terminated fires when the objects went still (stayed below REST_SPEED for REST_WINDOW after)
        assert t <= bound + CONTROL_DT, f"seed {seed} settled at {t:.2f} s"


def test_randomisation_covers_ranges(world: DropWorld) -> None:
    counts, shapes, heights, damps = set(), set(), [], []
    for seed in range(50):
        _, info = world.reset(seed)
        params = info["params"]
        assert json.loads(json.dumps(params)) == params  # plain JSON types only
        counts.add(params["n_objects"])
        for obj in params["objects"]:
            shapes.add(obj["shape"])
            damps.append(obj["dampratio"])
            heights.append(obj["pos"][2])  # centre = drop height + bounding radius
    assert counts == set(range(1, world.max_objects + 1))
    assert shapes == set(SHAPES)
    assert min(damps) >= DAMPRATIO_RANGE[0] and max(damps) <= DAMPRATIO_RANGE[1]
    assert max(damps) - min(damps) > 0.6 * (DAMPRATIO_RANGE[1] - DAMPRATIO_RANGE[0])
    assert min(heights) > DROP_HEIGHT_RANGE[0] and max(heights) > DROP_HEIGHT_RANGE[1]
    assert min(heights) < DROP_HEIGHT_RANGE[0] + 0.2  # low drops happen too
