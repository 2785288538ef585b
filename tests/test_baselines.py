"""Shortcut audit: baselines that must sit at chance where the answer needs the video.

The arrow-of-time argument: a forward clip and its reversal (same simulation seed) are the same frames
in the opposite order. Blind inputs of the two are identical; single-frame inputs are identical as a
set of views (reversal swaps the two middle frames of an even-length clip). So ANY policy answers both
alike, and exactly one of the pair is right: accuracy on balanced pairs is exactly 1/2. The tests check
that on the real tiny model and real MuJoCo clips, with the full-video evaluation as the control that
shows the check can fail: there the model's scores do differ between the two clips.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from embodied.data.load import Example
from embodied.eval.baselines import (
    baseline_views,
    blind,
    majority_letters,
    model_free_predictions,
    question_rng,
    shuffled,
    single_frame_views,
)
from embodied.eval.loop import MCQEval, evaluate
from embodied.eval.stats import prediction_stats, wilson_interval
from embodied.questions import arrow_of_time
from embodied.video import Clip, VideoConfig


def _pairs(seeds, num_frames: int) -> list[Example]:
    """Forward and reversed examples of each seed, in that order (real MuJoCo renders)."""
    from embodied.worlds import DropWorld

    world = DropWorld(112, 112)
    spec = arrow_of_time.ClipSpec(num_frames=num_frames)
    out = []
    try:
        for seed in seeds:
            for rev in (False, True):
                record, frames = arrow_of_time.make_example(world, seed, rev, spec)
                rid = f"{seed}-{'rev' if rev else 'fwd'}"
                out.append(Example({"id": rid, "video": f"{rid}.mp4", **record}, Clip(frames, spec.fps)))
    finally:
        world.close()
    return out


@pytest.fixture(scope="module")
def pairs4():
    return _pairs([11, 12, 13, 14], num_frames=4)


def test_blind_and_single_frame_inputs_do_not_depend_on_direction(pairs4):
    odd = _pairs([21], num_frames=5)
    for fwd, rev in [(pairs4[0], pairs4[1]), (odd[0], odd[1])]:
        assert not np.array_equal(fwd.clip.frames, rev.clip.frames)  # the clips themselves differ
        assert np.array_equal(blind(fwd.clip).frames, blind(rev.clip).frames)
        assert blind(fwd.clip).frames.shape == fwd.clip.frames.shape and not blind(fwd.clip).frames.any()
        views_f = [v.frames for v in single_frame_views(fwd.clip)]
        views_r = [v.frames for v in single_frame_views(rev.clip)]
        t = len(fwd.clip.frames)
        assert len(views_f) == (1 if t % 2 else 2) and all(v.shape == fwd.clip.frames.shape for v in views_f)
        assert all((v == v[:1]).all() for v in views_f)  # one frame, repeated
        # The same views, in swapped order for an even length.
        assert all(np.array_equal(a, b) for a, b in zip(views_f, views_r[::-1]))
    mid = single_frame_views(odd[0].clip)[0].frames[0]
    assert np.array_equal(mid, odd[0].clip.frames[2])


def test_shuffled_frames_permute_uniformly_and_ignore_the_record(pairs4):
    clip = pairs4[0].clip
    out = shuffled(clip, question_rng(0, 3))
    assert sorted(map(bytes, out.frames)) == sorted(map(bytes, clip.frames))  # same frames
    again = baseline_views(clip, "shuffled-frames", question_rng(0, 3))[0]
    assert np.array_equal(out.frames, again.frames)  # reproducible from (seed, index)
    # The permutation depends on the seed and the position only: the reversed clip in the same
    # position gets the same permutation of its own frames.
    perm = question_rng(0, 3).permutation(4)
    assert np.array_equal(shuffled(pairs4[1].clip, question_rng(0, 3)).frames, pairs4[1].clip.frames[perm])
    # Uniform over all 24 orders of 4 frames, the identity included (a forward and a reversed clip
    # then give the same distribution of shuffled clips). 4,800 draws: 200 expected per order, sd ~14.
    index = Clip(np.arange(4, dtype=np.uint8)[:, None, None, None].repeat(3, -1), 2.0)
    counts: dict[tuple, int] = {}
    for i in range(4800):
        order = tuple(shuffled(index, question_rng(7, i)).frames[:, 0, 0, 0])
        counts[order] = counts.get(order, 0) + 1
    assert len(counts) == 24 and min(counts.values()) > 140 and max(counts.values()) < 260, counts


def test_video_baselines_sit_exactly_at_chance_on_pairs(tiny_policy, pairs4):
    model, processor = tiny_policy
    video = VideoConfig()
    full = evaluate(model, processor, pairs4, video, MCQEval(max_new_tokens=8, progress=False))
    gaps = [
        np.abs(np.subtract(a["choice_logprobs"], b["choice_logprobs"])).max()
        for a, b in zip(full["predictions"][::2], full["predictions"][1::2])
    ]
    assert min(gaps) > 1e-4, gaps  # control: with the video, the two clips of a pair score differently
    for name in ("blind", "single-frame"):
        how = MCQEval(max_new_tokens=8, progress=False, baseline=name)
        res = evaluate(model, processor, pairs4, video, how)
        preds = res["predictions"]
        views = 1 if name == "blind" else 2
        assert len(preds) == views * len(pairs4)
        by_id: dict[str, list[dict]] = {}
        for p in preds:
            by_id.setdefault(p["id"], []).append(p)
        for seed in (11, 12, 13, 14):
            fwd, rev = by_id[f"{seed}-fwd"], by_id[f"{seed}-rev"]
            rev = rev[::-1] if views == 2 else rev  # reversal swaps the two middle frames
            for a, b in zip(fwd, rev):
                assert a["response"] == b["response"] and a["choice"] == b["choice"], name
                np.testing.assert_allclose(a["choice_logprobs"], b["choice_logprobs"], atol=1e-4)
        assert res["choice_accuracy"] == 0.5, name  # exactly one of each pair is right
        assert res["accuracy"] <= 0.5 and res["n"] == len(pairs4)


def test_shuffled_frames_and_sampling_run(tiny_policy, pairs4):
    model, processor = tiny_policy
    how = MCQEval(max_new_tokens=8, progress=False, baseline="shuffled-frames", samples=3, k=[1, 3], seed=5)
    res = evaluate(model, processor, pairs4[:4], VideoConfig(), how)
    assert res["settings"]["baseline"] == "shuffled-frames" and res["settings"]["k"] == [1, 3]
    assert all(len(p["sampled"]) == 3 for p in res["predictions"])
    for key in ("pass@1", "pass@3", "cons@1", "cons@3", "unparseable_samples"):
        assert 0.0 <= res[key] <= 1.0
    assert res["pass@3"] >= res["pass@1"]
    with pytest.raises(ValueError, match="runs the policy"):
        evaluate(model, processor, pairs4[:2], VideoConfig(), MCQEval(progress=False, baseline="random"))


def _records(n: int, skew: float = 0.5, seed: int = 0, family: str = "t") -> list[dict]:
    """Two-option records, `skew` of them answered B (exactly, in random order)."""
    b = np.random.default_rng(seed).permutation(np.arange(n) < round(skew * n))
    return [
        {"id": f"{family}{i}", "family": family, "options": ["x", "y"], "answer": "AB"[int(x)], "meta": {}}
        for i, x in enumerate(b)
    ]


def test_random_baseline_at_chance_within_interval():
    records = _records(400)
    res = prediction_stats(model_free_predictions(records, "random", seed=3, samples=4), k=[1, 4])
    lo, hi = res["ci95"]
    assert lo <= 0.5 <= hi and res["unparseable"] == 0.0
    assert abs(res["pass@4"] - res["chance_pass@4"]) < 0.06  # 1 - 0.5^4 = 0.9375
    rows = model_free_predictions(records, "random", seed=3)
    counts = {x: sum(r["predicted"] == x for r in rows) for x in "AB"}
    assert wilson_interval(counts["A"], 400)[0] <= 0.5 <= wilson_interval(counts["A"], 400)[1], counts
    assert rows == model_free_predictions(records, "random", seed=3)  # seeded
    assert rows != model_free_predictions(records, "random", seed=4)


def test_majority_baseline_uses_train_and_says_so():
    train = _records(100, skew=0.7) + _records(10, skew=0.5, family="u")
    test = _records(200, seed=1) + _records(20, seed=1, family="u") + _records(10, skew=0.2, family="v")
    letters, sources = majority_letters(test, train)
    assert letters == {"t": "B", "u": "A", "v": "A"}  # u is a 5-5 tie in train: A
    assert sources["t"] == "train" and sources["v"].startswith("evaluated split")
    res = prediction_stats(model_free_predictions(test, "majority", letters=letters))
    assert res["per_family"]["t"]["accuracy"] == 0.5  # balanced test split: exactly chance
    assert res["per_family"]["v"]["accuracy"] == pytest.approx(0.8)  # its own majority (A 80%)


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory):
    from embodied.data.build import generate_dataset
    from embodied.data.schema import DataConfig

    root = tmp_path_factory.mktemp("ds")
    generate_dataset(DataConfig(root=str(root), n_train=4, n_val=0, n_test=4, workers=0), progress=False)
    return root


def test_cli_eval_baselines_write_json_and_markdown(tiny_policy, small_dataset, tmp_path, capsys):
    from embodied.cli import main

    root = small_dataset
    run = tmp_path / "run"
    base = [f"data.root={root}", f"run_dir={run}"]
    assert main(["eval", "-q", "--baseline", "majority", *base]) == 0
    saved = json.loads((run / "eval_test_majority.json").read_text())
    assert saved["settings"]["majority_source"] == {"arrow_of_time": "train"}
    table = (run / "eval_test_majority.md").read_text()
    assert "| arrow_of_time | easy | 4 |" in table and table in capsys.readouterr().out
    assert main(["eval", "-q", "--baseline", "blind", "eval.samples=2", *base]) == 0
    saved = json.loads((run / "eval_test_blind.json").read_text())
    assert saved["settings"]["baseline"] == "blind" and "cons@2" in saved["per_family"]["arrow_of_time"]
    assert saved["choice_accuracy"] == 0.5  # 2 forward, 2 reversed, identical black inputs
    assert main(["eval", "-q", "eval.samples=2", "eval.k=[3]", *base]) == 1
    assert "eval.k" in capsys.readouterr().err


def test_shortcut_audit_experiment_tables_every_run(tiny_policy, small_dataset, tmp_path, capsys):
    from embodied.cli import main

    run = tmp_path / "audit"
    args = ["experiment", "-q", "shortcut-audit", f"data.root={small_dataset}", f"run_dir={run}"]
    assert main([*args, "eval.max_new_tokens=8"]) == 0
    text = (run / "audit_test.md").read_text()
    head = "| chance | policy | blind | single-frame | shuffled-frames | random | majority |"
    assert head in text and "Forced-choice accuracy" in text
    for name in ("blind", "single-frame", "shuffled-frames", "random", "majority"):
        assert (run / f"eval_test_{name}.json").is_file() and (run / f"eval_test_{name}.md").is_file()
    summary = json.loads((run / "experiment_shortcut-audit.json").read_text())
    assert summary["blind"]["choice_accuracy"] == 0.5 and summary["majority"]["accuracy"] == 0.5


def test_audit_table_flags_video_baselines_above_chance():
    from embodied.experiments.shortcut_audit import audit_table

    def stats(correct: int, n: int = 100) -> dict:
        s = {"n": n, "accuracy": correct / n, "ci95": list(wilson_interval(correct, n)), "chance": 0.5}
        return s | {"per_family": {"t": dict(s)}, "per_family_tier": {"t": {"easy": dict(s)}}}

    # 70/100 has a 95% interval of [0.60, 0.78]: above chance; 58/100 [0.48, 0.67] is not.
    runs = {"none": stats(95), "blind": stats(70), "single-frame": stats(58), "random": stats(70)}
    table = audit_table(runs)
    first = [c.strip() for c in table.splitlines()[2].strip("|").split("|")]
    assert first[:4] == ["**all**", "all", "100", "0.500"]
    assert first[4] == "0.950 [0.89, 0.98]"  # the policy itself is never flagged
    assert first[5].endswith("(!)") and not first[6].endswith("(!)")
    assert not first[7].endswith("(!)")  # random is not a video baseline
    assert len(table.strip().splitlines()) == 2 + 3  # overall, family, family x tier
