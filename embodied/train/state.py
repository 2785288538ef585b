"""What a training loop is handed and what it carries from step to step, each in one object.

`Run` is what a caller gives a loop besides its section of the config: the policy, the data, where it
writes, the seed, the reward, the processes, how interactive episodes are played. `train_sft(cfg, run)`,
`train_grpo(cfg, run)` and `train_expert(cfg, sft_cfg, run)` take it, so their signatures are short and
the same.

`Trainer` is what a loop builds once from its config and the `Run` and then carries from step to step:
the model as the loss sees it (`net`, wrapped under DDP or FSDP), the optimizer, the metrics log, the
non-finite guard, the batch order and the first step (past a resumed checkpoint). The GRPO and SFT loops
extend it with their own pieces (the reference policy and PPO's value head; the learning-rate schedule).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from embodied.envs.config import ONE_TURN, Turns
from embodied.rl.rewards import RewardFn
from embodied.train.common import NonFiniteGuard
from embodied.train.distributed import Processes
from embodied.train.metrics import MetricsLog
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

    def __post_init__(self):
        self.out_dir = Path(self.out_dir)

    @classmethod
    def of(cls, cfg, model, processor, train: Sequence, out_dir: Path | str, **fields) -> Run:
        """A run with a whole config's (`embodied.config.Config`) `video` and `seed`; `fields` set the
        rest."""
        return cls(model, processor, train, out_dir, video=cfg.video, seed=cfg.seed, **fields)


@dataclass(kw_only=True)
class Trainer:
    """The state a loop carries from step to step, built once from its config and `run`."""

    cfg: Any
    """The loop's section of the config (`SFTConfig`, `GRPOConfig`)."""
    run: Run
    procs: Processes | None = None
    """The processes (the loops build one when `run.procs` is None)."""
    net: torch.nn.Module | None = None
    """The model as the loss sees it: `run.model`, wrapped under DDP or FSDP."""
    optimizer: torch.optim.Optimizer | None = None
    log: MetricsLog | None = None
    guard: NonFiniteGuard = field(default_factory=NonFiniteGuard)
    order: Iterator[list[int]] | None = None
    """The batch order (`common.index_batches`), past the batches a resumed run had drawn."""
    start: int = 1
    """The first step to run."""
    t_start: float = 0.0
    """`time.perf_counter()` when the steps began."""

    def __post_init__(self):
        if self.net is None:
            self.net = self.run.model

    @property
    def model(self):
        return self.run.model

    @property
    def processor(self):
        return self.run.processor

    @property
    def seed(self) -> int:
        return self.run.seed
