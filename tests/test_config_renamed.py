"""Renamed config keys fail with a message that names the new key (issue 23), in a file and on the command
line, and every new key in the table exists in the schema."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from embodied.config import RENAMED, Config, ConfigError, load_config


def test_new_keys_exist_in_the_schema():
    schema = OmegaConf.structured(Config())
    for old, new in RENAMED.items():
        assert "[]" in new or OmegaConf.select(schema, new, throw_on_missing=False) is not None, new
        assert "[]" in old or OmegaConf.select(schema, old, default="absent") == "absent", old


@pytest.mark.parametrize(("old", "new"), sorted(RENAMED.items()))
def test_old_key_on_the_command_line_names_the_new_one(old, new):
    with pytest.raises(ConfigError, match=rf"command line: `{old}` was renamed to `{new}`"):
        load_config(overrides=[f"{old}=5"])


def test_old_key_in_a_file_names_the_new_one(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text("env:\n  feedback:\n    video_fps: 5\n")
    with pytest.raises(
        ConfigError, match=r"old.yaml: `env.feedback.video_fps` was renamed to `env.feedback.rollout_fps`"
    ):
        load_config(path)
    assert load_config(overrides=["env.feedback.rollout_fps=5"]).env.feedback.rollout_fps == 5


def test_the_cli_prints_it(capsys):
    from embodied.cli import main

    assert main(["show-config", "env.feedback.video_fps=5"]) == 2
    assert "renamed to `env.feedback.rollout_fps`" in capsys.readouterr().err
