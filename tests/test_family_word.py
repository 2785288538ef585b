"""Issue 23, one word per idea: a question *family* (`record["family"]`, `per_family`,
`data.families[].family`) and an interactive *task* (`record["task"]`, `env.tasks`, `per_task` of interactive
evaluation). What was written before the rename (evaluations with `per_task`, exported ground truths and
cosmos summaries with `task(s)`) still reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from embodied.data.schema import kind, upgrade
from embodied.eval.stats import by_family, markdown_table, prediction_stats

ROOT = Path(__file__).resolve().parents[1]


def _rows():
    return [
        {
            "id": "a",
            "family": "arrow_of_time",
            "difficulty": "easy",
            "n_options": 2,
            "answer": "A",
            "predicted": "A",
        },
        {
            "id": "b",
            "family": "arrow_of_time",
            "difficulty": "hard",
            "n_options": 2,
            "answer": "B",
            "predicted": "A",
        },
        {
            "id": "c",
            "family": "spatial_puzzle",
            "difficulty": "easy",
            "n_options": 4,
            "answer": "C",
            "predicted": "C",
        },
    ]


def test_kind_and_upgrade():
    question, episode = {"family": "arrow_of_time"}, {"task": "place"}
    assert kind(question) == "arrow_of_time" and kind(episode) == "place"
    assert kind({}, "?") == "?"
    with pytest.raises(KeyError):
        kind({})
    old = {"id": "x", "task": "temporal_puzzle", "answer": "A"}
    assert list(upgrade(old).items()) == [("id", "x"), ("family", "temporal_puzzle"), ("answer", "A")]
    assert upgrade(episode) is episode and upgrade(question) is question


def test_question_evaluations_are_per_family_and_old_ones_read_the_same():
    new = prediction_stats(_rows())
    assert "per_task" not in new and list(new["per_family"]) == ["arrow_of_time", "spatial_puzzle"]
    assert list(new["per_family_tier"]["arrow_of_time"]) == ["easy", "hard"]
    old = {k: v for k, v in new.items() if not k.startswith("per_family")}
    old |= {"per_task": new["per_family"], "per_task_tier": new["per_family_tier"]}
    assert by_family(old) == by_family(new) == (new["per_family"], new["per_family_tier"])
    assert markdown_table(old) == markdown_table(new) and "| spatial_puzzle | easy |" in markdown_table(new)


def test_the_report_reads_old_and_new_evaluations(tmp_path):
    from embodied.report import eval_section

    new = prediction_stats(_rows())
    old = {k: v for k, v in new.items() if not k.startswith("per_family")}
    old |= {"per_task": new["per_family"], "per_task_tier": new["per_family_tier"]}
    sections = []
    for name, r in (("new", new), ("old", old)):
        (tmp_path / f"eval_{name}.json").write_text(json.dumps(r))
        sections.append(eval_section(tmp_path / f"eval_{name}.json"))
    assert "spatial_puzzle" in sections[0] and sections[0].replace("new", "old") == sections[1]


def test_a_ground_truth_exported_before_the_rename_scores_the_same():
    from embodied.integrations import verl_reward

    record = {
        "id": "q",
        "family": "arrow_of_time",
        "answer": "B",
        "options": ["forward", "reversed"],
        "meta": {},
    }
    old = {("task" if k == "family" else k): v for k, v in record.items()}
    text = "<think></think><answer>B</answer>"
    new_score = verl_reward.compute_score("embodied/arrow_of_time", text, json.dumps(record))["score"]
    old_score = verl_reward.compute_score("embodied/arrow_of_time", text, json.dumps(old))["score"]
    assert new_score == old_score == 1.5
    assert verl_reward.record_from_ground_truth("B", "embodied/arrow_of_time")["family"] == "arrow_of_time"


def test_the_committed_cosmos_summaries_still_render():
    """docs/results/cosmos_213c7b5.json was written with `per_task` and a curriculum of `tasks`: it stays as
    written, and the code that reads it still does; so does the current docs/results/cosmos.json."""
    from embodied.experiments.cosmos_report import markdown, per_family

    result = json.loads((ROOT / "docs/results/cosmos_213c7b5.json").read_text())
    assert "tasks" in result["curriculum"][0]
    text = markdown(result)
    assert "400 on arrow_of_time, then" in text
    sft = result["per_seed"]["0"]["main"]["sft"]
    assert per_family(sft) == sft["per_task"]
    current = json.loads((ROOT / "docs/results/cosmos.json").read_text())
    assert "families" in current["curriculum"][0]
    assert "400 on arrow_of_time, then" in markdown(current) and "GRPO alone" in markdown(current)


def test_no_shipped_config_names_a_question_family_task():
    from test_config import schema_for

    from embodied.config import load_config

    for path in sorted((ROOT / "configs").rglob("*.yaml")):
        text = path.read_text()
        assert "{task:" not in text and "{tasks:" not in text and "\n    task:" not in text, path
        load_config(
            path, schema=schema_for(path)
        )  # and each loads (an old key would fail naming the new one)


def test_a_dataset_made_before_the_rename_is_reused(tmp_path):
    """Its manifest's config names each family `task`; the same config today (`family`) matches it, and its
    records load through `schema.upgrade`, so it is not regenerated."""
    from dataclasses import asdict

    from embodied.data.load import manifest_matches
    from embodied.data.schema import DataConfig
    from embodied.questions import FamilySpec

    cfg = DataConfig(root=str(tmp_path), families=[FamilySpec(family="spatial_puzzle", variant="patch")])
    old = asdict(cfg)
    old["families"] = [{("task" if k == "family" else k): v for k, v in f.items()} for f in old["families"]]
    (tmp_path / "manifest.json").write_text(json.dumps({"format_version": 1, "config": old}))
    assert manifest_matches(tmp_path, asdict(cfg), {"workers"})
    other = DataConfig(root=str(tmp_path), families=[FamilySpec(family="temporal_puzzle", variant="patch")])
    assert not manifest_matches(tmp_path, asdict(other), {"workers"})


def test_a_dataset_from_an_older_family_version_is_not_reused(tmp_path):
    """The same config, but the manifest records an older `temporal_puzzle.VERSION` (version 2 leaked its
    answers through its options): `ensure_dataset` must regenerate, not reuse."""
    from dataclasses import asdict

    from embodied.data.build import dataset_matches
    from embodied.data.schema import DataConfig
    from embodied.questions import FamilySpec
    from embodied.questions import temporal_puzzle as tp

    cfg = DataConfig(root=str(tmp_path), families=[FamilySpec(family="temporal_puzzle")])
    for version, reused in ((tp.VERSION, True), (tp.VERSION - 1, False)):
        made = {"embodied": "0.1.0", "temporal_puzzle": version}
        manifest = {"format_version": 2, "config": asdict(cfg), "generator_version": made}
        (tmp_path / "manifest.json").write_text(json.dumps(manifest))
        assert dataset_matches(cfg) is reused
