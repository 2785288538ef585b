"""Config section of the interactive tasks (`env:` in YAML). The env-feedback experiment's own section is
`env_feedback` (`embodied/experiments/config.py`).

Kept free of heavy imports (no MuJoCo, no torch) because `embodied.config` imports it for every command.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from embodied.envs import TASKS

TURN_REWARDS = ("last", "mean")
"""How a trajectory's reward combines its turns (`env.turn_reward`, `embodied.rl.episodes`)."""
TURN_CLIPS = ("outcome", "frozen")
"""What a later turn's video shows (`env.turn_clip`): ``outcome``, the previous answer's simulation;
``frozen``, that simulation's first frame (the scene at the reset) held for as many frames: the same
scene, size and length with nothing of what the answer did, the control that tells whether a second look
uses what it sees."""
_LATER = {"words": "turn_words", "clip": "turn_clip", "retry_temperature": "retry_temperature"}
_LATER["retry_min_p"] = "retry_min_p"  # the fields of `Turns` that set later turns, and their `env.` names


@dataclass(frozen=True)
class Turns:
    """How interactive episodes are played over turns, as the `env` section sets them (`Turns.of(cfg.env)`):
    one value handed to everything that plays, trains on or evaluates episodes (`embodied grpo`, `expert`,
    `eval`, the env-feedback experiment), so that no caller passes the six settings one by one, or drops one.
    The fields are `env.turns`, `env.turn_reward`, `env.turn_words`, `env.turn_clip`, `env.retry_temperature`
    and `env.retry_min_p` (see `EnvConfig`). A `Turns` is checked when it is made (`check_turns`), so one
    that exists is valid: the one place the `env.turns` settings are validated."""

    n: int = 1
    reward: str = "last"
    words: bool = False
    clip: str = "outcome"
    retry_temperature: float = 0.0
    retry_min_p: float = 0.0

    def __post_init__(self):
        check_turns(self)

    @classmethod
    def of(cls, env: EnvConfig) -> Turns:
        later = (env.turn_words, env.turn_clip, env.retry_temperature, env.retry_min_p)
        return cls(env.turns, env.turn_reward, *later)

    def evaluation(self) -> Turns:
        """These turns as evaluation plays them: a later turn is drawn as the trajectory's first (greedy, or
        at `eval.temperature`), since `retry_temperature` and `retry_min_p` are for training rollouts
        (`EnvConfig.retry_temperature`)."""
        return replace(self, retry_temperature=0.0, retry_min_p=0.0)


def check_turns(turns: Turns) -> None:
    """Fail at once on invalid turns: `env.turns` < 1, an unknown `env.turn_reward` or `env.turn_clip`, a bad
    `env.retry_temperature` (< 0) or `env.retry_min_p` (outside [0, 1)), or a setting of the turns after
    the first with `env.turns` = 1, which plays none (it would be ignored)."""
    t = turns
    if not isinstance(t.n, int) or t.n < 1:
        raise ValueError(f"env.turns={t.n!r}: the number of turns per episode must be an integer >= 1")
    if t.reward not in TURN_REWARDS:
        raise ValueError(f"env.turn_reward={t.reward!r}; choose one of {list(TURN_REWARDS)}")
    if t.clip not in TURN_CLIPS:
        raise ValueError(f"env.turn_clip={t.clip!r}; choose one of {list(TURN_CLIPS)}")
    number = lambda v: not isinstance(v, bool) and isinstance(v, (int, float))  # noqa: E731
    if not number(t.retry_temperature) or not t.retry_temperature >= 0:
        raise ValueError(
            f"env.retry_temperature={t.retry_temperature!r}: the sampling temperature of turns after the "
            "first must be >= 0 (0: each trajectory keeps its own temperature)"
        )
    if not number(t.retry_min_p) or not 0 <= t.retry_min_p < 1:
        raise ValueError(f"env.retry_min_p={t.retry_min_p!r}: must be in [0, 1) (0: no truncation)")
    if t.n == 1:
        changed = [f for f in _LATER if getattr(t, f) != _DEFAULT[f]]
        if given := [f"env.{_LATER[f]}={getattr(t, f)!r}" for f in changed]:
            raise ValueError(
                f"{', '.join(given)}: set(s) the turns after the first, and env.turns=1 plays none: set "
                "env.turns > 1, or leave them at their defaults"
            )


_DEFAULT = {f.name: f.default for f in fields(Turns)}


ONE_TURN = Turns()
"""The default play: one answer per episode."""


@dataclass
class EnvConfig:
    """Interactive episodes: which tasks, how hard, how many, and which physics backend scores them."""

    tasks: list[str] = field(default_factory=lambda: list(TASKS))
    """Interactive tasks to generate and score (default: every task shipped in `embodied/envs/`)."""
    backend: str = "cpu"
    """cpu (MuJoCo, one episode after another; float64) | warp (MuJoCo Warp, all episodes of a task in a call
    batched; CUDA when present, else Warp's CPU device; `pip install embodied[gpu-sim]`) | mjx (MJX, MuJoCo in
    JAX, the same batching as one jitted `jax.vmap` per task; the GPU when JAX sees one, else JAX's CPU;
    `pip install embodied[gpu-sim-mjx]`; batches padded to a power of two, each new size compiled once, tens
    of seconds). Both batched backends run float32 (docs/scaling.md, "GPU physics")."""
    difficulty: str = "easy"
    """easy | hard (see each task's docstring)."""
    root: str = "data/generated/env"
    """Folder of the generated episodes (JSONL + mp4, the MCQ dataset format)."""
    seed: int = 0
    n_train: int = 200
    """Training episodes per task."""
    n_test: int = 50
    """Held-out episodes per task."""
    width: int = 112
    height: int = 112
    num_frames: int = 4
    fps: float = 2.0
    """Rate (frames per second of simulated time) at which each episode's clip is rendered and stored, as
    `data.clip.fps` is for the generated questions; the policy then samples stored clips at `video.fps`."""
    answer: str = "number"
    """How numeric tasks (carry, push) ask for their action: number (default) | grid, for every task, or per
    task as comma-separated `task=form` pairs (`push=grid`: push as a grid, carry as a number). `number`
    asks for the numbers as text (`<answer>12.5, 0.20</answer>`). `grid` rewrites each numeric episode, when
    it is loaded, into a lettered question whose options are the task's `answer_grid` (carry: grip 2, 6, 15 or
    30 N at 0.20 or 0.40 m/s; push: 0.7-2.1 times the demo's stated impulse, 8 options), so an answer is
    one letter token as on `place`; the letter is parsed back into the action that MuJoCo executes (the
    best constant then also tries every letter). Measured on the env-feedback experiment, 3 seeds
    (docs/environments.md, "Answers as a grid of options"): with `grid`, carry no longer collapses to one
    constant on any seed but every seed stops at a two-answer split (0.617, interval overlapping the best
    constant's), where `number` reached 0.783 on two seeds of three (with 16 prompts x 8 answers, grid
    reached 0.783 on one seed of three); push answers one constant either way. So `number` stays the
    default. Stored episodes serve both forms (no regeneration to switch)."""
    turns: int = 1
    """Turns per interactive episode (1: answer once, as before). With more, an executed answer that does not
    succeed is followed by another turn: the conversation so far plus the clip of what that answer did
    (rendered at `video.fps`, the episode clip's size) and a request to answer again, every answer executed
    from the reset; the episode ends at a success, at an unparseable answer (the unparseable penalty) or
    after `turns` turns (`embodied.rl.episodes`). GRPO's groups are then whole trajectories, every turn a row
    with its trajectory's advantage; evaluation reports success after each turn beside best-of-N. Measured
    on push grid with the tiny policy, 3 seeds (docs/environments.md, "A second look"): from format-only
    starts no policy read the outcome clip; from policies that read push, multi-turn expert iteration beat
    single-turn best-of-2 at the same simulator calls on 2 seeds of 3 (by up to +0.095 on 300 held-out
    episodes); with `expert.retry_targets=better` (8 rounds) every seed beat best-of-2, seeds 0 and 2 read the
    outcome clip, and the greedy second answer separated from the first on seed 2 (0.350 -> 0.490). The
    outcome is in the visual tokens (a linear probe reads it at 0.98-1.00)."""
    turn_words: bool = False
    """Multi-turn episodes: also say the previous turn's outcome in words in the next turn's message
    ("The outcome: short." from the failure terms), beside its clip. False: the clip alone carries it."""
    turn_clip: str = "outcome"
    """Multi-turn episodes: what a later turn's video shows. outcome: the clip of the previous answer's
    simulation | frozen: that clip's first frame (the scene at the reset) held for as many frames, so the
    later turn sees the same scene, size and length but nothing of what the answer did. `frozen` is the
    control for a second look: it spends the same simulator calls and tokens, and tells whether the
    policy's second answer uses what it saw (training and evaluation both follow it)."""
    retry_temperature: float = 0.0
    """Multi-turn training rollouts (GRPO and expert iteration): the sampling temperature of every turn after
    the first (0: each trajectory keeps its own, `grpo.temperature(s)` or `expert.temperature`). A hotter
    retry explores second answers that a peaked policy would not draw after its first one failed.
    Evaluation is not changed (greedy turns stay greedy; test-time samples use `eval`'s temperature)."""
    retry_min_p: float = 0.0
    """Multi-turn training rollouts: before `retry_temperature`, drop every token below `retry_min_p`
    times the most likely token's probability (min-p sampling; 0: none). A hot temperature alone spreads
    mass over the whole vocabulary and breaks the answer format (push grid, tiny policy: at 2.0 about half
    the second answers were unparseable, at 3.0 all); with min-p 0.01 none were. GRPO's log-probs stay
    those of the untruncated distribution."""
    turn_reward: str = "last"
    """How a multi-turn trajectory's reward combines its turns' `reward/total`: last (the last turn's, i.e.
    where the episode ended; a solve at turn 1 and at turn 2 tie) | mean (the mean over the turns taken, so
    solving sooner scores more)."""
    format_weight: float = 0.2
    """Weight of reward/format in reward/total for interactive answers."""
    workers: int = 0
    """Processes generating episodes (0 = in this process)."""
