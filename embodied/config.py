"""One config system: typed dataclasses are the schema, YAML files hold differences, and dotted
`key=value` overrides on the command line win last. Merging and type checking are OmegaConf's
structured configs; an unknown key or a wrongly typed value is an error that names it.

This module only composes: `Config`, the core schema, is the sections of the rooms below it, each imported
from a light leaf beside its code, and the commands above it (`embodied experiment NAME`, `embodied bench
NAME`) each subclass it with their own section beside their code (`embodied/experiments/config.py`,
`embodied/bench/config.py`), so the core holds no experiment's or benchmark's keys.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from embodied.data.schema import DataConfig
from embodied.envs.config import EnvConfig
from embodied.eval.config import EvalConfig
from embodied.integrations.export import ExportConfig
from embodied.policy.config import PolicyConfig, RolloutConfig
from embodied.train.config import ExpertConfig, GRPOConfig, SFTConfig
from embodied.train.pretrain import PretrainConfig
from embodied.train.tracking import LogConfig
from embodied.video import VideoConfig


@dataclass
class QuickstartConfig:
    """What `embodied quickstart` does beyond the sections it shares with the other commands."""

    sft_targets: str = "format"
    """Targets of its SFT stage (`sft.targets` of that stage): format (random letters: SFT teaches the answer
    format and reinforcement learning alone finds which letter the clip calls for) | answer (labels)."""
    grpo_eval_every: int = 50
    """Held-out accuracy on `grpo.eval_examples` validation clips every this many steps of its GRPO stage
    (the curve of report.html through GRPO), unless `grpo.eval_every` is set; 0: none. Greedy answers: the
    training is the same with or without them."""
    keep_best: bool = True
    """Its GRPO stage ends on its best held-out point (`grpo.keep_best`, chosen on validation clips; the test
    clips the stages are scored on stay unseen). False: on the last step, whatever happened after the best."""


@dataclass
class Config:
    """The core schema, what `embodied show-config` prints: the sections of the commands that generate,
    train and evaluate, each command reading those it needs. `embodied experiment NAME` and `embodied bench
    NAME` read a subclass that adds their own section (`embodied/experiments/config.py`,
    `embodied/bench/config.py`)."""

    run_dir: str = ""
    """Where metrics, plots, models and summaries are written; empty means `runs/<command>`."""
    seed: int = 0
    """Seed for data order, sampling and initialisation of training."""
    threads: int = 0
    """torch CPU threads (0 = torch's default)."""
    mixed_precision: str = "no"
    """sft/grpo: "bf16" trains under autocast with fp32 master weights (GPU); "no" is full precision."""
    distributed: str = "ddp"
    """sft/grpo under several processes (`accelerate launch`, `torchrun`): "ddp" replicates the model in each;
    "fsdp" shards parameters, gradients and optimizer state across them (FSDP2), for models too big for one
    device. A checkpoint resumes under the setting that wrote it."""
    resume: str = ""
    """sft/grpo/expert: "" starts fresh (an earlier run's checkpoints in run_dir are moved to
    `checkpoints/<stage>.previous`); "auto" continues from the newest complete checkpoint in run_dir (fresh
    if none); a path continues from that checkpoint folder. An expert run may be resumed with more
    `expert.rounds`."""
    data: DataConfig = field(default_factory=DataConfig)
    video: VideoConfig = field(default_factory=VideoConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    expert: ExpertConfig = field(default_factory=ExpertConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    quickstart: QuickstartConfig = field(default_factory=QuickstartConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    log: LogConfig = field(default_factory=LogConfig)


class ConfigError(ValueError):
    """A config file or override that does not fit the schema; the message says which and why."""


PPO_KEYS = (
    *("gamma", "lam", "value_lam", "vf_coef", "value_clip", "whiten", "whiten_std", "value_lr_scale"),
    *(
        "value_level",
        "value_hidden",
        "value_detach",
        "value_warmup_steps",
        "value_ev_patience",
        "kl_in_reward",
    ),
)
PAPO_KEYS = ("gamma", "mask_prob", "consistent", "entropy_real", "entropy_masked", "masked_grad")

RENAMED = {
    "env.feedback": "env_feedback",
    "env.bench_episodes": "bench.env_episodes",
    "env.bench_backends": "bench.env_backends",
    "env.bench_batches": "bench.env_batches",
    "env.feedback.video_fps": "env_feedback.rollout_fps",
    "data.families[].task": "data.families[].family",
    "cosmos.curriculum[].tasks": "cosmos.curriculum[].families",
    "pretrain.worlds": "pretrain.scenes",
    "pretrain.family": "pretrain.architecture",
    **{f"grpo.{k}": f"grpo.ppo.{k}" for k in PPO_KEYS},
    "grpo.papo": "grpo.papo.enabled",
    **{f"grpo.papo_{k}": f"grpo.papo.{k}" for k in PAPO_KEYS},
    "grpo.cov_mode": "grpo.cov.mode",
    "grpo.cov_ratio": "grpo.cov.ratio",
    "grpo.clip_cov_low": "grpo.cov.clip_low",
    "grpo.clip_cov_high": "grpo.cov.clip_high",
    "grpo.kl_cov_coef": "grpo.cov.kl_coef",
    "grpo.overlong": "grpo.overlong.mode",
    "grpo.overlong_buffer": "grpo.overlong.buffer",
    "grpo.overlong_weight": "grpo.overlong.weight",
}
"""Config keys that were renamed: old dotted key -> new one (``[]`` stands for any item of a list); a renamed
section renames every key under it (`env.feedback.seeds` -> `env_feedback.seeds`). An old key in a file or on
the command line is an error that names the new key, never silently ignored. Issue 23: a question family is a
`family` (`task` is an interactive task only). Issue 52: the env-feedback experiment's section left `env` for
a section of its own (`embodied/experiments/config.py`). Issue 61: a model family is an *architecture*
(`pretrain.architecture`, `embodied.policy.architectures`); `family` is a question family only. The GRPO
keys that act only with one ingredient moved into its section (`grpo.ppo.*`, `grpo.papo.*`, `grpo.cov.*`,
`grpo.overlong.*`); where a key became a section of its name (`grpo.papo`, `grpo.overlong`), only a value
set on it is the old key."""


def _paths(node, prefix: str = ""):
    """Every dotted key path in a YAML layer as plain containers (list items as ``[]``, also when an override
    names one by its index: `data.families.0.task=...`), each section before the keys under it."""
    if isinstance(node, dict):
        for key, value in node.items():
            if prefix and str(key).isdigit():
                path = f"{prefix}[]"
            else:
                path = f"{prefix}.{key}" if prefix else str(key)
            yield path
            yield from _paths(value, path)
    elif isinstance(node, list):
        for item in node:
            yield from _paths(item, f"{prefix}[]")


def _sections(node, prefix: str = ""):
    """The dotted paths of a YAML layer that hold a mapping (a section, not a value)."""
    if isinstance(node, dict):
        if prefix:
            yield prefix
        for key, value in node.items():
            yield from _sections(value, f"{prefix}.{key}" if prefix else str(key))


def _renamed(path: str) -> str | None:
    """The new name of a key path, if it or a section above it is in `RENAMED` (the longest entry wins)."""
    for old in sorted(RENAMED, key=len, reverse=True):
        new = RENAMED[old]  # a key that became a section of its own name renames itself only
        if path == old or (path.startswith((f"{old}.", f"{old}[]")) and not new.startswith(f"{old}.")):
            return new + path[len(old) :]
    return None


def _check_renamed(where: str, layer: DictConfig) -> None:
    plain = OmegaConf.to_container(layer, resolve=False)
    paths, sections = list(_paths(plain)), set(_sections(plain))
    hits = [(i, p) for i, p in enumerate(paths) if _renamed(p) and p not in sections]
    if not hits:
        return
    # name a whole key (`env.feedback.seeds`), not the section above it: the first hit no path extends
    after = [*paths[1:], ""]
    leaves = [p for i, p in hits if not after[i].startswith((f"{p}.", f"{p}[]"))]
    path = (leaves or [hits[0][1]])[0]
    raise ConfigError(f"{where}: `{path}` was renamed to `{_renamed(path)}`")


def load_config(
    path: str | Path | list | None = None,
    overrides: list[str] | None = None,
    base: Config | None = None,
    schema: type[Config] = Config,
    refused: dict[str, str] | None = None,
) -> Config:
    """Schema defaults (or `base`) <- YAML files, in order <- dotted overrides, checked against the schema.

    Several files stack: `[configs/quickstart.yaml, configs/recipes/dapo.yaml]` is the quickstart run
    with DAPO's switches. `schema` is the command's config: the core `Config`, or an experiment's or a
    benchmark's, which adds its own section (`embodied.experiments.config.RUNS`,
    `embodied.bench.config.BenchRun`). `refused` maps a section `schema` lacks to why (`read by ...
    only`): a file or override that sets it fails with that, in one line.
    """
    return OmegaConf.to_object(_merged(path, overrides, base, schema, refused))


def config_yaml(
    path: str | Path | list | None = None,
    overrides: list[str] | None = None,
    schema: type[Config] = Config,
    refused: dict[str, str] | None = None,
) -> str:
    """`to_yaml(load_config(path, overrides, ...))`, what `embodied show-config` prints, from the one merged
    schema (building OmegaConf's schema from the dataclasses is most of show-config's time; no second one)."""
    return OmegaConf.to_yaml(_merged(path, overrides, None, schema, refused), resolve=True)


def as_schema(cfg: Config, schema: type[Config] = Config) -> Config:
    """`cfg` as a `schema` config: the sections both have are `cfg`'s, a section only `schema` has is at its
    defaults, one only `cfg` has is dropped. E.g. the core `Config` of a benchmark's config, for the command
    it times."""
    names = {f.name for f in dataclasses.fields(schema)}
    return schema(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name in names})


def _merged(path, overrides, base, schema: type[Config] = Config, refused=None) -> DictConfig:
    merged = OmegaConf.structured(base if base is not None else schema())
    layers = []
    paths = [path] if isinstance(path, (str, Path)) else list(path or [])
    for p in map(Path, paths):
        if not p.is_file():
            raise ConfigError(f"config file {p} not found")
        try:
            layer = OmegaConf.load(p)
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: not valid YAML ({' '.join(str(e).split())})") from None
        if layer is None:  # an empty file changes nothing
            continue
        if not isinstance(layer, DictConfig):
            kind = type(layer).__name__
            raise ConfigError(f"{p}: must hold a mapping of sections (sft:, data:, ...), not a {kind}")
        layers.append((str(p), layer))
    if overrides:
        bad = [o for o in overrides if "=" not in o]
        if bad:
            raise ConfigError(f"overrides must look like key=value, got {bad}")
        try:
            layers.append(("command line", OmegaConf.from_dotlist(overrides)))
        except yaml.YAMLError as e:
            why = " ".join(str(e).split())
            raise ConfigError(f"command line: cannot parse {overrides} ({why})") from None
    for where, layer in layers:
        _check_renamed(where, layer)
        for section in layer:
            if section in (refused or {}) and section not in merged:
                raise ConfigError(f"{where}: `{section}.*` is {refused[section]}")
        try:
            merged = OmegaConf.merge(merged, layer)
        except OmegaConfBaseException as e:
            first_line = str(e).splitlines()[0]
            raise ConfigError(f"{where}: {first_line} (key {getattr(e, 'full_key', '?')!r})") from None
    return merged


def to_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def to_dict(cfg: Config) -> dict:
    return OmegaConf.to_container(OmegaConf.structured(cfg))
