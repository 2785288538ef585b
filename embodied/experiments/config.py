"""The experiments' own sections, each read by its experiment only (`embodied experiment NAME`): an
experiment's config is the core `Config` plus its section (`RUNS`), so `embodied show-config` and the
training commands never see them. Kept free of heavy imports (no torch): `embodied show-config experiment
NAME` and a misspelt key answer without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from embodied.bench.config import BenchRun
from embodied.config import Config


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

    families: list[str] = field(default_factory=list)
    """Train only on these question families (`family` names of `data.families`)."""
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
    of the same families in every other scene (empty: no transfer run)."""
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
    sft_only: bool = False
    """True: every seed's main job ends after its SFT row, and no zero or transfer job runs (no GRPO, more-SFT
    or baseline rows). The cheap way to measure an SFT-side lever (the mix, the curriculum, the targets) on
    every seed; the table then checks only the SFT target (every family's interval above chance)."""
    keep_weights: bool = False
    """True: every seed's main job also saves its SFT policy (`seed<S>/main/sft/model`) and, unless
    `sft_only`, its SFT + GRPO policy (`seed<S>/main/grpo/model`) as Hugging Face folders that
    `policy.path` loads (the tiny policy: about 20 MB each). A row saved without weights is recomputed once
    when this is set; it changes no number."""


@dataclass
class EnvFeedbackConfig:
    """`embodied experiment env-feedback`: MCQ vs simulator vs mixed rewards (GRPO) and expert iteration
    from one format-only start."""

    arms: list[str] = field(default_factory=lambda: ["mcq", "sim", "mixed", "expert"])
    """Which reward each arm trains on: mcq (rule-checked answers), sim (physics), mixed (both), all with
    GRPO; expert: the sim arm's episodes and physics with expert iteration instead of GRPO (`expert:`, best
    of N verified by the simulator, then fine-tuned on; compare at equal answers scored)."""
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    """One start and one run of every arm per seed (training order, sampling, initial noise)."""
    eval_mcq: int = 200
    """Held-out MCQ test questions each arm is evaluated on (0 = the whole test split)."""
    benchmark: str = "configs/physics_bench.yaml"
    """A YAML file whose `data:` section is a held-out MCQ benchmark of every family; each arm is also
    evaluated on it (generated under its `data.root` when missing). Empty: none."""
    benchmark_n_test: int = 400
    """Questions of the benchmark to generate and evaluate (its `data.n_test` is replaced by this)."""
    test_time_seeds: list[int] = field(default_factory=lambda: [0])
    """Seeds whose arms are also evaluated with sampled answers: best-of-N with the simulator as the
    verifier and majority vote on the episodes, majority vote on the MCQs."""
    test_time_samples: int = 16
    """Answers sampled per episode or question for the test-time compute curves."""
    test_time_k: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    """The N of best-of-N and of the majority vote (each <= test_time_samples)."""
    test_time_episodes: int = 60
    """Held-out episodes per task (the first ones) that the test-time samples are drawn on (0: every one);
    the greedy figures cover all `env.n_test`. Sampling costs `test_time_samples` answers an episode, so it
    stays on 60 where the greedy check runs on more (the default's 200: at 60 a seed needed 29 successes
    of 60 against push's best constant of 14, and one rerun's seed missed it, docs/environments.md)."""
    workers: int = 1
    """Seeds run side by side in this many processes (each with `threads` torch threads; results do not
    depend on it)."""
    videos_per_task: int = 1
    """Rollout videos per task and arm of the first seed (the policy's answer and the outcome drawn)."""
    rollout_fps: float = 10.0
    """Frame rate of those rollout videos (playback only: the policy's frames come at `video.fps`)."""


@dataclass
class RecipesRun(Config):
    """The config of `embodied experiment recipes`: the core sections and `recipes`."""

    recipes: RecipesConfig = field(default_factory=RecipesConfig)


@dataclass
class ZeroLabelRun(Config):
    """The config of `embodied experiment zero-label`: the core sections and `zero_label`."""

    zero_label: ZeroLabelConfig = field(default_factory=ZeroLabelConfig)


@dataclass
class CosmosRun(Config):
    """The config of `embodied experiment cosmos`: the core sections and `cosmos`."""

    cosmos: CosmosConfig = field(default_factory=CosmosConfig)


@dataclass
class EnvFeedbackRun(Config):
    """The config of `embodied experiment env-feedback`: the core sections and `env_feedback`."""

    env_feedback: EnvFeedbackConfig = field(default_factory=EnvFeedbackConfig)


RUNS: dict[str, type[Config]] = {
    "recipes": RecipesRun,
    "zero-label": ZeroLabelRun,
    "cosmos": CosmosRun,
    "env-feedback": EnvFeedbackRun,
}
"""Each experiment's config, by its name on the command line. An experiment not named here (shortcut-audit)
reads the core sections only."""


def schema_of(command: str) -> type[Config]:
    """The config class `command` reads: `experiment/NAME`'s and `bench/NAME`'s add their own section to the
    core `Config` (`RUNS`, `embodied.bench.config.BenchRun`); every other command reads the core `Config`."""
    kind, _, name = command.partition("/")
    return {"bench": BenchRun, "experiment": RUNS.get(name, Config)}.get(kind, Config)
