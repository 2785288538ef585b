"""One runner for every training loop: the step cadence, resume, checkpoints, validation, keep-best, logging.

SFT, GRPO (and PPO) and expert iteration differ in what one step does; everything around the step is the
same job and lives here once, as rsl_rl keeps one `OnPolicyRunner` beside its algorithms. A loop is an
*algorithm step* (`Algorithm`): an object built complete by its loop's `build`, which does one step's work
(`step`), says what to log (`report`), what a checkpoint saves besides the policy (`optimizer`, `schedule`,
`modules`, and its counters: `state`) and takes its counters back (`load`). The runner alone reads and
writes checkpoint files, both ways, as rsl_rl's runner does: an algorithm never opens one.
`Runner.run_steps` reads top to bottom:

    each step: work -> validation (`eval_every`) -> stop? -> log (`log_every`) -> checkpoint

`Cadence` holds the "every" settings, the same fields in `sft:`, `grpo:` and `expert:` terms.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from tqdm.auto import tqdm

from embodied.eval.loop import MCQEval, evaluate
from embodied.policy.lora import has_lora
from embodied.train.checkpoint import resolve_resume, set_aside
from embodied.train.distributed import Processes
from embodied.train.metrics import MetricsLog
from embodied.train.state import Run


class Algorithm(Protocol):
    """What a loop gives the runner: one step's work and what a checkpoint holds of it."""

    stage: str
    """`metrics.jsonl`'s stage and the checkpoint folder `checkpoints/<stage>`: sft | grpo | expert."""
    title: str
    """How messages name the loop ("SFT", "GRPO", "expert iteration")."""
    unit: str
    """What one step is called ("step", "round")."""
    optimizer: torch.optim.Optimizer | None
    schedule: object | None
    modules: dict[str, torch.nn.Module] | None
    """Modules trained beside the policy, saved as `<name>.safetensors` (PPO's value head); None: none."""

    def step(self, step: int) -> None:
        """One step's work: sample, score, update."""

    def report(self, step: int, due: bool, step_s: float) -> dict:
        """The row `metrics.jsonl` gets at `step` (`due`: a logging step; `step_s`: the step's seconds, its
        validation left out); {}: none. Called on every process (it may reduce metrics over them); only the
        first writes."""

    def postfix(self, row: dict) -> dict:
        """What the progress bar shows of a logged row."""

    def state(self) -> dict:
        """The counters a checkpoint saves (JSON)."""

    def load(self, state: dict) -> None:
        """Take back the counters of a checkpoint (`state` as `state()` gave them, with its `step`), the
        policy, optimizer, schedule and modules already loaded by the runner; a ValueError refuses a
        checkpoint this run cannot continue."""

    def summary(self) -> dict:
        """The run's summary, beside the runner's steps and seconds."""


@dataclass(frozen=True)
class Cadence:
    """How often the runner validates, logs and checkpoints, and when it stops."""

    steps: int
    log_every: int = 1
    eval_every: int = 0
    """Greedy accuracy on `eval_examples` validation clips every this many steps (0: never)."""
    eval_examples: int = 100
    checkpoint_every: int = 1
    """A checkpoint every this many steps and at the last (0: never)."""
    keep_checkpoints: int = 2
    keep_best: bool = False
    """End on the weights of the best held-out point (validated at the last step too)."""
    stop_at: float = 0.0
    """Stop at the first validation accuracy at or above this (0: never)."""
    max_seconds: float = 0.0
    """Stop after the first step that ends this many seconds in (0: no limit)."""

    def check(self, stage: str, world: int, resume: str) -> None:
        """Fail before any work when `keep_best` cannot hold: it needs validation, one process, no resume."""
        if self.keep_best and (not self.eval_every or world > 1 or resume):
            raise ValueError(
                f"{stage}.keep_best needs {stage}.eval_every > 0 and validation clips, in one process, "
                "without resume (the best weights are held in memory)"
            )

    @classmethod
    def of(cls, cfg, steps: int | None = None, **changes) -> Cadence:
        """The cadence fields of a loop's config section (`SFTConfig`, `GRPOConfig`)."""
        fields = {k: getattr(cfg, k) for k in cls.__dataclass_fields__ if hasattr(cfg, k)}
        return cls(**(fields | {"steps": cfg.steps if steps is None else steps} | changes))


@dataclass
class Runner:
    """Runs an `Algorithm` for `cadence.steps` steps from `start` (past a resumed checkpoint)."""

    algo: Algorithm
    run: Run
    cadence: Cadence
    procs: Processes
    log: MetricsLog
    best: BestWeights | None
    on_validate: Callable[[int, float], None] | None
    start: int
    before_s: float
    """Seconds a resumed run had spent (its checkpoint's `elapsed`; 0 for a fresh run)."""

    @classmethod
    def build(
        cls, algo: Algorithm, run: Run, cadence: Cadence, procs: Processes, log: MetricsLog, on_validate=None
    ) -> Runner:
        """Resume `algo` from `run.resume` ("", "auto" or a checkpoint folder), or set an earlier run's
        checkpoints aside (a fresh run never continues them)."""
        cadence.check(algo.stage, procs.world, run.resume)
        ckpt_dir = run.out_dir / "checkpoints" / algo.stage
        start, before = 1, 0.0
        if path := resolve_resume(run.resume, ckpt_dir):
            saved = procs.load_checkpoint(path, run.model, algo.optimizer, algo.schedule, algo.modules)
            try:
                algo.load(saved)
            except ValueError as e:  # name the folder: under resume=auto the user did not
                raise ValueError(f"checkpoint {path}: {e}") from None
            start, before = saved["step"] + 1, saved.get("elapsed", 0.0)
            log.truncate(saved["step"])
            print(f"resuming {algo.title} from {path} ({algo.unit} {saved['step']})")
        else:  # a fresh run: an earlier run's checkpoints and rows of this stage are not continued
            if cadence.checkpoint_every:
                set_aside(ckpt_dir, procs.main)
            if procs.main:
                log.truncate(0)
        best = BestWeights() if cadence.keep_best else None
        return cls(algo, run, cadence, procs, log, best, on_validate, start, before)

    @property
    def ckpt_dir(self) -> Path:
        return self.run.out_dir / "checkpoints" / self.algo.stage

    def run_steps(self) -> dict:
        """Every step from `start`: the work, validation, the stop rule, the log row, the checkpoint; then
        the summary (under `keep_best` the policy ends on its best held-out weights)."""
        c, algo = self.cadence, self.algo
        bar = tqdm(
            range(self.start, c.steps + 1), desc=algo.stage, unit=algo.unit, disable=not self.run.progress
        )
        self.t_start = time.perf_counter() - self.before_s
        step = self.start - 1  # a run resumed at its last step runs no more
        for step in bar:
            t0 = time.perf_counter()
            algo.step(step)
            t_eval = time.perf_counter()
            accuracy = self.held_out(step, bar)  # None: no validation this step
            t0 += time.perf_counter() - t_eval  # time/step leaves validation out
            last = self.stops(step, accuracy)
            row = algo.report(step, step % c.log_every == 0 or last, time.perf_counter() - t0)
            if row and self.procs.main:
                self.log.log(step, row)
                bar.set_postfix(algo.postfix(row))
            if c.checkpoint_every and (step % c.checkpoint_every == 0 or last):
                self.checkpoint(step)
            if last:
                break
        return self.finish(step)

    def held_out(self, step: int, bar) -> float | None:
        """Every `eval_every` steps (and the last under `keep_best`): greedy accuracy on the validation clips,
        logged, seen by `best` and `on_validate`; None on the other steps."""
        c, val = self.cadence, self.run.val
        due = c.eval_every and val and (step % c.eval_every == 0 or (self.best and step == c.steps))
        if not (self.procs.all_forward and due):
            return None
        model, run = self.run.model, self.run
        res = evaluate(
            model, run.processor, val[: c.eval_examples], run.video, MCQEval(choice=False, progress=False)
        )
        if self.procs.main:
            metrics = {"eval/accuracy": res["accuracy"], "eval/unparseable": res["unparseable"]}
            self.log.log(step, metrics | {"time/elapsed": time.perf_counter() - self.t_start})
            bar.write(f"{self.algo.stage} step {step}: val accuracy {res['accuracy']:.3f}")
        if self.best is not None:
            self.best.see(step, res["accuracy"], model)
        if self.on_validate is not None:
            self.on_validate(step, res["accuracy"])
        return res["accuracy"]

    def stops(self, step: int, accuracy: float | None) -> bool:
        """Whether the run ends after `step`: the last step, a validation accuracy at or above `stop_at`, or
        `max_seconds` spent; one decision, the same on every process."""
        c = self.cadence
        last = stops_here(c, step, accuracy, time.perf_counter() - self.t_start)
        if (c.stop_at or c.max_seconds) and self.procs.world > 1:
            device = next(self.run.model.parameters()).device
            last = bool(self.procs.sum(torch.tensor(float(last), device=device)) > 0)
        return last

    def checkpoint(self, step: int) -> None:
        """The policy, the algorithm's optimizer, schedule, modules and counters, written atomically."""
        a = self.algo
        self.procs.save_checkpoint(
            self.ckpt_dir, step, self.run.model, a.optimizer, a.schedule, a.state(), self.run.config_yaml,
            self.cadence.keep_checkpoints, a.modules,
        )  # fmt: skip

    def finish(self, step: int) -> dict:
        """Once every process is done: the summary; under `keep_best` the best held-out weights restored."""
        self.procs.barrier()
        self.run.model.eval()
        summary = {"steps": step, "wall_s": time.perf_counter() - self.t_start} | self.algo.summary()
        best = self.best
        if best is not None and best.step is not None:
            best.restore(self.run.model)
            summary |= {"best_step": best.step, "best_accuracy": best.accuracy}
            if self.procs.main:
                self.log.log(step, {"eval/best_step": best.step, "eval/best_accuracy": best.accuracy})
        return summary


def stops_here(c: Cadence, step: int, accuracy: float | None, elapsed_s: float) -> bool:
    """Whether a run ends after `step`: the last step, a validation `accuracy` (None: none this step) at or
    above `c.stop_at`, or `c.max_seconds` spent (0 switches either off)."""
    reached = accuracy is not None and 0 < c.stop_at <= accuracy
    return step >= c.steps or reached or 0 < c.max_seconds <= elapsed_s


class BestWeights:
    """The weights of the held-out point with the highest accuracy so far (the latest of equals), on CPU.
    Under LoRA only the adapters change, so only they are kept (not a second copy of the base weights)."""

    def __init__(self):
        self.step, self.accuracy, self.weights, self.partial = None, -1.0, None, False

    def see(self, step: int, accuracy: float, model) -> None:
        if accuracy >= self.accuracy:
            self.step, self.accuracy = step, accuracy
            state, self.partial = model.state_dict(), has_lora(model)
            if self.partial:
                trained = {n for n, p in model.named_parameters() if p.requires_grad}
                state = {k: v for k, v in state.items() if k in trained}
            self.weights = {k: v.detach().to("cpu", copy=True) for k, v in state.items()}

    def restore(self, model) -> None:
        if self.step is not None:
            model.load_state_dict(self.weights, strict=not self.partial)
