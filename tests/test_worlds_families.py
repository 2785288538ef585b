"""Scene families beyond drop: real MuJoCo physics and real offscreen rendering, no mocks.

Every family: resets, is reproducible for a seed, renders only the requested frames, and its
motion is irreversible (energy lost, objects end at rest). Family tests check the calibrations
(sliding distance, pendulum decay) and the occluder's outcomes from state and from pixels.
"""

from __future__ import annotations

import json

import mujoco
import numpy as np
import pytest

from embodied.worlds import WORLDS, make_world
from embodied.worlds.base import CONTROL_DT, REST_WINDOW, sliding_distance
from embodied.worlds.occluder import OUTCOMES, PARK, pixels

FAMILIES = ["occluder", "slide", "topple", "dominoes", "pendulum"]
SIZE = 96  # smaller than the 128 default: these tests check physics and pixels, not framing
CLIP = np.arange(8) / 2.0  # 8 frames at 2 fps


@pytest.fixture(scope="module")
def worlds():
    made = {name: make_world(name, width=SIZE, height=SIZE) for name in FAMILIES}
    yield made
    for w in made.values():
        w.close()


def _energy(world, k: int) -> tuple[float, float]:
    """(potential + kinetic, kinetic) energy (J) of cached state ``k`` of the current episode."""
    data = world._data_at(k)
    mujoco.mj_energyPos(world.model, data)
    mujoco.mj_energyVel(world.model, data)
    return float(data.energy[0] + data.energy[1]), float(data.energy[1])


def test_registry_lists_families_and_names_them_for_an_unknown_one() -> None:
    assert set(FAMILIES) | {"drop"} <= set(WORLDS)
    with pytest.raises(ValueError, match="unknown scene 'nope'.*dominoes, drop, occluder, pendulum"):
        make_world("nope")


@pytest.mark.parametrize("name", FAMILIES)
def test_reset_is_reproducible_and_renders_only_requested_times(worlds, name: str) -> None:
    world = worlds[name]
    calls = []
    render = world._renderer.render
    world._renderer.render = lambda data, cam: calls.append(data.time) or render(data, cam)
    try:
        _, info_a = world.reset(11, difficulty="hard")
        times = [0.3, 1.1, 2.0]
        frames_a = world.record(times)
        assert len(calls) == 3 and np.allclose(calls, times)
        _, info_b = world.reset(np.random.default_rng(11), difficulty="hard")
        frames_b = world.record(times)
    finally:
        world._renderer.render = render
    assert json.loads(json.dumps(info_a)) == info_a  # plain JSON
    assert info_a == info_b and np.array_equal(frames_a, frames_b)
    assert frames_a.shape == (3, SIZE, SIZE, 3) and frames_a.dtype == np.uint8
    assert frames_a.std() > 10
    _, info_c = world.reset(12)
    assert info_c["params"] != info_a["params"]
    assert info_a["params"]["difficulty"] == "hard" and info_c["params"]["difficulty"] == "easy"
    with pytest.raises(ValueError, match="difficulty"):
        world.reset(0, difficulty="medium")


@pytest.mark.parametrize("name", FAMILIES)
def test_motion_is_irreversible(worlds, name: str) -> None:
    world = worlds[name]
    for seed in range(3):
        _, info = world.reset(seed)
        t0, t1 = info["motion"]
        assert 0.0 <= t0 < t1 <= world.horizon, info["motion"]
        k0, k1 = round(t0 / CONTROL_DT), round(t1 / CONTROL_DT)
        e, kin = np.array([_energy(world, k) for k in range(k0, k1 + 1)]).T
        # friction / damping took out at least half of the largest kinetic energy seen ...
        assert e[0] - e[-1] > 0.5 * kin.max() > 0, (seed, e[0], e[-1], kin.max())
        assert e.max() <= e[0] + 1e-3 * kin.max()  # ... and none came in
        frames = world.record([t0, (t0 + t1) / 2, t1])
        assert not np.array_equal(frames[0], frames[2])  # the motion is visible


# --- occluder --------------------------------------------------------------------------------


def _state_after_reveal(world, seed: int, outcome: str) -> tuple[dict, np.ndarray]:
    _, info = world.reset(seed, outcome=outcome)
    obs = None
    while world.data.time < info["reveal_time"] + 0.1:
        obs, *_ = world.step()
    return info, obs["qpos"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_occluder_outcomes_from_state(worlds, seed: int) -> None:
    world = worlds["occluder"]
    infos, qpos = {}, {}
    for outcome in OUTCOMES:
        infos[outcome], qpos[outcome] = _state_after_reveal(world, seed, outcome)
    info = infos["possible"]
    # Timeline: hidden while at rest, edited while hidden, revealed after the lift starts.
    h0, h1 = info["hidden"]
    assert info["motion"][0] < h0 < info["motion"][1] < info["edit_time"] <= h1
    assert info["edit_time"] < info["lift"][0] <= info["reveal_time"] and h1 <= info["reveal_time"]
    for outcome in OUTCOMES:  # matched pairs: only the outcome and what is revealed differ
        for key in ("motion", "hidden", "edit_time", "lift", "reveal_time", "expected"):
            assert infos[outcome][key] == info[key], (outcome, key)
    expected = np.array(info["expected"]["pos"])
    far = np.array([PARK[0] - 1, PARK[1]])
    # possible: the object is where it came to rest, and that is where Coulomb friction says
    assert np.linalg.norm(qpos["possible"][0:3] - expected) < 0.01
    obj = info["params"]["object"]
    travelled = abs(expected[0] - obj["pos"][0])
    if obj["shape"] != "sphere":  # sliding: calibrated against v0^2 / (2 mu g)
        predicted = sliding_distance(abs(obj["linvel"][0]), obj["friction"][0])
        assert travelled == pytest.approx(predicted, rel=0.03)
    # vanished: neither the object nor its twin is anywhere near the scene
    assert qpos["vanished"][0] > far[0] and qpos["vanished"][7] > far[0]
    assert infos["vanished"]["revealed"] is None
    # teleported: same object, at rest elsewhere behind the screen
    assert abs(qpos["teleported"][0] - expected[0]) > 0.14
    assert qpos["teleported"][0] == pytest.approx(info["params"]["teleport_x"], abs=0.01)
    # changed: the twin (other colour) sits where the object was, the object is gone
    assert np.linalg.norm(qpos["changed"][7:10] - expected) < 0.01 and qpos["changed"][0] > far[0]
    assert infos["changed"]["revealed"]["rgba"] != info["expected"]["rgba"]


def _patch(frame: np.ndarray, col_row: np.ndarray, half: int = 2) -> np.ndarray:
    c, r = np.round(col_row).astype(int)
    return frame[r - half : r + half + 1, c - half : c + half + 1].reshape(-1, 3).astype(float)


@pytest.mark.parametrize("seed", [0, 3])
def test_occluder_outcomes_are_visible_in_pixels(worlds, seed: int) -> None:
    world = worlds["occluder"]
    before, during, after = {}, {}, {}
    for outcome in OUTCOMES:
        _, info = world.reset(seed, outcome=outcome, difficulty="hard" if seed % 2 else "easy")
        t_before = info["edit_time"] - CONTROL_DT
        t_during = round((info["edit_time"] + info["lift"][0]) / 2 / CONTROL_DT) * CONTROL_DT
        t_after = info["reveal_time"] + 0.2
        before[outcome], during[outcome], after[outcome] = world.record([t_before, t_during, t_after])
    # identical until the edit, and still identical after it while hidden: the edited object
    # (or its absence) does not show at all, not even as a shadow ...
    for outcome in OUTCOMES:
        assert np.array_equal(before[outcome], before["possible"]), outcome
        assert np.array_equal(during[outcome], during["possible"]), outcome
    # ... and after the reveal the difference shows at the expected place
    exp_px = pixels(world.model, info["expected"]["pos"], SIZE, SIZE)[0]
    rgba = np.array(info["expected"]["rgba"][:3]) * 255
    seen = _patch(after["possible"], exp_px).mean(0)
    assert np.abs(seen - rgba).mean() < 60, (seen, rgba)  # the object's own colour, lit
    for outcome in ("vanished", "teleported", "changed"):
        diff = np.abs(_patch(after[outcome], exp_px).mean(0) - seen).mean()
        assert diff > 30, (outcome, diff)
    tele = np.array(info["expected"]["pos"])
    tele[0] = info["params"]["teleport_x"]
    tele_px = pixels(world.model, tele, SIZE, SIZE)[0]
    assert np.abs(_patch(after["teleported"], tele_px).mean(0) - rgba).mean() < 60
    twin = np.array(info["params"]["twin"]["rgba"][:3]) * 255
    changed = _patch(after["changed"], exp_px).mean(0)
    assert np.abs(changed - twin).mean() < np.abs(changed - rgba).mean()


@pytest.mark.parametrize("name", ["slide", "topple", "dominoes", "occluder"])
def test_scene_ends_at_rest_and_step_agrees(worlds, name: str) -> None:
    world = worlds[name]
    _, info = world.reset(5)
    t_rest = info["motion"][1]
    assert t_rest + REST_WINDOW < world.horizon  # it came to rest inside the rollout
    frames = world.record([t_rest + 0.1, world.horizon, world.horizon + 1.0])  # past the horizon too
    # at rest: nothing moves any more (the occluder's screen is gone by then)
    if name != "occluder" or info["lift"][1] < t_rest + 0.1:
        assert np.abs(frames[0].astype(int) - frames[2].astype(int)).max() <= 8
    terminated, obs = False, None
    while not terminated:
        obs, reward, terminated, truncated, step_info = world.step()
        assert reward == 0.0 and not truncated
    assert obs["time"] == pytest.approx(t_rest, abs=CONTROL_DT / 2)
    assert step_info["speed"] < world.rest_speed


def test_topple_tower_ends_lower_and_dominoes_all_fall(worlds) -> None:
    for seed in range(3):
        _, info = worlds["topple"].reset(seed)
        z = worlds["topple"]._qpos[:, 2::7]  # block heights over time
        assert z[-1].max() < 0.5 * z[0].max(), seed  # the top block came down
        _, info = worlds["dominoes"].reset(seed)
        assert info["fallen"] == len(info["params"]["dominoes"]), (seed, info["fallen"])


@pytest.mark.parametrize("mu", [0.08, 0.3])
@pytest.mark.parametrize("heading_deg", [0.0, 45.0])
def test_slide_stopping_distance_matches_coulomb(worlds, mu: float, heading_deg: float) -> None:
    """Tolerance 2%: MuJoCo's soft friction constraint measured 0.3-0.8% short of v0^2 / (2 mu g);
    a wrong friction combination (the table's coefficient winning) or pyramidal friction cones
    (sliding at 45 degrees then meets a friction smaller by up to 1/sqrt(2)) are far outside."""
    world = worlds["slide"]
    _, info = world.reset(0, difficulty="easy")
    params = info["params"]
    v0, heading = 1.2, np.deg2rad(heading_deg)
    params["block"].update(mu=mu, linvel=[v0 * np.cos(heading), v0 * np.sin(heading), 0.0])
    params["block"]["pos"][:2] = [-0.3, -0.1]
    _, info = world.reset(0, params=params)
    assert info["params"]["block"]["mu"] == mu
    assert info["distance"] == pytest.approx(sliding_distance(v0, mu), rel=0.02)
    assert info["motion"][1] == pytest.approx(v0 / (mu * 9.81), abs=0.1)  # uniform deceleration


def _peaks(angle: np.ndarray, dt: float) -> tuple[np.ndarray, np.ndarray]:
    """Times and |amplitudes| of the swing extremes (local maxima of |angle|), parabola-refined."""
    a = np.abs(angle)
    k = np.flatnonzero((a[1:-1] > a[:-2]) & (a[1:-1] >= a[2:])) + 1
    y0, y1, y2 = a[k - 1], a[k], a[k + 1]
    shift = 0.5 * (y0 - y2) / (y0 - 2 * y1 + y2)
    return (k + shift) * dt, y1 - 0.25 * (y0 - y2) * shift


@pytest.mark.parametrize("tau", [2.0, 6.0])
def test_pendulum_amplitude_decays_at_the_configured_rate(worlds, tau: float) -> None:
    """Fit log(peak amplitude) against time: the slope must be -1/tau within 3%. Small release
    angle (10 deg) so the linear theory behind exp(-t / tau) holds; the peaks come from the cached
    rollout (every 20 ms), refined by a parabola through the three samples around each."""
    world = worlds["pendulum"]
    _, info = world.reset(0)
    params = {**info["params"], "tau": tau, "angle_deg": 10.0}
    _, info = world.reset(0, params=params)
    times, amps = _peaks(world._qpos[:, 0], CONTROL_DT)
    assert len(times) >= 4, times
    slope = np.polyfit(times, np.log(amps), 1)[0]
    assert -1.0 / slope == pytest.approx(tau, rel=0.03), (times, amps)
    # and the configured damping is the one MuJoCo uses: b = 2 I / tau
    assert info["damping"] == pytest.approx(float(world.model.dof_damping[0]))


def test_bench_worlds_measures_an_episode() -> None:
    from embodied.bench.worlds import measure

    row = measure(["pendulum"], n=1)["pendulum"]
    assert row["cpu_ms_per_episode"] > 0 and row["episodes_per_cpu_s"] > 0
    assert row["cpu_ms_reset"] + row["cpu_ms_record"] == pytest.approx(row["cpu_ms_per_episode"], abs=0.2)


@pytest.mark.parametrize("name", ["drop", *FAMILIES])
def test_shared_render_context_gives_the_pixels_of_a_fresh_one(name: str) -> None:
    """Episodes of one family keep one MjrContext (the data engine's reset cost); every frame must equal
    the frame rendered through a context made for that episode's own model."""
    from embodied.worlds import FrameRenderer

    world = make_world(name, width=SIZE, height=SIZE)
    fresh = FrameRenderer(SIZE, SIZE)
    shared = world._renderer
    try:
        for seed in range(4):
            world.reset(seed)
            frames = world.record(CLIP[:3])
            fresh.close()  # forget the last model: set_model must make a new context
            world._renderer = fresh
            try:
                fresh.set_model(world.model)
                again = world.record(CLIP[:3])
            finally:
                world._renderer = shared
            assert np.array_equal(frames, again), f"{name} seed {seed}"
        assert shared.contexts_made == 1  # the scene's textures and planes are the same every episode
        assert fresh.contexts_made == 4
    finally:
        fresh.close()
        world.close()
