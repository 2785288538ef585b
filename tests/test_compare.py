"""`embodied compare RUN_DIR...`: evaluation results of several runs in one ranked table and one figure, built
from result files written by the real statistics (`prediction_stats`, `summarize_env`) on prediction rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from embodied.cli import main
from embodied.eval.compare import read_results, row_keys
from embodied.eval.envs import summarize_env
from embodied.eval.stats import prediction_stats


def _rows(right: int, n: int = 20, family: str = "arrow_of_time", tier: str = "easy") -> list[dict]:
    return [
        {"id": f"{family}-{i}", "family": family, "difficulty": tier, "n_options": 2, "answer": "A",
         "predicted": "A" if i < right else "B"}
        for i in range(n)
    ]  # fmt: skip


def _write(run: Path, name: str, rows: list[dict], baseline: str = "none") -> None:
    run.mkdir(parents=True, exist_ok=True)
    result = prediction_stats(rows) | {"settings": {"baseline": baseline}, "predictions": rows}
    (run / f"eval_{name}.json").write_text(json.dumps(result))


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
    assert [r.label for r in results] == [
        "a: test",
        "c: test",
        "env: test",
        "b: test",
    ]  # 0.84, 0.70, 0.67, 0.50
    top = results[0]
    assert sorted(top.baselines) == ["blind", "shuffled-frames"]  # beside their result, not models
    assert top.cells[("all", "all")]["value"] == pytest.approx(21 / 25)
    assert top.cells[("spatial_puzzle", "hard")]["n"] == 5
    assert top.baselines["blind"][("all", "all")]["value"] == pytest.approx(11 / 25)
    lo, hi = top.cells[("all", "all")]["ci95"]
    assert lo < 21 / 25 < hi
    assert results[2].metric == "success" and results[2].cells[("push", "all")]["value"] == pytest.approx(
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
