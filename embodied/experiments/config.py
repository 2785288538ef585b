"""Config sections of the experiments (`recipes:`, `zero_label:` and `cosmos:` in YAML); `env.feedback` is in
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
            "configs/recipes/gspo.yaml",
            "configs/recipes/reinforce_pp.yaml",
            "configs/recipes/papo.yaml",
            "configs/recipes/ppo.yaml",
        ]
    )
    """Preset YAML files, each layered on the run's config for its arm (paths relative to the working dir)."""
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    """One start per seed (its SFT draws and data order); every arm runs from each with that seed."""
    start: str = ""
    """A starting policy folder shared by every seed; empty: build one per seed (`format_steps`, then
    labelled SFT until validation reaches `half_at`), kept in run_dir/start_seed<S>."""
    format_steps: int = 200
    """SFT steps with random-letter targets (`sft.targets=format`): the answer format, never the answer."""
    half_at: float = 0.65
    """Labelled SFT after the format steps stops at the first validation at or above this."""
    half_high: float = 0.8
    """When that step jumps above this (the tiny policy finds the cue in one step), the start is the point
    between the last two steps whose validation lies in [half_at, half_high] (`recipes._bisect`)."""
    half_lr: float = 3e-4
    """Learning rate of the labelled steps: lower than SFT's, so that one step moves accuracy little."""
    half_max_steps: int = 60
    half_eval_examples: int = 200
    """Validation clips read after every labelled step (the first of the val split)."""
    steps: int = 60
    """RL steps per arm (equal for all arms)."""
    eval_every: int = 5
    eval_examples: int = 200
    """Validation clips of the curves (the first of the val split; the start was chosen on the first
    `half_eval_examples` of them, so the start's test accuracy is the unbiased figure)."""
    target: float = 0.9
    """Report the first step and second at which validation accuracy reaches this."""
    workers: int = 2
    """Runs at once, each in its own process (set `threads=1` with 2 on a 2-core machine)."""


@dataclass
class ZeroLabelConfig:
    """`embodied experiment zero-label`."""

    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    starts: list[str] = field(default_factory=lambda: ["format", "half"])
    """format (random-letter SFT targets) | half (format + `half_steps` of labelled SFT)."""
    format_steps: int = 200
    """SFT steps with random-letter targets: the answer format only."""
    half_steps: int = 12
    """Labelled SFT steps on top of the format start, for the half-solving start."""
    eval_every: int = 25
    eval_examples: int = 200
    target: float = 0.9
    """Report the first step and second at which validation accuracy reaches this."""


@dataclass
class CurriculumStage:
    """One SFT stage before the mixed SFT of `embodied experiment cosmos`."""

    tasks: list[str] = field(default_factory=list)
    """Train only on these question families (`task` names of `data.families`)."""
    steps: int = 0
    """SFT steps of this stage (its own warm-up and cosine schedule at `sft.lr`)."""


@dataclass
class CosmosConfig:
    """`embodied experiment cosmos`: Cosmos-Reason1's SFT -> RL table in miniature (stage lengths:
    `sft.steps`, `grpo.steps`)."""

    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    benchmark: str = "configs/physics_bench.yaml"
    """The held-out benchmark's config (its `data:` section), evaluated at `benchmark_n_test` questions."""
    benchmark_n_test: int = 400
    format_steps: int = 200
    """SFT steps with random-letter targets before GRPO alone (random letters: no target tied to the clip)."""
    transfer_scenes: list[str] = field(default_factory=lambda: ["drop", "slide"])
    """The transfer run trains on the families in these scenes and is tested on the benchmark's questions
    of the same tasks in every other scene (empty: no transfer run)."""
    probe_train: int = 2000
    """Training clips of the linear probes of the base's visual tokens per family (0 = no probes): does the
    vision tower carry the answer at all (`embodied.eval.probe`)?"""
    workers: int = 2
    """Jobs at once, each in its own process (set `threads=1` with 2 on a 2-core machine)."""
    order_credit: float = 0.0
    """> 0: the main job also runs its GRPO stage with `grpo.order_credit` at this discount, from the same SFT
    policy and seed, and the table gets a row for it (partial credit against exact match on the ordering
    families, paired by seed)."""
    curriculum: list[CurriculumStage] = field(default_factory=list)
    """SFT stages on subsets of the families, in order, before the `sft.steps` on every family (main job
    only; its SFT row is the policy after all of them). Empty: the mix from the first step."""
