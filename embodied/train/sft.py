"""Supervised fine-tuning: teach the answer format and the first physical intuitions.

Targets are `<think>...</think><answer>X</answer>` (`tasks.sft_target`); the loss is the mean negative
log-likelihood over all target tokens of the batch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from embodied.data.schema import kind
from embodied.envs import is_interactive, random_answer
from embodied.eval.loop import evaluate
from embodied.policy.model import (
    completion_logprobs,
    encode_completions,
    encode_examples,
    end_of_turn,
    select_rows,
    trim_left_padding,
)
from embodied.questions import LETTERS, family_names, is_family, sft_target
from embodied.train.checkpoint import resolve_resume, set_aside
from embodied.train.common import (
    apply_gradients,
    index_batches,
    micro_batches,
    param_groups,
    skip_batches,
    with_last,
)
from embodied.train.config import SFTConfig
from embodied.train.distributed import Processes
from embodied.train.metrics import MetricsLog
from embodied.train.state import Run, Trainer


def warmup_cosine(warmup: int, total: int, floor: float = 0.1):
    """LR multiplier: linear warmup to 1, then cosine decay to `floor`."""

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


def record_rationale(cfg, record: dict) -> str:
    """`cfg.rationale` for `record`, or `none` when `cfg.rationale_families` is set and lacks its family."""
    unknown = [name for name in cfg.rationale_families if not is_family(name)]
    if unknown:  # an error, not a silent "none"
        known = list(family_names())
        raise ValueError(f"sft.rationale_families: unknown question families {unknown}; known: {known}")
    listed = not cfg.rationale_families or kind(record) in cfg.rationale_families
    return cfg.rationale if listed else "none"


def sft_targets(records: Sequence[dict], cfg, seed: int, step: int) -> list[str]:
    """Targets of one step: the family's answer format with the right letter, or (`cfg.targets` format) with
    a letter drawn uniformly from the options by `(seed, step)`, so a resumed run draws the same ones. Format
    targets never carry a trace (`<think>` stays empty under `rationale=trace`): a puzzle's trace names the
    pieces' places, which is the answer.
    Interactive episodes have no label: with format targets they get a random action on the task's answer
    grid (`embodied.envs.random_answer`); with answer targets they are an error."""
    interactive = [is_interactive(r) for r in records]
    if cfg.targets == "answer":
        if any(interactive):
            raise ValueError("sft.targets=answer: interactive episodes have no label; use sft.targets=format")
        return [sft_target(r, record_rationale(cfg, r), cfg.answer_as) for r in records]
    rng = np.random.default_rng([seed, step, 71])

    def format_rationale(r: dict) -> str:  # a trace would tell the answer
        rationale = record_rationale(cfg, r)
        return "none" if rationale == "trace" else rationale

    return [
        random_answer(r, rng)
        if inter
        else sft_target(
            r | {"answer": LETTERS[int(rng.integers(len(r["options"])))]}, format_rationale(r), cfg.answer_as
        )
        for r, inter in zip(records, interactive)
    ]


def answer_weights(processor, texts: Sequence[str], mask: torch.Tensor, weight: float) -> torch.Tensor:
    """Per-token loss weights of the completions `texts` (as `encode_completions` tokenized them, `mask`):
    1 on target tokens, `weight` on every token whose characters overlap the content of `<answer>...</answer>`
    (by the tokenizer's character offsets, so it holds for any tokenizer), 0 on padding."""
    enc = processor.tokenizer(
        [t + end_of_turn(processor) for t in texts], add_special_tokens=False, return_offsets_mapping=True
    )
    out = mask.to(torch.float32).clone()
    for i, (text, spans) in enumerate(zip(texts, enc["offset_mapping"])):
        start, end = text.rfind("<answer>"), text.rfind("</answer>")
        if start < 0 or end < start:
            continue
        start += len("<answer>")
        for j, (a, b) in enumerate(spans):
            if a < end and b > start:
                out[i, j] = weight
    return out


def longest_target(processor, records: Sequence[dict], cfg) -> int:
    """Tokens of the longest SFT target of `records` under `cfg.rationale` (end-of-turn token included): the
    room a policy trained on them needs to write a whole response (`grpo.max_new_tokens`,
    `eval.max_new_tokens`)."""
    tok = processor.tokenizer
    texts = {sft_target(r, record_rationale(cfg, r), cfg.answer_as) for r in records if not is_interactive(r)}
    end = end_of_turn(processor)
    return max((len(tok(t + end, add_special_tokens=False)["input_ids"]) for t in texts), default=0)


def stops_here(cfg, step: int, accuracy: float | None, elapsed_s: float) -> bool:
    """Whether SFT ends after `step`: the last step, a validation `accuracy` (None: none this step) at or
    above `cfg.stop_at`, or `cfg.max_seconds` spent (0 switches either off)."""
    reached = accuracy is not None and 0 < cfg.stop_at <= accuracy
    return step >= cfg.steps or reached or 0 < cfg.max_seconds <= elapsed_s


def train_sft(
    cfg: SFTConfig,
    run: Run,
    target_fn: Callable[[dict], str] | None = None,
    on_validate: Callable[[int, float], None] | None = None,
) -> dict:
    """Run `cfg.steps` SFT steps on `run.train` (a `Run`: the policy, the data, `out_dir`, the seed...);
    metrics go to `out_dir/metrics.jsonl`.

    Checkpoints go to `out_dir/checkpoints/sft`; `run.resume` is "", "auto" or a checkpoint folder. Under
    several processes (`run.procs`), each trains on its slice of every global batch; only the first logs,
    evaluates and writes checkpoints. `target_fn(record)` gives each record's target text (default: the
    family's answer format, `tasks.sft_target`). `on_validate(step, accuracy)` is called after each
    validation (on the processes that validate), e.g. to keep a snapshot of the model.
    """
    t = SFTTrainer.build(cfg, run)
    bar = tqdm(range(t.start, cfg.steps + 1), desc="sft", unit="step", disable=not run.progress)
    t.t_start = time.perf_counter()
    step = t.start - 1  # a run resumed at its last step trains no more
    for step in bar:
        t0 = time.perf_counter()
        if (step - 1) % t.cycle == 0:  # start, and each warm restart
            t.optimizer, t.schedule = _fresh_optimizer(t.model, cfg, t.cycle)
        grad_norm = t.train_step(step, target_fn)
        t_eval = time.perf_counter()
        acc = t.held_out(step, bar, on_validate)  # None: no validation this step
        t0 += time.perf_counter() - t_eval  # time/step leaves validation out
        last = t.stops(step, acc)
        if step % cfg.log_every == 0 or last:
            if t.procs.main:
                bar.set_postfix(loss=f"{t.log_metrics(step, grad_norm, t0):.3f}")
            t.loss_sum = 0.0
        if cfg.checkpoint_every and (step % cfg.checkpoint_every == 0 or last):
            t.checkpoint(step)
        if last:
            break
    t.procs.barrier()
    t.model.eval()
    return {"steps": step, "wall_s": time.perf_counter() - t.t_start, "skipped_steps": t.guard.total}


def sft_micro_batches(batch, ids: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor, size: int):
    """`(prompts, completion ids, mask, loss weights)` of each micro-batch of at most `size` rows (0: the
    whole batch as it is), rows of similar prompt length together, each trimmed of the padding no row of it
    needs."""
    parts = micro_batches(ids.shape[0], size, batch["attention_mask"].sum(1).tolist())
    if len(parts) == 1:
        yield batch, ids, mask, weights
        return
    for rows in parts:
        width = int(mask[rows].sum(1).max())  # completions are right-padded
        yield trim_left_padding(select_rows(batch, rows)), *(t[rows, :width] for t in (ids, mask, weights))


def _fresh_optimizer(model, cfg, cycle: int):
    groups = param_groups(model, cfg.lr, cfg.vision_lr_scale)
    opt = torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(cfg.warmup_steps, cycle))


@dataclass(kw_only=True)
class SFTTrainer(Trainer):
    """An SFT run's state (`Trainer`'s, and): the learning-rate schedule and its cycle (`restart_every`),
    the device, and the loss and token counts its logs and checkpoints carry."""

    cycle: int
    device: torch.device
    schedule: torch.optim.lr_scheduler.LambdaLR | None = None
    loss_sum: float = 0.0
    tokens: int = 0

    @classmethod
    def build(cls, cfg: SFTConfig, run: Run) -> SFTTrainer:
        """Check the settings, wrap the model, open the log; resume (`run.resume`) or set an earlier run's
        checkpoints aside."""
        procs = run.procs or Processes()
        if cfg.targets not in ("answer", "format"):
            raise ValueError(f"sft.targets={cfg.targets!r}; choose answer or format")
        if cfg.micro_batch_size < 0:
            raise ValueError(f"sft.micro_batch_size={cfg.micro_batch_size}; use 0 (the whole batch) or more")
        model = run.model
        net = procs.wrap(model)
        device = next(model.parameters()).device
        model.train()
        cycle = cfg.restart_every if cfg.restart_every > 0 else cfg.steps
        log = MetricsLog(run.out_dir / "metrics.jsonl", "sft")
        order = index_batches(len(run.train), cfg.batch_size, run.seed)
        t = cls(cfg=cfg, run=run, procs=procs, net=net, log=log, order=order, cycle=cycle, device=device)
        if path := resolve_resume(run.resume, t.ckpt_dir):
            t.resume(path)
        elif cfg.checkpoint_every:
            set_aside(t.ckpt_dir, procs.main)
        return t

    @property
    def ckpt_dir(self) -> Path:
        return self.run.out_dir / "checkpoints" / "sft"

    def state(self) -> dict:
        """The counters a checkpoint saves."""
        return {
            "loss_sum": self.loss_sum,
            "tokens": self.tokens,
            "skipped": self.guard.total,
            "in_row": self.guard.in_row,
        }

    def resume(self, path: Path) -> None:
        self.optimizer, self.schedule = _fresh_optimizer(self.model, self.cfg, self.cycle)
        state = self.procs.load_checkpoint(path, self.model, self.optimizer, self.schedule)
        self.start, self.loss_sum, self.tokens = state["step"] + 1, state["loss_sum"], state["tokens"]
        self.guard.total, self.guard.in_row = state["skipped"], state["in_row"]
        self.order = skip_batches(self.order, state["step"])
        self.log.truncate(state["step"])
        print(f"resuming SFT from {path} (step {state['step']})")

    def train_step(self, step: int, target_fn: Callable[[dict], str] | None) -> float:
        """One optimizer step on the next batch (this process's slice): its targets, the loss accumulated
        over micro-batches, the guarded step; returns the gradient norm."""
        cfg, procs, processor, device = self.cfg, self.procs, self.processor, self.device
        chunk = [self.run.train[i] for i in procs.shard(next(self.order))]
        records = [e.record for e in chunk]
        batch = encode_examples(processor, chunk, self.run.video, device)
        targets = [target_fn(r) for r in records] if target_fn else sft_targets(records, cfg, self.seed, step)
        ids, mask = encode_completions(processor, targets, device)
        tokens = procs.sum(mask.sum())  # the mean is over the whole global batch's target tokens
        weights = (
            mask if cfg.answer_weight == 1 else answer_weights(processor, targets, mask, cfg.answer_weight)
        )
        self.optimizer.zero_grad(set_to_none=True)
        loss = torch.zeros((), device=device)
        for part, last in with_last(sft_micro_batches(batch, ids, mask, weights, cfg.micro_batch_size)):
            with procs.grad_sync(self.net, last):  # DDP all-reduces once, after the last part
                logp = completion_logprobs(self.net, *part[:3])
                part_loss = -(logp * part[3]).sum() / tokens
                procs.backward(part_loss)  # gradients add up over the parts: the whole batch's mean
            loss = loss + part_loss.detach()
        grad_norm = apply_gradients(self.model, self.optimizer, loss, cfg.grad_clip, self.guard, step)
        self.schedule.step()
        self.loss_sum += procs.sum(loss.detach()).item()
        self.tokens += int(tokens)
        return grad_norm

    def held_out(self, step: int, bar, on_validate) -> float | None:
        """Every `eval_every` steps: the greedy validation accuracy (then `on_validate(step, accuracy)`);
        None on the other steps."""
        cfg, val = self.cfg, self.run.val
        if not (self.procs.all_forward and cfg.eval_every and val and step % cfg.eval_every == 0):
            return None
        args = (self.log, bar, step, self.t_start, self.procs.main)
        acc = _validate(self.model, self.processor, val[: cfg.eval_examples], self.run.video, *args)
        if on_validate is not None:
            on_validate(step, acc)
        return acc

    def stops(self, step: int, accuracy: float | None) -> bool:
        """`stops_here`, one decision the same on every process."""
        last = stops_here(self.cfg, step, accuracy, time.perf_counter() - self.t_start)
        if (self.cfg.stop_at or self.cfg.max_seconds) and self.procs.world > 1:
            last = bool(self.procs.sum(torch.tensor(float(last), device=self.device)) > 0)
        return last

    def checkpoint(self, step: int) -> None:
        cfg = self.cfg
        self.procs.save_checkpoint(
            self.ckpt_dir, step, self.model, self.optimizer, self.schedule, self.state(),
            self.run.config_yaml, cfg.keep_checkpoints,
        )  # fmt: skip

    def log_metrics(self, step: int, grad_norm: float, t0: float) -> float:
        """Log the mean loss since the last log (and the rest); returns that loss."""
        cfg = self.cfg
        n = cfg.log_every if step % cfg.log_every == 0 else (step - 1) % cfg.log_every + 1
        lrs = self.schedule.get_last_lr()
        metrics = {
            "loss/sft": self.loss_sum / n,
            "optim/lr": lrs[1],
            "optim/lr_vision": lrs[0],
            "optim/grad_norm": grad_norm,
            "time/step": time.perf_counter() - t0,
            "train/tokens": self.tokens,
            "train/skipped_steps": self.guard.total,
        }
        self.log.log(step, metrics)
        return metrics["loss/sft"]


def _validate(
    model, processor, val, video, log: MetricsLog, bar, step: int, t_start: float, main: bool
) -> float:
    """Greedy validation accuracy, logged and returned."""
    res = evaluate(model, processor, val, video, choice=False, progress=False)
    if main:
        metrics = {"eval/accuracy": res["accuracy"], "eval/unparseable": res["unparseable"]}
        log.log(step, metrics | {"time/elapsed": time.perf_counter() - t_start})
        bar.write(f"sft step {step}: val accuracy {res['accuracy']:.3f}")
    return res["accuracy"]
