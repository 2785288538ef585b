"""One config system: typed dataclasses are the schema, YAML files hold differences, and dotted
`key=value` overrides on the command line win last. Merging and type checking are OmegaConf's
structured configs; an unknown key or a wrongly typed value is an error that names it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from embodied.datasets import DataConfig
from embodied.envs.config import EnvConfig
from embodied.policy import PolicyConfig
from embodied.video import VideoConfig


@dataclass
class SFTConfig:
    """Supervised fine-tuning on the generated questions (targets: `tasks.sft_target`)."""

    steps: int = 1200
    """Optimizer steps."""
    batch_size: int = 32
    lr: float = 3e-4
    """Peak learning rate (AdamW) of the language model, reached after `warmup_steps`, then cosine to 10%."""
    warmup_steps: int = 10
    vision_lr_scale: float = 10.0
    """Learning rate of the vision tower relative to `lr`. On the tiny model a uniform rate lets the language
    model fit the answer format and tune out the clip before the vision tower finds the cue."""
    restart_every: int = 100
    """Warm restarts (SGDR): every this many steps a fresh AdamW and a new warmup + cosine (0 = off)."""
    rationale: bool = False
    """Train on each family's templated rationale inside `<think>` (default: an empty `<think>`)."""
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    log_every: int = 10
    eval_every: int = 100
    """Greedy accuracy on `eval_examples` validation clips every this many steps (0 = never)."""
    eval_examples: int = 100


@dataclass
class GRPOConfig:
    """Group Relative Policy Optimization (DeepSeekMath) with rule-based MCQ rewards."""

    steps: int = 40
    prompts_per_step: int = 4
    group_size: int = 8
    """Responses sampled per prompt (G); advantages are normalised within each group."""
    max_new_tokens: int = 32
    temperature: float = 1.0
    lr: float = 5e-5
    """Constant AdamW learning rate. Above ~1e-4 the tiny model's accuracy degrades."""
    clip_eps: float = 0.2
    """Lower clip range of the ratio (and the upper one unless `clip_eps_high` is set)."""
    clip_eps_high: float | None = None
    """Upper clip range; DAPO's clip-higher uses 0.28 with clip_eps 0.2."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 for negative advantages (None = off)."""
    advantage: str = "grpo"
    """grpo (group mean/std) | drgrpo (group mean only) | rloo (leave-one-out) | reinforce_pp (batch std)."""
    loss_agg: str = "seq-mean-token-mean"
    """seq-mean-token-mean (GRPO) | token-mean (DAPO) | seq-sum-norm (Dr. GRPO, divided by max_new_tokens)."""
    kl_estimator: str = "k3"
    """k1 | k2 | k3 estimator of the KL to the reference."""
    kl_coef: float = 0.04
    """Weight of the k3 KL to the frozen initial policy; 0 drops the reference model entirely."""
    accuracy_weight: float = 1.0
    format_weight: float = 0.5
    reward_timeout_s: float = 60.0
    """A reward call (one batch) taking longer stops the run with an error instead of scoring anything."""
    grad_clip: float = 1.0
    log_every: int = 5
    eval_every: int = 0
    eval_examples: int = 100


@dataclass
class EvalConfig:
    split: str = "test"
    batch_size: int = 64
    max_new_tokens: int = 48
    limit: int | None = None
    """Evaluate only the first `limit` records of the split."""
    choice: bool = True
    """Also report forced-choice accuracy (the option letter the model finds most likely)."""


@dataclass
class Config:
    """A whole run. Each command reads the sections it needs."""

    run_dir: str = ""
    """Where metrics, plots, models and summaries are written; empty means `runs/<command>`."""
    seed: int = 0
    """Seed for data order, sampling and initialisation of training."""
    threads: int = 0
    """torch CPU threads (0 = torch's default)."""
    data: DataConfig = field(default_factory=DataConfig)
    video: VideoConfig = field(default_factory=VideoConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    env: EnvConfig = field(default_factory=EnvConfig)


class ConfigError(ValueError):
    """A config file or override that does not fit the schema; the message says which and why."""


def load_config(
    path: str | Path | None = None, overrides: list[str] | None = None, base: Config | None = None
) -> Config:
    """Schema defaults (or `base`) <- YAML file <- dotted overrides, checked against the dataclasses."""
    merged = OmegaConf.structured(base if base is not None else Config())
    layers = []
    if path:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} not found")
        try:
            layer = OmegaConf.load(p)
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: not valid YAML ({' '.join(str(e).split())})") from None
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
        try:
            merged = OmegaConf.merge(merged, layer)
        except OmegaConfBaseException as e:
            first_line = str(e).splitlines()[0]
            raise ConfigError(f"{where}: {first_line} (key {getattr(e, 'full_key', '?')!r})") from None
    return OmegaConf.to_object(merged)


def to_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def to_dict(cfg: Config) -> dict:
    return OmegaConf.to_container(OmegaConf.structured(cfg))
