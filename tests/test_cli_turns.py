"""The simulator's reward from the command line alone: `embodied generate --episodes`, then `embodied grpo`
and `embodied eval` with `env.turns=2` play two turns (before, both silently played one), and a setting a
command cannot honour is refused in one line."""

from __future__ import annotations

import json

import pytest

from embodied.cli import main


@pytest.fixture(scope="module")
def episodes(tmp_path_factory):
    root = tmp_path_factory.mktemp("episodes") / "push"
    args = ["generate", "--episodes", "env.tasks=[push]", f"env.root={root}", "env.n_train=4", "env.n_test=2"]
    assert main([*args, "env.workers=0", "-q"]) == 0
    assert (root / "train.jsonl").is_file() and (root / "test.jsonl").is_file()
    return root


def test_grpo_and_eval_play_two_turns_from_the_command_line(episodes, tmp_path):
    common = [f"data.root={episodes}", "env.turns=2", "threads=1", "-q"]
    grpo = ["grpo.steps=1", "grpo.prompts_per_step=2", "grpo.group_size=2", "grpo.eval_every=0"]
    assert main(["grpo", *common, *grpo, f"run_dir={tmp_path / 'g'}"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "g" / "metrics.jsonl").read_text().splitlines()]
    assert any("turns/success@2" in r for r in rows), rows  # two-turn trajectories were trained
    model = tmp_path / "g" / "model"
    assert (
        main(["eval", *common, f"policy.path={model}", "eval.split=test", f"run_dir={tmp_path / 'e'}"]) == 0
    )
    result = json.loads((tmp_path / "e" / "eval_test.json").read_text())
    assert set(result["turns"]["per_task"]["push"]["greedy"]) >= {"success@1", "success@2"}


def test_settings_a_command_cannot_honour_are_refused(episodes, tmp_path, capsys):
    mcq = tmp_path / "mcq"
    assert (
        main(["generate", f"data.root={mcq}", "data.n_train=4", "data.n_val=2", "data.n_test=2", "-q"]) == 0
    )
    capsys.readouterr()
    cases = [
        (["grpo", f"data.root={mcq}", "env.turns=2"], "holds multiple-choice questions"),
        (["eval", f"data.root={mcq}", "eval.split=test", "env.turns=2"], "holds multiple-choice questions"),
        (["sft", f"data.root={episodes}", "env.turns=2"], "`embodied sft` plays no interactive episodes"),
        # another command's section: refused as the config loads (exit 2), before anything runs
        (["grpo", f"data.root={episodes}", "env_feedback.seeds=[0]"], "`env_feedback.*` is read by"),
        (["sft", f"data.root={episodes}", "recipes.seeds=[0]"], "`recipes.*` is read by"),
    ]
    for args, why in cases:
        code = 2 if "is read by" in why else 1
        assert main([*args, f"run_dir={tmp_path / 'r'}", "-q"]) == code, args
        err = capsys.readouterr().err
        assert why in err and len(err.strip().splitlines()) == 1, err
