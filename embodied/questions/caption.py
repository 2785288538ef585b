"""Perception captions of drop clips: what `embodied pretrain` teaches the tiny base (not a question family).

The simulator knows what each frame shows, so it writes the target::

    3 objects: red box, blue sphere, green capsule.
    frame 1: red high, blue high, green low. frame 2: red floor, blue low, green floor. ...

Objects are listed left to right in the first frame shown; heights are binned from each object's lowest
point (`high` >= 0.3 m, `low`, `floor` < 0.03 m). Clips are shown forward, reversed or with shuffled
frames (one third each) and start anywhere in the first `max_start` seconds, so the frame index tells
nothing about the height. The captions never say which way time runs.
"""

from __future__ import annotations

import numpy as np

QUESTION = "Describe the video: the objects, then how high each one is in every frame."
HEIGHTS = ((0.03, "floor"), (0.3, "low"), (float("inf"), "high"))
"""Upper bounds (m, lowest point above the floor) of the height words."""
COLOURS = (
    (0.04, "red"),
    (0.11, "orange"),
    (0.19, "yellow"),
    (0.45, "green"),
    (0.54, "cyan"),
    (0.72, "blue"),
    (0.85, "purple"),
    (0.93, "pink"),
    (1.01, "red"),
)
"""Upper bounds of hue (0-1) of the colour words."""
COLOUR_WORDS = tuple(dict.fromkeys(name for _, name in COLOURS))
"""The colour words, each once (red closes the hue wheel at both ends)."""
ORDERS = ("forward", "reversed", "shuffled")


_HUE_BOUNDS = np.array([bound for bound, _ in COLOURS])
_HUE_WORDS = np.array([COLOUR_WORDS.index(name) for _, name in COLOURS])
"""`COLOURS` as arrays: upper hue bounds, and the index in `COLOUR_WORDS` of each bound's word."""


def colour_index(rgb) -> np.ndarray:
    """The index in `COLOUR_WORDS` of the hue's name of every colour in `rgb` (`(..., 3)`, any scale): the
    hue of HSV (as `colorsys`), binned by `COLOURS`. A grey has hue 0 (red)."""
    rgb = np.asarray(rgb)
    rgb = rgb if np.issubdtype(rgb.dtype, np.floating) else rgb.astype(np.float32)
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    hi, lo = rgb.max(-1), rgb.min(-1)
    span = np.maximum(hi - lo, 1e-6)
    hue = np.where(hi == r, (g - b) / span % 6, np.where(hi == g, (b - r) / span + 2, (r - g) / span + 4)) / 6
    return _HUE_WORDS[np.minimum(np.searchsorted(_HUE_BOUNDS, hue, side="right"), len(_HUE_BOUNDS) - 1)]


def colour_name(rgba) -> str:
    """The colour word of one RGB(A) colour (components 0-1)."""
    return COLOUR_WORDS[int(colour_index(np.asarray(rgba, np.float64)[:3]))]


def height_word(z: float) -> str:
    return next(name for bound, name in HEIGHTS if z < bound)


def caption(shapes: list[str], colours: list[str], heights: np.ndarray, xs: np.ndarray) -> str:
    """The target text: objects left to right (by `xs`), then each shown frame's heights `(T, N)`."""
    order = np.argsort(xs, kind="stable")
    n = len(order)
    head = f"{n} object{'s' if n > 1 else ''}: " + ", ".join(f"{colours[i]} {shapes[i]}" for i in order)
    frames = [
        f"frame {t + 1}: " + ", ".join(f"{colours[i]} {height_word(row[i])}" for i in order)
        for t, row in enumerate(heights)
    ]
    return ". ".join([head, *frames]) + "."


def caption_words() -> list[str]:
    """Every word a caption can use, for the tiny tokenizer's corpus."""
    from embodied.worlds.drop import SHAPES

    colours = sorted(COLOUR_WORDS)
    return [QUESTION, *colours, *SHAPES, *(h for _, h in HEIGHTS), "objects", "object", "frame"]


def shown_order(rng: np.random.Generator, num_frames: int) -> tuple[str, np.ndarray]:
    """Forward, reversed or shuffled (a third each) and the frame indices in that order; the permutation is
    drawn whichever order is chosen, so the rng advances alike."""
    kind = ORDERS[int(rng.integers(len(ORDERS)))]
    orders = {
        "forward": np.arange(num_frames),
        "reversed": np.arange(num_frames)[::-1],
        "shuffled": rng.permutation(num_frames),
    }
    return kind, orders[kind]


def _observe(model, data):
    from embodied.worlds.drop import image_x, lowest_points

    return lowest_points(model, data), image_x(model, data)


def make_clip(world, seed: int, max_start: float, num_frames: int = 4, fps: float = 2.0):
    """One captioned clip: `(frames (T, H, W, 3), caption, meta)`, shown in a random order."""
    rng = np.random.default_rng(seed)
    _, info = world.reset(rng)
    start = float(rng.uniform(0.0, max_start))
    frames, seen = world.record_observed(start + np.arange(num_frames) / fps, _observe)
    order_kind, shown = shown_order(rng, num_frames)
    objects = info["params"]["objects"]
    heights = np.stack([seen[k][0] for k in shown])
    text = caption(
        [o["shape"] for o in objects], [colour_name(o["rgba"]) for o in objects], heights, seen[shown[0]][1]
    )
    meta = {"seed": int(seed), "order": order_kind, "start_s": round(start, 4)}
    return np.ascontiguousarray(frames[shown]), text, meta


# --- every scene: where each object is in every frame, whether it is seen, how it stands, if it moves -----

SCENE_QUESTION = "Describe the video: the objects, then where each one is in every frame."
OBJECTS_QUESTION = "Name the objects in the video: their colours and shapes."
GRID = 8
"""Image positions are squares of an 8 x 8 grid named like chess squares: columns a-h left to right, rows 1-8
top to bottom (14 px, one vision patch, at 112 px)."""
MAX_OBJECTS = 2
"""Objects a scene caption follows (evenly chosen among the scene's movable ones: a domino row's two ends, a
tower's bottom and top block), which keeps a six-frame caption within ~150 tokens."""
MOVING_SPEED = 0.05
"""m/s (linear, plus 0.05 m times angular): faster than this is `moving`, else `still`."""
_SHAPES = {
    "box": "box",
    "sphere": "sphere",
    "cylinder": "cylinder",
    "capsule": "capsule",
    "ellipsoid": "ball",
}


def _movable(model, body: int) -> bool:
    """A body that moves: it (or a parent) has a joint, or it is a mocap body (the occluder's screen)."""
    while body > 0:
        if model.body_jntnum[body] > 0 or model.body_mocapid[body] >= 0:
            return True
        body = model.body_parentid[body]
    return False


def scene_objects(model) -> list[int]:
    """Geom ids the caption follows: saturated (not grey), visible, on movable bodies; at most `MAX_OBJECTS`,
    evenly spaced in geom order."""
    ids = []
    for g in range(model.ngeom):
        rgba = model.geom_rgba[g]
        hi, lo = float(rgba[:3].max()), float(rgba[:3].min())
        if model.geom_bodyid[g] == 0 or rgba[3] < 0.5 or hi - lo < 0.3 * hi:
            continue
        if _movable(model, int(model.geom_bodyid[g])):
            ids.append(g)
    if len(ids) > MAX_OBJECTS:
        ids = [ids[i] for i in np.linspace(0, len(ids) - 1, MAX_OBJECTS).round().astype(int)]
    return ids


def object_name(model, g: int) -> str:
    import mujoco

    kind = mujoco.mjtGeom(int(model.geom_type[g])).name.removeprefix("mjGEOM_").lower()
    return f"{colour_name(model.geom_rgba[g])} {_SHAPES.get(kind, 'object')}"


def _cell(model, data, point: np.ndarray, camera: str = "cam") -> str:
    """The `GRID` square (`a1` top left ... `h8` bottom right) where `point` (world, m) projects; `out` when
    it is behind the camera or outside the picture."""
    cam = model.camera(camera)
    rel = data.cam_xmat[cam.id].reshape(3, 3).T @ (point - data.cam_xpos[cam.id])
    if rel[2] > -1e-6:  # MuJoCo cameras look along their -z axis
        return "out"
    f = 1.0 / np.tan(np.deg2rad(model.cam_fovy[cam.id]) / 2)
    aspect = model.vis.global_.offwidth / max(1, model.vis.global_.offheight)
    x, y = f * rel[0] / -rel[2] / aspect, f * rel[1] / -rel[2]  # -1 .. 1 inside the picture
    if abs(x) > 1 or abs(y) > 1:
        return "out"
    col, row = min(GRID - 1, int((x + 1) / 2 * GRID)), min(GRID - 1, int((1 - y) / 2 * GRID))
    return f"{'abcdefgh'[col]}{row + 1}"


def _seen(model, data, g: int, camera: str = "cam") -> bool:
    """Whether the first thing on the ray from the camera to geom `g`'s centre belongs to `g`'s body."""
    import mujoco

    cam = model.camera(camera)
    origin = data.cam_xpos[cam.id].copy()
    hit = np.zeros(1, dtype=np.int32)
    mujoco.mj_ray(model, data, origin, data.geom_xpos[g] - origin, None, 1, -1, hit)
    return hit[0] >= 0 and model.geom_bodyid[hit[0]] == model.geom_bodyid[g]


def _pose(model, data, g: int) -> str:
    """`upright`, `tilted` or `lying`: the angle of the geom's own z axis to the vertical (none for balls)."""
    import mujoco

    if model.geom_type[g] == mujoco.mjtGeom.mjGEOM_SPHERE:
        return ""
    tilt = np.degrees(np.arccos(np.clip(abs(data.geom_xmat[g].reshape(3, 3)[2, 2]), 0.0, 1.0)))
    return " upright" if tilt < 20 else " tilted" if tilt < 65 else " lying"


def _speed(model, data, g: int) -> float:
    import mujoco

    vel = np.zeros(6)
    mujoco.mj_objectVelocity(model, data, mujoco.mjtObj.mjOBJ_GEOM, g, vel, 0)
    return float(np.linalg.norm(vel[3:]) + 0.05 * np.linalg.norm(vel[:3]))


def observe_scene(model, data, ids: list[int]) -> list[str]:
    """One word group per followed geom for this frame: `<colour> <cell>[ <pose>] <moving|still>`, or
    `<colour> hidden` when something stands between it and the camera, `<colour> out` outside the picture."""
    import mujoco

    mujoco.mj_forward(model, data)  # velocities and contacts of exactly this state
    words = []
    for g in ids:
        colour = colour_name(model.geom_rgba[g])
        cell = _cell(model, data, data.geom_xpos[g])
        if cell == "out":
            words.append(f"{colour} out")
        elif not _seen(model, data, g):
            words.append(f"{colour} hidden")
        else:
            motion = "moving" if _speed(model, data, g) > MOVING_SPEED else "still"
            words.append(f"{colour} {cell}{_pose(model, data, g)} {motion}")
    return words


def scene_caption(names: list[str], frames: list[list[str]]) -> str:
    """The target text: the followed objects, then each shown frame's word groups."""
    head = f"{len(names)} object{'s' if len(names) > 1 else ''}: " + ", ".join(names)
    return ". ".join([head, *(f"frame {t + 1}: " + ", ".join(w) for t, w in enumerate(frames))]) + "."


def make_scene_clip(world, seed: int, num_frames: int, fps: float = 2.0, difficulty: str = "easy"):
    """One captioned clip of any `SceneWorld` (`(frames, caption, meta)`), its window starting from half a
    second before the motion to half the clip before its end (the occluder: anywhere up to the screen's lift),
    shown forward, reversed or shuffled (a third each): the caption describes the frames as shown and never
    names an order."""
    rng = np.random.default_rng(seed)
    _, info = world.reset(rng, difficulty=difficulty)
    duration = (num_frames - 1) / fps
    t0, t1 = (float(x) for x in info["motion"])
    lo, hi = max(0.0, t0 - 0.5), max(t0, t1 - duration / 2)
    if "lift" in info:  # object permanence: the hiding and the reveal come after the motion
        lo, hi = 0.0, max(0.0, float(info["lift"][1]) + 0.5 - duration)
    start = float(rng.uniform(lo, hi))
    ids = scene_objects(world.model)
    frames, seen = world.record_observed(
        start + np.arange(num_frames) / fps, lambda m, d: observe_scene(m, d, ids)
    )
    order_kind, shown = shown_order(rng, num_frames)
    text = scene_caption([object_name(world.model, g) for g in ids], [seen[k] for k in shown])
    meta = {"seed": int(seed), "order": order_kind, "start_s": round(start, 4), "difficulty": difficulty}
    return np.ascontiguousarray(frames[shown]), text, meta
