"""Object permanence: an object goes behind a screen, the screen is lifted; is what is revealed possible?

Built on the `occluder` world (`reset(rng, outcome=...)`): an object rolls or slides behind a screen and
stops; while it is hidden, impossible outcomes edit the scene (the object vanishes, is teleported, or
changes colour/shape); then the screen rises and the place is revealed. The clip runs at `clip.fps` from
1.5 s before the object disappears to half a second after the screen is out of view, so it shows
the object moving, its disappearance and the reveal.

Variants:
- `outcome` (default): four options, one per outcome, always in the same order, so balanced letters are
  balanced outcomes.
- `possible`: "is this physically possible?" yes/no; "no" clips draw their impossible outcome uniformly.

Tiers go to the world's `difficulty` (easy: large object; hard: small object, clutter, more camera jitter).
"""

from __future__ import annotations

import numpy as np

from embodied.questions import LETTERS, reset_world, scene_meta

NAME = "object_permanence"
VERSION = 1
RANK = 3
VARIANTS = ("outcome", "possible")
OUTCOMES = ("possible", "vanished", "teleported", "changed")
OUTCOME_OPTIONS = (
    "The object is where its motion took it, as it was (physically possible)",
    "The object has vanished (impossible)",
    "The object is somewhere else (impossible)",
    "The object has changed its colour or shape (impossible)",
)
OUTCOME_Q = (
    "An object moved behind the screen, then the screen was lifted. What does the end of the video show?"
)
POSSIBLE_Q = (
    "An object moved behind the screen, then the screen was lifted. "
    "Is what the video shows physically possible?"
)
POSSIBLE_OPTIONS = ("yes", "no")
BEFORE_HIDDEN = 1.5
"""Seconds of clip before the object is fully hidden: the viewer must see what went behind the screen and
how it moved (two or three frames at 2 fps)."""
AFTER_LIFT = 0.5
MAX_FRAMES = 12


def num_options(tier: str, variant: str = "") -> int:
    return len(POSSIBLE_OPTIONS) if variant == "possible" else len(OUTCOME_OPTIONS)


def clip_times(info: dict, fps: float) -> np.ndarray:
    """Frame times (s): from `BEFORE_HIDDEN` before the hiding to `AFTER_LIFT` after the screen is gone."""
    t0 = max(0.0, float(info["hidden"][0]) - BEFORE_HIDDEN)
    end = max(float(info["reveal_time"]), float(info["lift"][1])) + AFTER_LIFT
    n = min(MAX_FRAMES, int(np.floor((end - t0) * fps + 1e-9)) + 1)
    return t0 + np.arange(n) / fps


def make(world, rng: np.random.Generator, answer: int, tier: str, fam, clip) -> tuple[dict, np.ndarray]:
    """One occluder episode with the outcome the answer asks for: `(record, frames (T, H, W, 3))`."""
    variant = fam.variant or VARIANTS[0]
    if variant not in VARIANTS:
        raise ValueError(f"object_permanence variant must be one of {VARIANTS}, got {variant!r}")
    if variant == "outcome":
        outcome = OUTCOMES[answer]
        question, options = OUTCOME_Q, list(OUTCOME_OPTIONS)
    else:
        outcome = "possible" if answer == 0 else OUTCOMES[1 + int(rng.integers(3))]
        question, options = POSSIBLE_Q, list(POSSIBLE_OPTIONS)
    info = reset_world(world, rng, tier, outcome=outcome)
    if info.get("outcome", outcome) != outcome:
        raise RuntimeError(f"{type(world).__name__} made outcome {info.get('outcome')!r}, not {outcome!r}")
    times = clip_times(info, clip.fps)
    frames = world.record(times)
    meta = {
        "variant": variant,
        "outcome": outcome,
        "fps": clip.fps,
        "num_frames": len(times),
        "clip_start_s": round(float(times[0]), 4),
        "hidden_s": [round(float(t), 4) for t in info["hidden"]],
        "reveal_s": round(float(info["reveal_time"]), 4),
        **scene_meta(fam.scene, info),
    }
    record = {
        "family": NAME,
        "question": question,
        "options": options,
        "answer": LETTERS[answer],
        "meta": meta,
    }
    return record, np.ascontiguousarray(frames)


def verify(record: dict, outcome: str) -> bool:
    """The answer names the outcome that was simulated."""
    chosen = LETTERS.index(record["answer"])
    if record["meta"]["variant"] == "possible":
        return (chosen == 0) == (outcome == "possible")
    return OUTCOMES[chosen] == outcome


def reasoning_for(record: dict) -> str:
    outcome = record["meta"]["outcome"]
    if outcome == "possible":
        return "The object stays where it stopped behind the screen and looks the same when revealed."
    what = {"vanished": "is gone", "teleported": "is somewhere else", "changed": "looks different"}[outcome]
    return f"Objects persist behind screens, but when the screen is lifted the object {what}."


def trace_for(record: dict) -> str:
    """SFT trace (`sft.rationale=trace`): the simulated outcome (`meta.outcome`: possible | vanished |
    teleported | changed), the one word the clip's reveal decides."""
    return record["meta"]["outcome"]
