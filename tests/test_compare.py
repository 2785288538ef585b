"""`embodied compare RUN_DIR...`: evaluation results of several runs in one ranked table and one figure, built
from result files written by the real statistics (`prediction_stats`, `summarize_env`) on prediction rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from embodied.cli import main
from embodied.eval.compare import read_results, row_keys
from embodied.eval.env_stats import summarize_env
from embodied.eval.stats import prediction_stats


def _rows(right: int, n: int = 20, family: str = "arrow_of_time", tier: str = "easy") -> list[dict]:
    return [
        {"id": f"{family}-{i}", "family": family, "difficulty": tier, "n_options": 2, "answer": "A",
         "predicted": "A" if i < right else "B"}
        for i in range(n)
    ]  # fmt: skip


def _write(run: Path, name: str, rows: list[dict], baseline: str = "none", signature=None) -> None:
    run.mkdir(parents=True, exist_ok=True)
    result = prediction_stats(rows) | {"settings": {"baseline": baseline}, "predictions": rows}
    if signature is not None:
        result["signature"] = signature
    (run / f"eval_{name}.json").write_text(json.dumps(result))


def _sig(media: str = "images", split: str = "test:aaaa", root: str = "/data/aot") -> dict:
    """An input signature as `embodied eval` writes it (`embodied.eval.signature.input_signature`)."""
    return {
        "media": media, "frames": [4], "frame_size": [[112, 112]],
        "pixels": {"min_pixels": 784, "frame_cap": [12544], "fps": 2.0}, "prompt": "q-0123456789",
        "content_hash": split, "data_root": root, "split": "test",
    }  # fmt: skip


@pytest.fixture
def runs(tmp_path) -> list[Path]:
    """Three runs: 18/20, 10/20 and 14/20 right (plus 3/5 on a second family for the first), the first with
    a blind and a shuffled-frames baseline; and an episode run (2 of 3 pushes succeed)."""
    a, b, c, env = (tmp_path / x for x in ("a", "b", "c", "env"))
    _write(a, "test", _rows(18) + _rows(3, 5, "spatial_puzzle", "hard"))
    _write(a, "test_blind", _rows(10) + _rows(1, 5, "spatial_puzzle", "hard"), "blind")
    _write(a, "test_shuffled-frames", _rows(11), "shuffled-frames")
    _write(b, "test", _rows(10))
    _write(c, "test", _rows(14))
    env.mkdir()
    preds = [{"id": f"p{i}", "task": "push", "terms": {"reward/success": float(i < 2)}} for i in range(3)]
    (env / "eval_test.json").write_text(json.dumps(summarize_env(preds) | {"predictions": preds}))
    return [b, a, c, env]


def test_results_are_ranked_with_baselines_beside_their_result(runs):
    results = read_results(runs)
    # MCQ accuracy 0.84, 0.70, 0.50, then apart (another metric) the episodes' success 0.67
    assert [r.label for r in results] == ["a: test", "c: test", "b: test", "env: test"]
    assert [r.group for r in results] == ["accuracy on unrecorded"] * 3 + ["success on unrecorded"]
    top = results[0]
    assert sorted(top.baselines) == ["blind", "shuffled-frames"]  # beside their result, not models
    assert top.cells[("all", "all")]["value"] == pytest.approx(21 / 25)
    assert top.cells[("spatial_puzzle", "hard")]["n"] == 5
    assert top.baselines["blind"][("all", "all")]["value"] == pytest.approx(11 / 25)
    lo, hi = top.cells[("all", "all")]["ci95"]
    assert lo < 21 / 25 < hi
    assert results[3].metric == "success" and results[3].cells[("push", "all")]["value"] == pytest.approx(
        2 / 3
    )
    keys = row_keys(results)
    assert keys[0] == ("all", "all") and keys.index(("arrow_of_time", "all")) < keys.index(
        ("arrow_of_time", "easy")
    )


def test_compare_command_writes_a_page_with_table_figure_and_ranking(runs, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", *map(str, runs), f"out={out}"]) == 0
    page = (out / "compare.html").read_text()
    assert capsys.readouterr().out.strip().endswith("compare.html")
    assert "0.840 [" in page and "blind baseline" in page and "data:image/png;base64," in page
    assert page.index("a: test") < page.index("c: test") < page.index("b: test")  # ranked columns
    ranking = json.loads((out / "compare.json").read_text())
    assert [r["label"] for r in ranking][:2] == ["a: test", "c: test"]
    assert ranking[0]["baselines"] == {"blind": pytest.approx(0.44), "shuffled-frames": pytest.approx(0.55)}


def test_compare_names_a_folder_without_results(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["compare", str(tmp_path / "empty")]) == 1
    assert "no eval_*.json" in capsys.readouterr().err
    assert main(["compare"]) == 2


def test_compare_ranks_only_like_with_like_flags_inputs_and_pairs_models(tmp_path, capsys):
    """A local video run and a served image run of one model on one split: ranked together, both flagged with
    the media. The same model on another benchmark generation (another content hash): ranked apart. Paired
    difference a - c on the 20 common questions, worked by hand: a is right on ids 0-17, c on 0-13, so the
    differences are 1 on ids 14-17 and 0 elsewhere: mean 0.2, sd sqrt((4 x 0.8^2 + 16 x 0.2^2) / 19) =
    0.41039, half width (1.96 + 2.5 / 19) x 0.41039 / sqrt(20) = 0.19194."""
    a, c, new, none = (tmp_path / x for x in ("local_video", "served_images", "new_generation", "failed"))
    _write(a, "test", _rows(18), signature=_sig("video"))
    _write(c, "test", _rows(14), signature=_sig("images"))
    _write(new, "test", _rows(19), signature=_sig("images", "test:bbbb", "/data/aot_v2"))
    _write(none, "test", [], signature=_sig("images"))
    results = read_results([c, none, new, a])
    by = {r.label: r for r in results}
    assert [r.label for r in results] == ["new_generation: test", "local_video: test", "served_images: test",
                                          "failed: test"]  # fmt: skip
    assert by["new_generation: test"].group != by["local_video: test"].group
    assert by["new_generation: test"].flags == [] and by["new_generation: test"].paired is None
    assert by["local_video: test"].flags == [
        "differs from served_images: test, failed: test: media: video vs images"
    ]
    assert by["served_images: test"].flags == ["differs from local_video: test: media: images vs video"]
    p = by["served_images: test"].paired
    assert p["vs"] == "local_video: test" and p["n"] == 20 and p["diff"] == pytest.approx(-0.2)
    assert p["ci95"] == pytest.approx([-0.2 - 0.19194, -0.2 + 0.19194], abs=1e-4)
    assert by["failed: test"].value is None and by["failed: test"].paired is None  # none answered: last
    out = tmp_path / "cmp"
    assert main(["compare", str(a), str(c), str(new), str(none), f"out={out}"]) == 0
    page = (out / "compare.html").read_text()
    assert "ranked apart, never against each other" in page and "media: video vs images" in page
    assert "-0.200 [-0.392, -0.008] n=20 vs local_video: test" in page and "none answered n=0" in page
    ranking = json.loads((out / "compare.json").read_text())
    assert [(r["group"], r["rank"]) for r in ranking] == [
        ("accuracy on test:bbbb", 1), ("accuracy on test:aaaa", 1), ("accuracy on test:aaaa", 2),
        ("accuracy on test:aaaa", 3),
    ]  # fmt: skip
