"""Renamed config keys fail with a message that names the new key (issue 23), in a file and on the command
line, and every new key in the table exists in the schema."""

from __future__ import annotations

import dataclasses
import typing

import pytest
from omegaconf import OmegaConf

from embodied.bench.config import BenchRun
from embodied.config import RENAMED, Config, ConfigError, load_config
from embodied.experiments.config import RUNS, CosmosRun, EnvFeedbackRun

SCHEMAS = [Config, BenchRun, *RUNS.values()]
"""Every command's config: the core and each experiment's and benchmark's (a moved key lives in one)."""


def _field_type(path: str, schema: type = Config):
    """The type a dotted schema path (``[]``: an item of a list) leads to, or None if it names no field."""
    tp = schema
    for part in path.replace("[]", ".[]").split("."):
        if part == "[]":
            args = typing.get_args(tp)
            if not args:
                return None
            tp = args[0]
            continue
        if not dataclasses.is_dataclass(tp):
            return None
        hints = typing.get_type_hints(tp)
        if part not in hints:
            return None
        tp = hints[part]
    return tp


def test_new_keys_exist_in_the_schema():
    """A new key is in some command's config (`env_feedback.*` in the env-feedback experiment's), an old
    one in none."""
    schemas = [OmegaConf.structured(s()) for s in SCHEMAS]
    for old, new in RENAMED.items():
        assert any(_field_type(new, s) is not None for s in SCHEMAS), new
        if new.startswith(f"{old}."):  # a key that became a section of its name (`grpo.papo`)
            assert dataclasses.is_dataclass(_field_type(old, Config)), old
            continue
        assert all(_field_type(old, s) is None for s in SCHEMAS), old
        if "[]" not in new:
            assert any(OmegaConf.select(s, new, default="absent") != "absent" for s in schemas), new
            assert all(OmegaConf.select(s, old, default="absent") == "absent" for s in schemas), old


def _override(old: str) -> str:
    """An override that sets `old`; a list item is named by its index (`data.families.0.task=5`)."""
    return f"{old.replace('[]', '.0')}=5"


@pytest.mark.parametrize(("old", "new"), sorted(RENAMED.items()))
def test_old_key_on_the_command_line_names_the_new_one(old, new):
    with pytest.raises(
        ConfigError, match=rf"command line: `{old}` was renamed to `{new}`".replace("[]", r"\[\]")
    ):
        load_config(overrides=[_override(old)])


def test_old_key_in_a_file_names_the_new_one(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text("env:\n  feedback:\n    video_fps: 5\n")
    with pytest.raises(
        ConfigError, match=r"old.yaml: `env.feedback.video_fps` was renamed to `env_feedback.rollout_fps`"
    ):
        load_config(path, schema=EnvFeedbackRun)
    cfg = load_config(overrides=["env_feedback.rollout_fps=5"], schema=EnvFeedbackRun)
    assert cfg.env_feedback.rollout_fps == 5


def test_a_renamed_section_renames_every_key_under_it(tmp_path):
    """Issue 52: `env.feedback` became the section `env_feedback`; each old key names its new one, also for a
    command that does not read it (the core's `embodied grpo`)."""
    path = tmp_path / "old.yaml"
    path.write_text("env:\n  turns: 1\n  feedback:\n    arms: [sim]\n    seeds: [0]\n")
    for schema in (Config, EnvFeedbackRun):
        with pytest.raises(
            ConfigError, match=r"old.yaml: `env.feedback.arms` was renamed to `env_feedback.arms`$"
        ):
            load_config(path, schema=schema)
    with pytest.raises(
        ConfigError, match=r"`env.feedback.test_time_k` was renamed to `env_feedback.test_time_k`"
    ):
        load_config(overrides=["env.feedback.test_time_k=[1]"], schema=EnvFeedbackRun)
    assert load_config(overrides=["env_feedback.seeds=[4]"], schema=EnvFeedbackRun).env_feedback.seeds == [4]


def test_a_question_familys_old_key_inside_a_list_names_the_new_one(tmp_path):
    """`data.families[].task` and `cosmos.curriculum[].tasks` (issue 23: a question family is a `family`)."""
    path = tmp_path / "old.yaml"
    path.write_text("data:\n  families:\n    - {task: arrow_of_time, scene: slide}\n")
    with pytest.raises(
        ConfigError, match=r"old.yaml: `data.families\[\].task` was renamed to `data.families\[\].family`"
    ):
        load_config(path)
    with pytest.raises(
        ConfigError, match=r"`cosmos.curriculum\[\].tasks` was renamed to `cosmos.curriculum\[\].families`"
    ):
        load_config(overrides=["cosmos.curriculum=[{tasks: [arrow_of_time], steps: 2}]"], schema=CosmosRun)
    with pytest.raises(ConfigError, match=r"`data.families\[\].task` was renamed"):
        load_config(overrides=["data.families=[{task: arrow_of_time}]"])
    cfg = load_config(
        overrides=[
            "data.families=[{family: spatial_puzzle}]",
            "cosmos.curriculum=[{families: [a], steps: 2}]",
        ],
        schema=CosmosRun,
    )
    assert cfg.data.families[0].family == "spatial_puzzle" and cfg.cosmos.curriculum[0].families == ["a"]


def test_the_cli_prints_it(capsys):
    from embodied.cli import main

    assert main(["show-config", "env.feedback.video_fps=5"]) == 2
    assert "renamed to `env_feedback.rollout_fps`" in capsys.readouterr().err
    assert main(["experiment", "env-feedback", "env.feedback.seeds=[0]"]) == 2
    assert "`env.feedback.seeds` was renamed to `env_feedback.seeds`" in capsys.readouterr().err


def test_grpo_keys_moved_into_the_sections_of_their_ingredient(tmp_path):
    """Issue 61: `grpo.ppo.*`, `grpo.papo.*`, `grpo.cov.*`, `grpo.overlong.*`. A key that became a section of
    its own name is an old key only when it holds a value: the section's keys are new ones."""
    for old, new in (("grpo.papo=true", "grpo.papo.enabled"), ("grpo.overlong=soft", "grpo.overlong.mode")):
        with pytest.raises(ConfigError, match=rf"`{old.split('=')[0]}` was renamed to `{new}`$"):
            load_config(overrides=[old])
    path = tmp_path / "old.yaml"
    path.write_text("grpo:\n  advantage: gae\n  value_warmup_steps: 2\n")
    with pytest.raises(
        ConfigError, match=r"`grpo.value_warmup_steps` was renamed to `grpo.ppo.value_warmup_steps`"
    ):
        load_config(path)
    path.write_text(
        "grpo:\n  papo:\n    enabled: true\n    gamma: 0.02\n  overlong: {mode: soft, buffer: 4}\n"
    )
    cfg = load_config(path, overrides=["grpo.cov.mode=kl_cov", "grpo.ppo.lam=0.9"])
    assert cfg.grpo.papo.enabled and cfg.grpo.papo.gamma == 0.02 and cfg.grpo.overlong.buffer == 4
    assert cfg.grpo.cov.mode == "kl_cov" and cfg.grpo.ppo.lam == 0.9
