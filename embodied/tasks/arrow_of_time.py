"""Arrow of time: is this clip playing forward or reversed?

The label comes free from physics: dropped objects fall, bounce lower each time and come to rest, which
run backwards is impossible. Forward and reversed clips are cut from the same raw frames (one simulation,
frame order flipped), never by re-encoding a reversed file, with a random clip window starting within
the first `max_start` seconds after release so that the window always contains the irreversible part.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from embodied.tasks import LETTERS

NAME = "arrow_of_time"
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


@dataclass
class ClipSpec:
    """What one arrow-of-time clip looks like."""

    fps: float = 2.0
    num_frames: int = 4
    max_start: float = 0.25
    """Latest clip start after release (s). Later starts give nearly static clips with no answer."""


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
    _, info = world.reset(rng)
    start = float(rng.uniform(0.0, spec.max_start))
    times = start + np.arange(spec.num_frames) / spec.fps
    frames = world.record(times)
    if reverse:
        frames = frames[::-1]
    answer = LETTERS[OPTIONS.index("reversed" if reverse else "forward")]
    record = {
        "task": NAME,
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
    return REASONING[record["options"][LETTERS.index(record["answer"])]]
