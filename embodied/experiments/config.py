"""Config sections of the experiments (`recipes:` and `zero_label:` in YAML); `env.feedback` is in
`embodied.envs.config`. A leaf: `embodied.config` imports it for every command."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RecipesConfig:
    """The recipe comparison (`embodied experiment recipes`)."""

    arms: list[str] = field(
        default_factory=lambda: [
            "configs/recipes/grpo.yaml",
            "configs/recipes/dapo.yaml",
            "configs/recipes/drgrpo.yaml",
            "configs/recipes/papo.yaml",
        ]
    )
    """Preset YAML files, each layered on the run's config for its arm (paths relative to the working dir)."""
    start: str = ""
    """Starting policy folder; empty: train one with `sft_steps` of SFT (cached in run_dir/start_model)."""
    sft_steps: int = 650
    steps: int = 60
    """GRPO steps per arm (equal for all arms)."""
    eval_every: int = 5
    eval_examples: int = 200
    target: float = 0.9
    """Report the first step at which validation accuracy reaches this."""


@dataclass
class ZeroLabelConfig:
    """`embodied experiment zero-label`."""

    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    starts: list[str] = field(default_factory=lambda: ["format", "half"])
    """format (never saw a right answer) | half (format + `half_steps` of labelled SFT)."""
    format_steps: int = 200
    """SFT steps with random-letter targets: the answer format only."""
    half_steps: int = 12
    """Labelled SFT steps on top of the format start, for the half-solving start."""
    eval_every: int = 25
    eval_examples: int = 200
    target: float = 0.9
    """Report the first step and second at which validation accuracy reaches this."""
