"""Arrow of time: is this clip playing forward or reversed?

The label comes free from physics: dropped objects fall, bounce lower each time and come to rest, which
run backwards is impossible. Forward and reversed clips are cut from the same raw frames (one simulation,
frame order flipped), never by re-encoding a reversed file, with a random clip window starting within
the first `max_start` seconds after release so that the window always contains the irreversible part.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from embodied.questions import LETTERS, ClipSpec, answer_text, reset_world, scene_meta, window_start

NAME = "arrow_of_time"
VERSION = 2
"""2: simulated scenes from the world registry, difficulty tiers, clips cut from real footage."""
RANK = 0
"""Place in `questions.FAMILIES`; first: the default family, whose quickstart is `data.families: []`."""
QUESTION = "Is this video playing forward or reversed in time?"
OPTIONS = ("forward", "reversed")
# Short rationales for SFT targets: what a physicist would point at, tied to the label.
REASONING = {
    "forward": "The objects fall, bounce lower each time and settle at rest.",
    "reversed": "The objects leave rest and bounce higher each time, which physics forbids.",
}


def phrases() -> Iterator[str]:
    yield QUESTION
    yield from OPTIONS
    yield from REASONING.values()


NEEDS_MOTION = True
"""Footage: a window where little moves has no arrow of time (`data.min_moving_area`)."""


def footage_frames(tier: str, fam, clip: ClipSpec) -> int:
    """Frames of footage one clip takes: the family's own `num_frames`, else the dataset's."""
    return fam.num_frames or clip.num_frames


def quickstart_answers(n: int, rng: np.random.Generator) -> np.ndarray:
    """The quickstart's answers (0 forward, 1 reversed): half of each, as `balanced_directions` draws them."""
    return balanced_directions(n, rng).astype(int)


def quickstart_example(world, seed: int, answer: int, clip: ClipSpec) -> tuple[dict, np.ndarray]:
    """The quickstart's record for `seed`: a drop clip of `clip`, reversed when `answer` names "reversed"."""
    return make_example(world, seed, OPTIONS[answer] == "reversed", clip)


def balanced_directions(n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` booleans (True = reversed), half of each (the odd one out random), in random order."""
    rev = np.arange(n) < n // 2
    if n % 2:
        rev[-1] = bool(rng.integers(2))
    return rng.permutation(rev)


def make_example(world, seed: int, reverse: bool, spec: ClipSpec) -> tuple[dict, np.ndarray]:
    """Simulate one drop with `seed` and return `(record, frames)`; the caller stores the frames.

    The record has every field of the JSONL format except `id` and `video`.
    """
    rng = np.random.default_rng(seed)
    # physics only as far as the latest frame any window can need (the rest of the horizon is unused here)
    _, info = world.reset(rng, simulate=spec.max_start + (spec.num_frames - 1) / spec.fps + 0.05)
    start = float(rng.uniform(0.0, spec.max_start))
    times = start + np.arange(spec.num_frames) / spec.fps
    frames = world.record(times)
    if reverse:
        frames = frames[::-1]
    answer = LETTERS[OPTIONS.index("reversed" if reverse else "forward")]
    record = {
        "family": NAME,
        "question": QUESTION,
        "options": list(OPTIONS),
        "answer": answer,
        "meta": {
            "seed": int(seed),
            "direction": "reversed" if reverse else "forward",
            "clip_start_s": round(start, 4),
            "fps": spec.fps,
            "num_frames": spec.num_frames,
            "difficulty": "easy",
            "scene": info.get("params", {}),
        },
    }
    return record, np.ascontiguousarray(frames)


def reasoning_for(record: dict) -> str:
    """SFT rationale for a record (derived from its label)."""
    return REASONING[answer_text(record)]


def trace_for(record: dict) -> str:
    """SFT trace (`sft.rationale=trace`): the direction the clip plays (its options are fixed, so the trace
    is the answer's text)."""
    return answer_text(record)


def num_options(tier: str, variant: str = "") -> int:
    return len(OPTIONS)


def _record(answer: int, meta: dict) -> dict:
    return {
        "family": NAME,
        "question": QUESTION,
        "options": list(OPTIONS),
        "answer": LETTERS[answer],
        "meta": meta,
    }


def make(
    world, rng: np.random.Generator, answer: int, tier: str, fam, clip: ClipSpec
) -> tuple[dict, np.ndarray]:
    """One clip of a simulated scene, forward (`answer` 0) or reversed (1): `(record, frames (T, H, W, 3))`.

    Easy: the window starts right where the irreversible motion starts (drop: within `clip.max_start` s of
    release). Hard: anywhere inside the motion (drop: its first 2.5 s), where it is slower and subtler.
    """
    info = reset_world(world, rng, tier)
    n = fam.num_frames or clip.num_frames
    duration = (n - 1) / clip.fps
    if tier == "easy":
        t0 = float(info["motion"][0])
        start = float(rng.uniform(t0, t0 + clip.max_start))
    else:
        start = window_start(info, duration, rng)
    frames = world.record(start + np.arange(n) / clip.fps)
    meta = {
        "direction": OPTIONS[answer],
        "clip_start_s": round(start, 4),
        "fps": clip.fps,
        "num_frames": n,
        **scene_meta(fam.scene, info),
    }
    return _record(answer, meta), np.ascontiguousarray(frames[::-1] if answer == 1 else frames)


def from_frames(
    frames: np.ndarray, fps: float, rng: np.random.Generator, answer: int, tier: str, fam
) -> tuple[dict, np.ndarray]:
    """A clip of real footage `(T, H, W, 3)` (a window the caller found to move), forward or reversed."""
    del rng, tier, fam  # the window is the caller's; nothing else to draw
    meta = {"direction": OPTIONS[answer], "fps": fps, "num_frames": len(frames)}
    return _record(answer, meta), np.ascontiguousarray(frames[::-1] if answer == 1 else frames)


def verify(record: dict, shown: np.ndarray, original: np.ndarray) -> bool:
    """The answer is right: the shown clip is the original one in the order the answer names."""
    reverse = answer_text(record) == "reversed"
    palindrome = np.array_equal(original, original[::-1])  # a still clip has no arrow of time
    return bool(not palindrome and np.array_equal(shown, original[::-1] if reverse else original))
