"""The config system: dataclass defaults <- YAML <- dotted overrides, and its errors; the CLI's use of it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from embodied.bench.config import BenchRun
from embodied.cli import main
from embodied.config import Config, ConfigError, as_schema, load_config, to_dict, to_yaml
from embodied.experiments.config import RUNS, CosmosRun, EnvFeedbackRun

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.y*ml"))


def schema_for(path) -> type[Config]:
    """The config a shipped file is for: the core, or the experiment's or bench's whose section it sets."""
    sections = set(yaml.safe_load(Path(path).read_text()) or {})
    return next((s for s in [BenchRun, *RUNS.values()] if sections & _own(s)), Config)


def _own(schema: type[Config]) -> set[str]:
    """The sections a command's config adds to the core."""
    return set(schema.__dataclass_fields__) - set(Config.__dataclass_fields__)


def test_defaults_load():
    cfg = load_config()
    assert isinstance(cfg, Config)
    assert cfg == Config()
    assert cfg.sft.lr == 1e-3 and cfg.video.fps == 2.0 and cfg.data.clip.num_frames == 4
    assert type(cfg.data.clip).__name__ == "ClipSpec"  # nested dataclasses come back as dataclasses


def test_yaml_and_overrides_merge(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("sft:\n  lr: 0.1\n  steps: 7\ndata:\n  clip:\n    fps: 4.0\neval:\n  limit: 5\n")
    cfg = load_config(f, ["sft.lr=0.5", "grpo.group_size=4"])
    assert cfg.sft.lr == 0.5  # the override wins over the file
    assert cfg.sft.steps == 7  # the file wins over the default
    assert cfg.data.clip.fps == 4.0 and cfg.eval.limit == 5
    assert cfg.grpo.group_size == 4
    assert cfg.sft.batch_size == Config().sft.batch_size  # untouched keys keep their defaults
    # Round trip through YAML keeps every value.
    again = tmp_path / "again.yaml"
    again.write_text(to_yaml(cfg))
    assert load_config(again) == cfg
    assert to_dict(cfg)["sft"]["lr"] == 0.5


def test_overrides_convert_types():
    cfg = load_config(None, ["sft.steps=12", "sft.lr=1e-3", "eval.limit=null", "eval.choice=false"])
    assert cfg.sft.steps == 12 and isinstance(cfg.sft.steps, int)
    assert cfg.sft.lr == 1e-3 and cfg.eval.limit is None and cfg.eval.choice is False


def test_unknown_key_in_yaml(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("sft:\n  lr: 0.1\n  learning_rat: 3\n")
    with pytest.raises(ConfigError) as e:
        load_config(f)
    assert "learning_rat" in str(e.value) and str(f) in str(e.value)


@pytest.mark.parametrize(
    "override,key", [("sft.nope=1", "nope"), ("nope=1", "nope"), ("data.clip.fpz=3", "fpz")]
)
def test_unknown_key_on_command_line(override, key):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert key in str(e.value)


@pytest.mark.parametrize(
    "override,key",
    [
        ("sft.steps=abc", "sft.steps"),
        ("sft.lr=fast", "sft.lr"),
        ("data.clip.num_frames=2.5", "data.clip.num_frames"),
        ("sft.lr=null", "sft.lr"),
    ],
)
def test_wrong_type(override, key):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert key in str(e.value)


def test_wrong_type_in_yaml(tmp_path):
    f = tmp_path / "t.yaml"
    f.write_text("grpo:\n  group_size: eight\n")
    with pytest.raises(ConfigError, match="group_size"):
        load_config(f)


@pytest.mark.parametrize(
    "text,expect",
    [("sft: {lr: [1\n", "not valid YAML"), ("- a\n- b\n", "mapping")],
    ids=["syntax-error", "not-a-mapping"],
)
def test_malformed_yaml_is_config_error(tmp_path, text, expect):
    f = tmp_path / "m.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=expect):
        load_config(f)


def test_missing_file_and_malformed_override(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "absent.yaml")
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["sft.lr"])


@pytest.mark.parametrize("path", CONFIGS or [None], ids=[p.name for p in CONFIGS] or ["none"])
def test_shipped_configs_load(path):
    if path is None:
        pytest.skip("configs/ holds no YAML files")
    schema = schema_for(path)
    assert isinstance(load_config(path, schema=schema), schema)


def test_the_core_holds_no_experiment_or_benchmark_section():
    """Issue 52: each experiment's and the benchmarks' section sits beside its code; the core schema (what
    `embodied show-config` prints) has none of them."""
    core = set(Config.__dataclass_fields__)
    assert not core & {"bench", "recipes", "zero_label", "cosmos", "env_feedback"}
    assert "feedback" not in Config().env.__dataclass_fields__
    assert {s for r in RUNS.values() for s in _own(r)} == {"recipes", "zero_label", "cosmos", "env_feedback"}
    assert _own(BenchRun) == {"bench"}


def test_a_commands_section_loads_with_its_command(tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text("env_feedback:\n  arms: [sim]\nsft:\n  lr: 0.5\n")
    cfg = load_config(f, ["env_feedback.seeds=[7]"], schema=EnvFeedbackRun)
    assert isinstance(cfg, EnvFeedbackRun) and cfg.env_feedback.arms == ["sim"] and cfg.sft.lr == 0.5
    assert cfg.env_feedback.seeds == [7]
    with pytest.raises(ConfigError, match="Did you mean: 'seeds'"):
        load_config(None, ["cosmos.seedz=[1]"], schema=CosmosRun)
    with pytest.raises(ConfigError, match="cosmos"):  # the core has no such section
        load_config(None, ["cosmos.seeds=[1]"])
    refused = {"cosmos": "read by `embodied experiment cosmos` only"}
    with pytest.raises(
        ConfigError, match=r"^command line: `cosmos.\*` is read by `embodied experiment cosmos`"
    ):
        load_config(None, ["cosmos.seeds=[1]"], refused=refused)
    assert load_config(None, ["cosmos.seeds=[1]"], schema=CosmosRun, refused=refused).cosmos.seeds == [1]


def test_as_schema_keeps_the_shared_sections():
    cfg = load_config(None, ["sft.lr=0.5", "cosmos.seeds=[1]"], schema=CosmosRun)
    core = as_schema(cfg)
    assert type(core) is Config and core.sft.lr == 0.5 and not hasattr(core, "cosmos")
    bench = as_schema(core, BenchRun)
    assert bench.sft.lr == 0.5 and bench.bench == BenchRun().bench


# --- CLI --------------------------------------------------------------------------------------------


def test_cli_show_config(capsys):
    assert main(["show-config", "sft.lr=0.5"]) == 0
    out = capsys.readouterr().out
    assert "lr: 0.5" in out
    shown = yaml.safe_load(out)
    assert shown["sft"]["lr"] == 0.5
    assert shown["grpo"]["lr"] == Config().grpo.lr  # only the named key changed
    assert shown["sft"]["steps"] == Config().sft.steps


def test_cli_show_config_of_an_experiment(capsys):
    """`embodied show-config` is the core; `show-config experiment NAME` (or `bench`) adds that section."""
    assert main(["show-config"]) == 0
    core = yaml.safe_load(capsys.readouterr().out)
    assert set(core) == set(Config.__dataclass_fields__)
    assert main(["show-config", "experiment", "env-feedback", "env_feedback.seeds=[5]", "sft.lr=0.5"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["env_feedback"]["seeds"] == [5] and shown["sft"]["lr"] == 0.5 and "cosmos" not in shown
    assert main(["show-config", "bench", "step", "bench.steps=3"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["bench"]["steps"] == 3
    assert main(["show-config", "grpo"]) == 0 and "bench" not in yaml.safe_load(capsys.readouterr().out)
    for argv in (["experiment"], ["experiment", "nope"], ["nope"], ["sft", "x"]):
        assert main(["show-config", *argv]) == 2
        assert "embodied show-config:" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv,said",
    [
        (
            ["grpo", "env_feedback.seeds=[0]"],
            "`env_feedback.*` is read by `embodied experiment env-feedback` only",
        ),
        (["sft", "-c", "configs/experiment_cosmos.yaml"], "`embodied sft` would ignore it"),
        (["experiment", "cosmos", "recipes.steps=2"], "is read by `embodied experiment recipes` only"),
        (["experiment", "recipes", "bench.steps=2"], "`bench.*` is read by `embodied bench NAME` only"),
        (["bench", "step", "zero_label.seeds=[0]"], "`embodied bench step` would ignore it"),
        (["show-config", "cosmos.seeds=[0]"], "(`embodied show-config experiment cosmos` shows it)"),
    ],
)
def test_cli_refuses_a_section_the_command_does_not_read(argv, said, capsys):
    """A key of another command's section is refused in one line that names the command reading it."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert said in err and "config error" in err and len(err.strip().splitlines()) == 1, err


def test_cli_bad_override_exits_2(capsys):
    assert main(["sft", "nope=1"]) == 2
    captured = capsys.readouterr()
    assert "nope" in captured.err and "config error" in captured.err
    assert captured.out == ""


@pytest.mark.parametrize("argv", [[], ["eval"], ["experiment"], ["generate"]])
def test_cli_help_prints_every_command(argv, capsys):
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "usage: embodied" in out
    if not argv:  # the list of commands, with the eval line's "95% interval" intact
        assert "quickstart" in out and "95% interval" in " ".join(out.split())
