"""Temporal puzzle: a clip cut into equal segments, shuffled; which order of the segments is the real one?

The segments are numbered 1..k in the order they are shown; the right option lists the shown segments in
the order that plays the original clip (Video-R1's frame shuffling, as a question). Segments are
`SEGMENT_FRAMES` frames long, so at 2 frames per temporal patch each of the vision tower's time steps sees
exactly one segment. Easy tier: 3 segments, 3 options. Hard tier: 4 segments, 4 options.

The options must not give the answer away (VERSION 3). Each option plays the original segments in some
order, a permutation of them; the options' permutations are a group `H` (the truth plays the identity),
drawn before the shuffle, and the shown order `s` is drawn uniformly from the shuffles outside `H`. The
option texts are then the left coset `s^-1 H`, and every member of a coset is the right answer for exactly
one of its shuffles, all equally likely: from the options alone each of them is the answer with
probability 1/|H| (chance). Easy tier: H is the 3 rotations of 3 segments; hard tier: one of the 7 groups
of 4 orders of 4 segments (3 cyclic, 4 Klein), drawn uniformly among those whose every non-identity order
plays a visibly different clip (`DISTINCT_TOL`), so exactly one option looks right. A clip where no group
passes (all segments look alike) is rejected (`Ambiguous`) and simulated scenes draw another scene.

Version 2 leaked (docs/cosmos.md, "measured levers"): it drew the distractors from the other orders that
look different from the truth, so when two segments look alike (a toppled tower lying still in two of three
segments) the one order left out of the options was always the truth with its look-alikes swapped, and the
option set named the answer (blind lookup 1.000 on topple's easy tier).

Footage must do more: real segments never repeat exactly (noise, a flickering window), so a window is
refused outright when any two of its segments differ on less than `FOOTAGE_MIN_SEGMENT_CHANGE` of the
picture (a person standing still, an empty floor).
"""

from __future__ import annotations

import itertools
from functools import cache

import numpy as np

from embodied.questions import (
    LETTERS,
    Ambiguous,
    answer_text,
    changed_area,
    order_text,
    piece_difference,
    places_trace,
    reset_world,
    restoring_order,
    scene_meta,
    window_start,
)

NAME = "temporal_puzzle"
VERSION = 3
"""2: footage windows with look-alike segments are refused (`FOOTAGE_MIN_SEGMENT_CHANGE`). 3: the options
are a coset of a group of orders (one per tier: 3 options for 3 segments), so they never tell the answer."""
RANK = 2
SEGMENTS = {"easy": 3, "hard": 4}
SEGMENT_FRAMES = 2
NUM_OPTIONS = {"easy": 3, "hard": 4}
"""Options per tier: the size of the group of orders they come from (3 of 3 segments' 6 orders, 4 of 24)."""
DISTINCT_TOL = 1.0
"""An order counts as visibly different from the truth when the segment it changes most differs by more
than this mean absolute difference (0-255): segments of objects at rest are interchangeable."""
FOOTAGE_MIN_SEGMENT_CHANGE = 0.3
"""Footage: every two segments must differ (`segment_change`) on at least this share of the picture.
Measured on the shared real clips at 2 fps, 112 px (docs/data.md): a man sitting still in a car 0.23,
players on a court 0.33-0.58."""
MAX_TRIES = 20
QUESTION = (
    "This video was cut into {k} segments of {m} frames each, and the segments were shuffled. Numbering the "
    "segments 1 to {k} in the order they are shown, which sequence plays the original video?"
)


def num_options(tier: str, variant: str = "") -> int:
    return NUM_OPTIONS[tier]


def num_frames(tier: str) -> int:
    return SEGMENTS[tier] * SEGMENT_FRAMES


NEEDS_MOTION = True
"""Footage: a window where little moves has no order to restore (`data.min_moving_area`)."""


def footage_frames(tier: str, fam, clip) -> int:
    """Frames of footage one puzzle takes: its segments."""
    return num_frames(tier)


def options_are_orders(record: dict) -> bool:
    """Every option is an order of the shown segments."""
    return True


@cache
def order_groups(k: int, n: int) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """Every group of `n` permutations of `range(k)` (closed under composition, holding the identity), each
    as a tuple of permutations with the identity first, in a fixed order."""
    identity = tuple(range(k))
    others = [p for p in itertools.permutations(range(k)) if p != identity]
    groups = []
    for rest in itertools.combinations(others, n - 1):
        members = {identity, *rest}
        if all(tuple(a[i] for i in b) in members for a in members for b in members):
            groups.append((identity, *rest))
    return tuple(groups)


def shuffle_clip(
    frames: np.ndarray, rng: np.random.Generator, answer: int, tier: str
) -> tuple[dict, np.ndarray]:
    """Question fields and the shuffled clip for `frames (k*m, H, W, 3)` in their original order; raises
    `Ambiguous` when no group of orders has all its non-identity orders visibly different from the clip."""
    k, m, n = SEGMENTS[tier], SEGMENT_FRAMES, NUM_OPTIONS[tier]
    if len(frames) != k * m:
        raise ValueError(f"{tier} temporal puzzle needs {k * m} frames, got {len(frames)}")
    if not 0 <= answer < n:
        raise ValueError(f"{tier} temporal puzzle has {n} options, answer index {answer}")
    segments = frames.reshape(k, m, *frames.shape[1:])

    def looks_different(played: tuple[int, ...]) -> bool:  # the clip played in this order vs the original
        return piece_difference(segments[list(played)], segments) > DISTINCT_TOL

    groups = [g for g in order_groups(k, n) if all(looks_different(p) for p in g[1:])]
    if not groups:
        raise Ambiguous("every group of orders has one that plays a look-alike clip", "look_alike_segments")
    group = groups[int(rng.integers(len(groups)))]
    outside = [p for p in itertools.permutations(range(k)) if p not in group]
    shown = [int(x) for x in outside[int(rng.integers(len(outside)))]]
    where = restoring_order(shown)  # where[i] - 1: the place where original segment i is shown

    def text(played: tuple[int, ...]) -> list[int]:  # the option that plays original segments `played`
        return [where[i] for i in played]

    options = [text(group[1:][i]) for i in rng.permutation(n - 1)]
    options.insert(answer, text(group[0]))
    fields = {
        "question": QUESTION.format(k=k, m=m),
        "options": [order_text(o) for o in options],
        "answer": LETTERS[answer],
        "meta": {"segments": k, "segment_frames": m, "shown_order": shown},
    }
    return fields, np.ascontiguousarray(segments[shown].reshape(frames.shape))


def make(world, rng: np.random.Generator, answer: int, tier: str, fam, clip) -> tuple[dict, np.ndarray]:
    """A shuffled clip of a simulated scene's motion: `(record, frames (k*m, H, W, 3))`."""
    n = num_frames(tier)
    for attempt in range(MAX_TRIES):
        info = reset_world(world, rng, tier)
        start = window_start(info, (n - 1) / clip.fps, rng)
        frames = world.record(start + np.arange(n) / clip.fps)
        try:
            fields, shuffled = shuffle_clip(frames, rng, answer, tier)
        except Ambiguous:
            continue
        meta = fields.pop("meta") | {
            "clip_start_s": round(start, 4),
            "fps": clip.fps,
            "attempts": attempt + 1,
        }
        return {"family": NAME, **fields, "meta": meta | scene_meta(fam.scene, info)}, shuffled
    raise Ambiguous(f"no clip of {fam.scene!r} with distinct segments in {MAX_TRIES} scenes")


def segment_change(segments: np.ndarray) -> float:
    """How different the two most alike of `segments (k, m, H, W, 3)` are: the smallest, over pairs, of the
    mean `changed_area` between their corresponding frames (0 = two identical segments)."""
    k = len(segments)
    return min(
        float(np.mean([changed_area(a, b) for a, b in zip(segments[i], segments[j])]))
        for i in range(k)
        for j in range(i + 1, k)
    )


def from_frames(
    frames: np.ndarray, fps: float, rng: np.random.Generator, answer: int, tier: str, fam
) -> tuple[dict, np.ndarray]:
    """A shuffled clip from the first k*m frames of a moving window of real footage; raises `Ambiguous` when
    two segments look alike (`FOOTAGE_MIN_SEGMENT_CHANGE`) or no visible shuffle exists."""
    clip = frames[: num_frames(tier)]
    change = segment_change(clip.reshape(SEGMENTS[tier], SEGMENT_FRAMES, *clip.shape[1:]))
    if change < FOOTAGE_MIN_SEGMENT_CHANGE:
        raise Ambiguous(
            f"two segments differ on only {change:.0%} of the picture (< {FOOTAGE_MIN_SEGMENT_CHANGE:.0%}): "
            "swapping them would play the same video",
            "look_alike_segments",
        )
    fields, shuffled = shuffle_clip(clip, rng, answer, tier)
    meta = fields.pop("meta") | {"fps": fps, "segment_change": round(change, 3)}
    return {"family": NAME, **fields, "meta": meta}, shuffled


def verify(record: dict, shown: np.ndarray, original: np.ndarray) -> bool:
    """The answer is the only option whose order turns the shown clip back into `original`."""
    k, m = record["meta"]["segments"], record["meta"]["segment_frames"]
    segs = shown.reshape(k, m, *shown.shape[1:])
    right = LETTERS.index(record["answer"])

    def plays_original(text: str) -> bool:
        order = [int(x) - 1 for x in text.split(",")]
        return np.array_equal(segs[order].reshape(original.shape), original)

    return [plays_original(o) for o in record["options"]] == [
        i == right for i in range(len(record["options"]))
    ]


def reasoning_for(record: dict) -> str:
    text = answer_text(record)
    return f"Played as {text}, the motion is continuous and runs the way physics allows."


def trace_for(record: dict) -> str:
    """SFT trace (`sft.rationale=trace`): each shown segment's place in the original clip, then the order
    (`tasks.places_trace`), e.g. `3 1 2 -> 2, 3, 1`."""
    return places_trace(record)
