"""`embodied report` on evaluation folders: an episode evaluation (success, reward terms, failures per task)
and a served result (endpoint without credentials, model, requests by fate), from result files written by the
real statistics (`summarize_env`, `prediction_stats`)."""

from __future__ import annotations

import json

from embodied.eval.env_stats import summarize_env
from embodied.eval.stats import prediction_stats
from embodied.report import build_report


def _push(i: int, success: bool) -> dict:
    terms = {"reward/success": float(success), "reward/distance": -0.1 * i, "reward/total": float(success)}
    return {"id": f"p{i}", "task": "push", "response": "<answer>0.5</answer>", "terms": terms}


def test_report_shows_an_episode_evaluation_per_task(tmp_path):
    preds = [_push(i, i < 2) for i in range(4)] + [
        {"id": "c0", "task": "carry", "terms": {"reward/success": 1.0, "reward/total": 1.0}}
    ]
    result = summarize_env(preds) | {"requested": 6, "predictions": preds}
    result["failed"] = [{"id": "p9", "task": "push", "error": "HTTP 500: boom"}]
    (tmp_path / "eval_test.json").write_text(json.dumps(result))
    page = build_report(tmp_path)
    assert "This folder holds no results yet" not in page and "Episode evaluation: test" in page
    rows = {r.split("</td>")[0].split(">")[-1]: r for r in page.split("<tr>")[1:]}
    push = rows["push"]  # n 4, success 2/4, 2 failed in simulation, 1 unanswered, mean distance -0.15
    cells = [c.split(">")[-1] for c in push.split("</td>")[:-1]]
    assert cells[1:5] == ["4", "0.500 [0.150, 0.850]", "2", "1"] and "-0.150" in cells
    assert "<th>distance</th>" in page and "Unanswered (requests failed, not scored): 1 of 6" in page


def test_report_names_the_served_endpoint_and_its_requests(tmp_path):
    rows = [
        {"id": f"q{i}", "family": "arrow_of_time", "n_options": 2, "answer": "A", "predicted": "A"}
        for i in range(3)
    ]
    result = prediction_stats(rows) | {"settings": {"baseline": "none"}, "predictions": rows}
    result["endpoint"] = {"url": "http://127.0.0.1:8000/v1", "model": "tiny", "requests": 5, "sent": 3,
                          "cached": 2, "failed": 0}  # fmt: skip
    result["notes"] = ["the served model got each clip's frames as images (...)"]
    (tmp_path / "eval_test.json").write_text(json.dumps(result))
    page = build_report(tmp_path)
    assert (
        "Served: model tiny at http://127.0.0.1:8000/v1; 5 requests: 3 received by the server, 2 from" in page
    )
    assert "Note: the served model got each clip&#x27;s frames as images" in page
