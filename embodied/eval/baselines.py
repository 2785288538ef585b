"""Shortcut-audit baselines: what a score looks like when the answer could not have come from the video.

Two baselines need no model:

- `random`: a uniform letter over the question's options, drawn per question from
  `np.random.default_rng([seed, index])`.
- `majority`: per family, the answer letter most frequent in the TRAIN split (ties go to the
  alphabetically first letter); a family absent from the train split, or a dataset without one, uses
  the evaluated split's own answers, and the result says which source each family used.

Three run the given policy on modified clips, so that a policy that truly reads the video drops to
chance on questions whose answer needs what was removed:

- `blind`: every frame all black, same count and size. The prompt, its visual token count and the
  M-RoPE positions are those of the real question, so only the pixels' content is withdrawn; a
  text-only prompt would also change the sequence the model was trained on, and a drop could then be
  the shift and not the missing evidence. Frame count and size stay visible (they are constant within
  every family generated here).
- `single-frame`: the middle frame repeated to the clip's length. An even-length clip has two middle
  frames; each is shown in its own view and the question scores the mean of both. Reversal swaps the
  two, so a forward clip and its reversal get the same pair of inputs; picking one of them would let a
  single frame carry how far the motion had got at mid-clip, a cue that differs with the direction.
- `shuffled-frames`: the frames in a uniformly random order, drawn per question from
  `np.random.default_rng([seed, index])`; the permutation never depends on the record.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from embodied.data.load import load_records
from embodied.questions import LETTERS
from embodied.video import Clip

MODEL_FREE = ("random", "majority")
VIDEO_BASELINES = ("blind", "single-frame", "shuffled-frames")
BASELINES = ("none", *MODEL_FREE, *VIDEO_BASELINES)


def check_baseline(name: str) -> None:
    if name not in BASELINES:
        raise ValueError(f"eval.baseline={name!r} is not a baseline; choose one of {list(BASELINES)}")


def question_rng(seed: int, index: int) -> np.random.Generator:
    """The generator of question `index`: a function of the seed and the position only, never the record."""
    return np.random.default_rng([seed, index])


# --- modified clips ---------------------------------------------------------------------------------


def blind(clip: Clip) -> Clip:
    """All-black frames of the clip's shape `(T, H, W, 3)` and rate."""
    return Clip(np.zeros_like(clip.frames), clip.fps)


def single_frame_views(clip: Clip) -> list[Clip]:
    """The middle frame repeated T times; for even T, one such clip per middle frame (two views)."""
    t = len(clip.frames)
    middle = [t // 2] if t % 2 else [t // 2 - 1, t // 2]
    return [Clip(np.repeat(clip.frames[i : i + 1], t, axis=0), clip.fps) for i in middle]


def shuffled(clip: Clip, rng: np.random.Generator) -> Clip:
    """The frames in the order of a uniform random permutation (the identity included, so the
    shuffled clips of a forward and of a reversed video have the same distribution)."""
    return Clip(clip.frames[rng.permutation(len(clip.frames))], clip.fps)


def baseline_views(clip: Clip, baseline: str, rng: np.random.Generator) -> list[Clip]:
    """What the policy sees for one question under `baseline` (`none`: the clip itself)."""
    if baseline == "none":
        return [clip]
    if baseline == "blind":
        return [blind(clip)]
    if baseline == "single-frame":
        return single_frame_views(clip)
    if baseline == "shuffled-frames":
        return [shuffled(clip, rng)]
    raise ValueError(f"baseline {baseline!r} does not modify clips; video baselines are {VIDEO_BASELINES}")


# --- baselines without a model ----------------------------------------------------------------------


def majority_letters(records: Sequence[dict], train: Sequence[dict] | None) -> tuple[dict, dict]:
    """Per family, the most frequent answer letter in `train` (alphabetical on ties), falling back to
    `records` themselves for a family that `train` lacks. Returns `(letters, sources)`."""
    letters, sources = {}, {}
    for family in sorted({r["family"] for r in records}):
        pool = [r["answer"] for r in train or () if r["family"] == family]
        sources[family] = "train"
        if not pool:
            pool = [r["answer"] for r in records if r["family"] == family]
            sources[family] = "evaluated split (no train records of this family)"
        counts = Counter(pool)
        top = max(counts.values())
        letters[family] = min(a for a, c in counts.items() if c == top)
    return letters, sources


def model_free_predictions(
    records: Sequence[dict],
    baseline: str,
    seed: int = 0,
    samples: int = 0,
    letters: dict[str, str] | None = None,
) -> list[dict]:
    """Prediction rows (the shape `evaluate` writes) of the `random` or `majority` baseline.

    `random` draws the greedy answer and each of the `samples` sampled answers uniformly; `majority`
    gives its family's letter every time (`letters`, see `majority_letters`)."""
    if baseline == "majority" and letters is None:
        raise ValueError("the majority baseline needs `letters` (see majority_letters)")
    rows = []
    for i, r in enumerate(records):
        m = len(r["options"])
        if baseline == "random":
            drawn = question_rng(seed, i).integers(m, size=1 + samples)
            guess, sampled = LETTERS[drawn[0]], [LETTERS[j] for j in drawn[1:]]
        elif baseline == "majority":
            guess = letters[r["family"]]
            sampled = [guess] * samples
        else:
            raise ValueError(f"{baseline!r} is not a model-free baseline; those are {MODEL_FREE}")
        row = {
            "id": r["id"],
            "family": r["family"],
            "difficulty": r.get("meta", {}).get("difficulty"),
            "n_options": m,
            "answer": r["answer"],
            "predicted": guess,
            "response": f"<answer>{guess}</answer>",
            "choice": None,
        }
        if samples:
            row["sampled"] = sampled
        rows.append(row)
    return rows


def load_majority(root: str | Path, split: str, records: Sequence[dict]) -> tuple[dict, dict]:
    """`majority_letters` with the train split of `root` when it exists (and is not the one evaluated)."""
    train = None
    if split != "train" and (Path(root) / "train.jsonl").is_file():
        train = load_records(root, "train")
    return majority_letters(records, train)


def model_free_eval(
    root: str | Path,
    split: str,
    baseline: str,
    seed: int = 0,
    samples: int = 0,
    k: Sequence[int] = (),
    limit: int | None = None,
) -> dict:
    """The `random` or `majority` baseline on `root/split` (records only, no video): the dict `evaluate`
    returns, with the majority letters and their source under `settings`."""
    from embodied.eval.stats import prediction_stats, resolve_k

    ks = resolve_k(samples, k)
    records = load_records(root, split)[:limit]
    letters, sources = load_majority(root, split, records) if baseline == "majority" else (None, None)
    rows = model_free_predictions(records, baseline, seed, samples, letters)
    result = prediction_stats(rows, k=ks)
    result["settings"] = {"baseline": baseline, "samples": samples, "k": ks, "seed": seed}
    if letters is not None:
        result["settings"] |= {"majority_letters": letters, "majority_source": sources}
    result["predictions"] = rows
    return result
