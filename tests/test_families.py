"""Question families on synthetic frames: answers land where asked, exactly one option is right (checked by
each family's verifier against the original), and material without a unique answer is refused."""

from __future__ import annotations

import numpy as np
import pytest

from embodied.questions import (
    LETTERS,
    Ambiguous,
    FamilySpec,
    balanced_answers,
    order_options,
    restoring_order,
    sft_target,
)
from embodied.questions import arrow_of_time as aot
from embodied.questions import spatial_puzzle as sp
from embodied.questions import temporal_puzzle as tp


def _noise(shape, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


@pytest.mark.parametrize("n,k", [(12, 4), (10, 4), (7, 2), (3, 4)])
def test_balanced_answers(n, k):
    a = balanced_answers(n, k, np.random.default_rng(0))
    counts = np.bincount(a, minlength=k)
    assert len(a) == n and counts.sum() == n and counts.max() - counts.min() <= 1
    if n % k == 0:
        assert (counts == n // k).all()


def test_restoring_order_and_options():
    shown = [2, 0, 3, 1]  # place j shows original piece shown[j]
    truth = restoring_order(shown)
    assert truth == [2, 4, 1, 3]  # piece 0 is shown at place 2, piece 1 at place 4, ...
    assert [shown[x - 1] for x in truth] == [0, 1, 2, 3]
    rng = np.random.default_rng(0)
    for answer in range(4):
        opts = order_options(truth, answer, 4, rng, accept=lambda o: o[0] != 3)
        assert opts[answer] == truth and len({tuple(o) for o in opts}) == 4
        assert [1, 2, 3, 4] not in opts  # "nothing shuffled" is never offered
        assert all(o[0] != 3 for i, o in enumerate(opts) if i != answer)  # accept filter respected
    with pytest.raises(Ambiguous):
        order_options(truth, 0, 4, rng, accept=lambda o: False)


@pytest.mark.parametrize("tier", ["easy", "hard"])
@pytest.mark.parametrize("variant", ["arrangement", "patch"])
def test_spatial_puzzle_answer_is_unique(tier, variant):
    image = _noise((128, 128, 3))
    fam = FamilySpec(family="spatial_puzzle", variant=variant)
    for answer in range(4):
        rec, still = sp.from_frames(image[None], 2.0, np.random.default_rng(answer), answer, tier, fam)
        assert rec["answer"] == LETTERS[answer] and len(rec["options"]) == 4
        assert len(set(rec["options"])) == 4
        g = sp.GRID[tier]
        assert rec["meta"]["grid"] == g and still.shape[0] == 2 and np.array_equal(still[0], still[1])
        assert still.shape[1] == still.shape[2] and still.shape[1] % 2 == 0
        assert sp.verify(rec, image)
        wrong = dict(rec, answer=LETTERS[(answer + 1) % 4])
        assert not sp.verify(wrong, image)
        # The shown image is the original's patches, moved (away from the drawn labels/outline).
        patches = sp.cut(image, g)
        shown = sp.cut(still[0], g)
        p = patches.shape[1]
        inner = (slice(p // 2, p - 3), slice(p // 2, p - 3))
        for j, orig in enumerate(rec["meta"]["shown_order"]):
            assert np.array_equal(shown[j][inner], patches[orig][inner])


def test_spatial_puzzle_refuses_a_blank_frame():
    with pytest.raises(Ambiguous):
        sp.puzzle(np.full((128, 128, 3), 120, np.uint8), np.random.default_rng(0), 0, "easy", "arrangement")


def test_spatial_puzzle_patch_distractors_differ_from_outlined_patch():
    # Left half plain grey, right half noise: a grey patch may not have another grey place as distractor.
    # (Footage refuses such a frame outright, see below; simulated scenes go through `puzzle` like this.)
    image = _noise((128, 128, 3))
    image[:, :64] = 90
    made = 0
    for seed in range(20):
        try:
            rec, _ = sp.puzzle(image, np.random.default_rng(seed), seed % 4, "hard", "patch")
        except Ambiguous:
            continue
        made += 1
        assert sp.verify(rec, image)
        patches = sp.cut(image, 3)
        outlined = patches[rec["meta"]["shown_order"][rec["meta"]["outlined"] - 1]]
        names = [sp.place_name(i, 3) for i in range(9)]
        for i, opt in enumerate(rec["options"]):
            if LETTERS[i] != rec["answer"]:
                other = patches[names.index(opt)]
                assert np.abs(other.astype(int) - outlined.astype(int)).mean() > sp.DISTINCT_TOL
    assert made >= 5


@pytest.mark.parametrize("tier", ["easy", "hard"])
def test_temporal_puzzle_answer_is_unique(tier):
    n = tp.num_frames(tier)
    frames = _noise((n, 32, 32, 3))
    n_opt = tp.num_options(tier)
    for answer in range(n_opt):
        rec, shown = tp.from_frames(frames, 2.0, np.random.default_rng(answer), answer, tier, FamilySpec())
        assert rec["answer"] == LETTERS[answer] and rec["meta"]["segments"] == tp.SEGMENTS[tier]
        assert len(rec["options"]) == len(set(rec["options"])) == n_opt
        assert shown.shape == frames.shape and not np.array_equal(shown, frames)
        assert tp.verify(rec, shown, frames)
        assert not tp.verify(dict(rec, answer=LETTERS[(answer + 1) % n_opt]), shown, frames)
        assert "1, 2, 3" not in rec["options"] and "1, 2, 3, 4" not in rec["options"]


def test_temporal_puzzle_refuses_a_still_clip():
    still = np.repeat(_noise((1, 32, 32, 3)), 6, axis=0)
    with pytest.raises(Ambiguous):
        tp.from_frames(still, 2.0, np.random.default_rng(0), 0, "easy", FamilySpec())


def test_temporal_puzzle_never_offers_an_order_that_only_swaps_still_segments():
    # Segment 1 moves; segments 2 and 3 are the same still picture: swapping them changes nothing visible.
    # (Footage refuses such a clip outright, see below; simulated scenes go through `shuffle_clip`.)
    frames = _noise((6, 32, 32, 3))
    frames[2:] = frames[2]
    for seed in range(10):
        rec, shown = tp.shuffle_clip(frames, np.random.default_rng(seed), seed % 3, "easy")
        segs = shown.reshape(3, 2, 32, 32, 3)
        orig = frames.reshape(3, 2, 32, 32, 3)
        for i, opt in enumerate(rec["options"]):
            order = [int(x) - 1 for x in opt.split(",")]
            same = np.array_equal(segs[order], orig)
            assert same == (LETTERS[i] == rec["answer"]), (opt, rec["answer"])


def test_arrow_of_time_from_frames():
    frames = _noise((4, 16, 16, 3))
    fwd, a = aot.from_frames(frames, 2.0, None, 0, "easy", FamilySpec())
    rev, b = aot.from_frames(frames, 2.0, None, 1, "easy", FamilySpec())
    assert fwd["answer"] == "A" and rev["answer"] == "B"
    assert np.array_equal(a, frames) and np.array_equal(b, frames[::-1])
    assert aot.verify(fwd, a, frames) and aot.verify(rev, b, frames)
    assert not aot.verify(fwd, b, frames)
    still = np.repeat(frames[:1], 4, axis=0)
    assert not aot.verify(fwd, still, still)  # a still clip has no arrow of time


def test_sft_target_for_every_family():
    image = _noise((64, 64, 3))
    rec, _ = sp.from_frames(image[None], 2.0, np.random.default_rng(0), 2, "easy", FamilySpec())
    assert sft_target(rec) == "<think></think><answer>C</answer>"
    assert rec["options"][2] in sft_target(rec, rationale=True)
    with pytest.raises(KeyError, match="unknown question family"):
        sft_target({"family": "nope", "answer": "A"})


@pytest.mark.parametrize("tier", ["easy", "hard"])
def test_temporal_puzzle_trace_states_each_shown_segment_and_the_order(tier):
    """The trace's per-segment places, read from the shown clip alone, put the original back together, and
    the trace ends in the right option's text: it says what the clip shows, not anything else."""
    k, m = tp.SEGMENTS[tier], tp.SEGMENT_FRAMES
    frames = _noise((k * m, 16, 16, 3), seed=3)
    rec, shown = tp.from_frames(frames, 2.0, np.random.default_rng(5), 1, tier, FamilySpec())
    target = sft_target(rec, rationale="trace")
    think = target[len("<think>") : target.index("</think>")]
    places, order = think.split(" -> ")
    assert order == rec["options"][1] and target.endswith("<answer>B</answer>")
    segs = shown.reshape(k, m, *shown.shape[1:])
    rebuilt = np.empty_like(segs)
    for j, place in enumerate(int(p) for p in places.split()):
        rebuilt[place - 1] = segs[j]  # shown segment j belongs at `place` in the original
    assert np.array_equal(rebuilt.reshape(frames.shape), frames)


def test_spatial_puzzle_traces():
    image = _noise((64, 64, 3))
    rec, _ = sp.from_frames(image[None], 2.0, np.random.default_rng(0), 2, "easy", FamilySpec())
    places, order = sft_target(rec, "trace")[len("<think>") :].split("</think>")[0].split(" -> ")
    assert order == rec["options"][2]
    assert [int(p) - 1 for p in places.split()] == rec["meta"]["shown_order"]
    fam = FamilySpec(family="spatial_puzzle", variant="patch")
    rec, _ = sp.from_frames(image[None], 2.0, np.random.default_rng(0), 1, "easy", fam)
    shown_at = sp.place_name(rec["meta"]["outlined"] - 1, 2)
    assert (
        sft_target(rec, "trace")
        == f"<think>outlined at {shown_at} -> {rec['options'][1]}</think><answer>B</answer>"
    )


def test_sft_target_rationale_modes():
    image = _noise((64, 64, 3))
    rec, _ = sp.from_frames(image[None], 2.0, np.random.default_rng(0), 2, "easy", FamilySpec())
    assert sft_target(rec, "none") == sft_target(rec, False) == "<think></think><answer>C</answer>"
    assert sft_target(rec, "template") == sft_target(rec, True)
    with pytest.raises(ValueError, match="rationale must be one of"):
        sft_target(rec, "traces")
