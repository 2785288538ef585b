"""What a training loop is handed, in one object.

`Run` is what a caller gives a loop besides its section of the config: the policy, the data, where it
writes, the seed, the reward, the processes, how interactive episodes are played. `train_sft(cfg, run)`,
`train_grpo(cfg, run)` and `train_expert(cfg, sft_cfg, run)` take it, so their signatures are short and
the same.

What a loop carries from step to step is its algorithm step's (`GRPO`, `SFT`, `Expert`), built complete by
its `build`; `embodied.train.runner.Runner` does the cadence around it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embodied.envs.config import ONE_TURN, Turns
from embodied.rl.rewards import RewardFn
from embodied.train.distributed import Processes
from embodied.video import VideoConfig


@dataclass
class Run:
    """The inputs of a training loop, besides its section of the config."""

    model: Any
    processor: Any
    train: Sequence
    """The training examples (`embodied.data.load.Example`)."""
    out_dir: Path | str
    """Metrics go to `out_dir/metrics.jsonl`, checkpoints to `out_dir/checkpoints/<loop>`."""
    video: VideoConfig = field(default_factory=VideoConfig)
    val: Sequence = ()
    """Validation examples for the held-out points (`eval_every`)."""
    seed: int = 0
    progress: bool = True
    reward_fn: RewardFn | None = None
    """`reward_fn(texts, records)` scores a batch (GRPO, expert iteration; None: the MCQ rules)."""
    resume: str = ""
    """"", "auto" (the newest checkpoint in `out_dir`) or a checkpoint folder."""
    config_yaml: str = ""
    """The whole config as YAML, saved in every checkpoint."""
    procs: Processes | None = None
    """The processes of a multi-process run (None: one process)."""
    turns: Turns = ONE_TURN
    """How interactive episodes are played (`Turns.of(cfg.env)`; GRPO and expert iteration)."""
    engine: Any = None
    """The rollout engine that samples the loop's answers (`embodied.policy.sampling`, `rollout.engine`),
    synced with `model` after every optimizer step; None: Hugging Face `generate` on `model` itself."""

    def __post_init__(self):
        self.out_dir = Path(self.out_dir)

    @classmethod
    def of(cls, cfg, model, processor, train: Sequence, out_dir: Path | str, **fields) -> Run:
        """A run with a whole config's (`embodied.config.Config`) `video` and `seed`; `fields` set the
        rest."""
        return cls(model, processor, train, out_dir, video=cfg.video, seed=cfg.seed, **fields)
