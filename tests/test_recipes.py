"""`embodied experiment recipes` at toy size: a seed's arms run from its start, in two worker processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from embodied.config import load_config
from embodied.experiments.config import RecipesRun

REPO = Path(__file__).parents[1]


@pytest.mark.slow  # 17 s; tests/test_training_state.py runs the recipe experiment end to end by default
def test_recipes_run_every_arm_from_its_seed_start_in_two_workers(tmp_path):
    from embodied.experiments.recipes import run

    overrides = [
        f"data.root={tmp_path}/data", "data.n_train=16", "data.n_val=8", "data.n_test=8", "threads=1",
        "recipes.seeds=[0,1]", "recipes.arms=[configs/recipes/grpo.yaml,configs/recipes/dapo.yaml]",
        "recipes.format_steps=2", "recipes.half_at=0.0", "recipes.half_max_steps=2",
        "recipes.half_eval_examples=8", "recipes.steps=2", "recipes.eval_every=1", "recipes.eval_examples=8",
        "recipes.workers=2", "grpo.prompts_per_step=4",
    ]  # fmt: skip
    cfg = load_config([REPO / "configs/experiment_recipes.yaml"], overrides, schema=RecipesRun)
    run(cfg, tmp_path / "run", progress=False)
    result = json.loads((tmp_path / "run" / "recipes.json").read_text())
    assert [s["seed"] for s in result["starts"]] == [0, 1]
    assert [(r["seed"], r["arm"]) for r in result["runs"]] == [
        (0, "grpo"),
        (1, "grpo"),
        (0, "dapo"),
        (1, "dapo"),
    ]
    for seed in (0, 1):  # every arm of a seed was keyed on (and so trained from) that seed's saved start
        start = json.loads((tmp_path / "run" / f"start_seed{seed}" / "result.json").read_text())
        for arm in ("grpo", "dapo"):
            row = json.loads((tmp_path / "run" / f"seed{seed}" / arm / "result.json").read_text())
            assert row["key"]["start"] == start["row"]
    run(cfg, tmp_path / "run", progress=False)  # every job reused: the same rows
    again = json.loads((tmp_path / "run" / "recipes.json").read_text())
    assert again["runs"] == result["runs"] and again["starts"] == result["starts"]
