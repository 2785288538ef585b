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

import colorsys

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
ORDERS = ("forward", "reversed", "shuffled")


def colour_name(rgba) -> str:
    hue = colorsys.rgb_to_hsv(*rgba[:3])[0]
    return next(name for bound, name in COLOURS if hue < bound)


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

    colours = sorted({c for _, c in COLOURS})
    return [QUESTION, *colours, *SHAPES, *(h for _, h in HEIGHTS), "objects", "object", "frame"]


def _observe(model, data):
    from embodied.worlds.drop import image_x, lowest_points

    return lowest_points(model, data), image_x(model, data)


def make_clip(world, seed: int, max_start: float, num_frames: int = 4, fps: float = 2.0):
    """One captioned clip: `(frames (T, H, W, 3), caption, meta)`, shown in a random order."""
    rng = np.random.default_rng(seed)
    _, info = world.reset(rng)
    start = float(rng.uniform(0.0, max_start))
    frames, seen = world.record_observed(start + np.arange(num_frames) / fps, _observe)
    order_kind = ORDERS[int(rng.integers(len(ORDERS)))]
    shown = {
        "forward": np.arange(num_frames),
        "reversed": np.arange(num_frames)[::-1],
        "shuffled": rng.permutation(num_frames),
    }[order_kind]
    objects = info["params"]["objects"]
    heights = np.stack([seen[k][0] for k in shown])
    text = caption(
        [o["shape"] for o in objects], [colour_name(o["rgba"]) for o in objects], heights, seen[shown[0]][1]
    )
    meta = {"seed": int(seed), "order": order_kind, "start_s": round(start, 4)}
    return np.ascontiguousarray(frames[shown]), text, meta
