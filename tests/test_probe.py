"""The linear probe of visual tokens: it reads a class that is in the features, not one that is not, and
runs on the real tiny policy's tokens."""

from __future__ import annotations

import torch

from embodied.eval.probe import answer_text, group_of, linear_probe, pooled, probe_families


def _data(n: int, signal: float, seed: int):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    x = torch.randn(n, 40, generator=g)
    x[:, :3] += signal * torch.nn.functional.one_hot(y, 3)
    return x, [["left", "middle", "right"][i] for i in y.tolist()]


def test_probe_reads_a_class_the_features_carry():
    x_tr, y_tr = _data(300, 3.0, 0)
    x_te, y_te = _data(200, 3.0, 1)
    r = linear_probe(x_tr, y_tr, x_te, y_te)
    assert r["classes"] == 3 and r["n_test"] == 200
    assert r["accuracy"] > 0.9 and r["ci95"][0] > r["majority"]
    assert "predictions" not in r  # only when asked
    pred = linear_probe(x_tr, y_tr, x_te, y_te, predictions=True)["predictions"]
    assert len(pred) == 200 and sum(p == t for p, t in zip(pred, y_te)) / 200 == r["accuracy"]


def test_probe_stays_near_the_majority_when_the_features_carry_nothing():
    x_tr, y_tr = _data(300, 0.0, 0)
    x_te, y_te = _data(200, 0.0, 1)
    r = linear_probe(x_tr, y_tr, x_te, y_te)
    assert r["ci95"][0] < 0.45  # three balanced classes: chance is 1/3


def test_unscaled_probe_keeps_relative_scales():
    """A class carried by a coordinate far smaller than the noisy others is read once each coordinate is
    standardised, and lost when all share one deviation (as a language model receives them)."""
    x_tr, y_tr = _data(300, 3.0, 0)
    x_te, y_te = _data(200, 3.0, 1)
    for x in (x_tr, x_te):
        x[:, :3] *= 1e-3
        x[:, 3:] *= 1e3
    assert linear_probe(x_tr, y_tr, x_te, y_te)["accuracy"] > 0.9
    assert linear_probe(x_tr, y_tr, x_te, y_te, per_feature=False)["accuracy"] < 0.6


def test_pooled_features_are_mean_and_max_over_tokens():
    x = torch.tensor([[1.0, 10.0, 3.0, 20.0, 2.0, 0.0]])  # three tokens of width 2, flattened
    assert pooled(x, 2).tolist() == [[2.0, 10.0, 3.0, 20.0]]
    swapped = torch.tensor([[3.0, 20.0, 1.0, 10.0, 2.0, 0.0]])  # the same tokens in another order
    assert torch.equal(pooled(swapped, 2), pooled(x, 2))


def test_probe_families_on_the_tiny_policy(tiny_policy):
    import numpy as np

    from embodied.data.load import Example
    from embodied.video import Clip, VideoConfig

    rng = np.random.default_rng(0)
    examples = []
    for i in range(24):
        bright = i % 2
        frames = np.full((4, 56, 56, 3), 200 if bright else 20, np.uint8) + rng.integers(
            0, 5, (4, 56, 56, 3), np.uint8
        )
        rec = {
            "id": f"p{i}", "family": "arrow_of_time", "video": f"{i}.mp4", "question": "Forward or reversed?",
            "options": ["forward", "reversed"], "answer": "AB"[bright], "meta": {"scene": "drop"},
        }  # fmt: skip
        examples.append(Example(rec, Clip(frames, 2.0)))
    assert group_of(examples[0]) == "arrow_of_time/drop" and answer_text(examples[1]) == "reversed"
    model, processor = tiny_policy
    out = probe_families(model, processor, examples[:16], examples[16:], VideoConfig())
    assert set(out) == {"arrow_of_time/drop"}
    assert (
        out["arrow_of_time/drop"]["accuracy"] == 1.0
    )  # brightness decides the answer, and the tokens see it
