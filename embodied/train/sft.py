"""Supervised fine-tuning: teach the answer format and the first physical intuitions.

Targets are `<think>...</think><answer>X</answer>` (`tasks.sft_target`); the loss is the mean negative
log-likelihood over all target tokens of the batch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from embodied.data.load import Example
from embodied.envs import is_interactive, random_answer
from embodied.eval.loop import evaluate
from embodied.policy.model import completion_logprobs, encode_completions, encode_prompts
from embodied.tasks import LETTERS, sft_target
from embodied.train.checkpoint import resolve_resume
from embodied.train.common import (
    NonFiniteGuard,
    Processes,
    index_batches,
    optimizer_step,
    param_groups,
    skip_batches,
)
from embodied.train.metrics import MetricsLog
from embodied.video import VideoConfig


def warmup_cosine(warmup: int, total: int, floor: float = 0.1):
    """LR multiplier: linear warmup to 1, then cosine decay to `floor`."""

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


def sft_targets(records: Sequence[dict], cfg, seed: int, step: int) -> list[str]:
    """Targets of one step: the family's answer format with the right letter, or (`cfg.targets` format) with
    a letter drawn uniformly from the options by `(seed, step)`, so a resumed run draws the same ones.
    Interactive episodes have no label: with format targets they get a random action on the task's answer
    grid (`embodied.envs.random_answer`); with answer targets they are an error."""
    interactive = [is_interactive(r) for r in records]
    if cfg.targets == "answer":
        if any(interactive):
            raise ValueError("sft.targets=answer: interactive episodes have no label; use sft.targets=format")
        return [sft_target(r, cfg.rationale) for r in records]
    rng = np.random.default_rng([seed, step, 71])
    return [
        random_answer(r, rng)
        if inter
        else sft_target(r | {"answer": LETTERS[int(rng.integers(len(r["options"])))]}, cfg.rationale)
        for r, inter in zip(records, interactive)
    ]


def train_sft(
    model,
    processor,
    train: Sequence[Example],
    cfg,
    video: VideoConfig,
    out_dir: str | Path,
    val: Sequence[Example] = (),
    seed: int = 0,
    progress: bool = True,
    resume: str = "",
    config_yaml: str = "",
    procs: Processes | None = None,
    target_fn: Callable[[dict], str] | None = None,
) -> dict:
    """Run `cfg.steps` SFT steps (`cfg` is an `SFTConfig`); metrics go to `out_dir/metrics.jsonl`.

    Checkpoints go to `out_dir/checkpoints/sft`; `resume` is "", "auto" or a checkpoint folder. Under
    several processes (`procs`), each trains on its slice of every global batch; only the first logs,
    evaluates and writes checkpoints. `target_fn(record)` gives each record's target text (default: the
    family's answer format, `tasks.sft_target`).
    """
    procs = procs or Processes()
    if cfg.targets not in ("answer", "format"):
        raise ValueError(f"sft.targets={cfg.targets!r}; choose answer or format")
    net = procs.wrap(model)
    device = next(model.parameters()).device
    model.train()
    cycle = cfg.restart_every if cfg.restart_every > 0 else cfg.steps

    def fresh_optimizer():
        groups = param_groups(model, cfg.lr, cfg.vision_lr_scale)
        opt = torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)
        return opt, torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(cfg.warmup_steps, cycle))

    log = MetricsLog(Path(out_dir) / "metrics.jsonl", "sft")
    ckpt_dir = Path(out_dir) / "checkpoints" / "sft"
    order = index_batches(len(train), cfg.batch_size, seed)
    guard = NonFiniteGuard()
    loss_sum, tok_sum, start = 0.0, 0, 1
    if path := resolve_resume(resume, ckpt_dir):
        optimizer, schedule = fresh_optimizer()
        state = procs.load_checkpoint(path, model, optimizer, schedule)
        start, loss_sum, tok_sum = state["step"] + 1, state["loss_sum"], state["tokens"]
        guard.total, guard.in_row = state["skipped"], state["in_row"]
        order = skip_batches(order, state["step"])
        log.truncate(state["step"])
        print(f"resuming SFT from {path} (step {state['step']})")
    bar = tqdm(range(start, cfg.steps + 1), desc="sft", unit="step", disable=not progress)
    t_start = time.perf_counter()
    for step in bar:
        t0 = time.perf_counter()
        if (step - 1) % cycle == 0:  # start, and each warm restart
            optimizer, schedule = fresh_optimizer()
        chunk = [train[i] for i in procs.shard(next(order))]
        records = [e.record for e in chunk]
        batch = encode_prompts(processor, records, [e.clip for e in chunk], video, device)
        targets = [target_fn(r) for r in records] if target_fn else sft_targets(records, cfg, seed, step)
        ids, mask = encode_completions(processor, targets, device)
        logp = completion_logprobs(net, batch, ids, mask)
        tokens = procs.sum(mask.sum())  # the mean is over the whole global batch's target tokens
        loss = -(logp * mask).sum() / tokens
        grad_norm = optimizer_step(model, optimizer, loss, cfg.grad_clip, guard, step, procs.backward)
        schedule.step()
        loss_sum += procs.sum(loss.detach()).item()
        tok_sum += int(tokens)
        if procs.main and (step % cfg.log_every == 0 or step == cfg.steps):
            metrics = {
                "loss/sft": loss_sum
                / (cfg.log_every if step % cfg.log_every == 0 else (step - 1) % cfg.log_every + 1),
                "optim/lr": schedule.get_last_lr()[1],
                "optim/lr_vision": schedule.get_last_lr()[0],
                "optim/grad_norm": grad_norm,
                "time/step": time.perf_counter() - t0,
                "train/tokens": tok_sum,
                "train/skipped_steps": guard.total,
            }
            log.log(step, metrics)
            bar.set_postfix(loss=f"{metrics['loss/sft']:.3f}")
        if step % cfg.log_every == 0 or step == cfg.steps:
            loss_sum = 0.0
        if procs.all_forward and cfg.eval_every and val and step % cfg.eval_every == 0:
            res = evaluate(model, processor, val[: cfg.eval_examples], video, choice=False, progress=False)
            if procs.main:
                log.log(
                    step,
                    {
                        "eval/accuracy": res["accuracy"],
                        "eval/unparseable": res["unparseable"],
                        "time/elapsed": time.perf_counter() - t_start,
                    },
                )
                bar.write(f"sft step {step}: val accuracy {res['accuracy']:.3f}")
        if cfg.checkpoint_every and (step % cfg.checkpoint_every == 0 or step == cfg.steps):
            state = {"loss_sum": loss_sum, "tokens": tok_sum, "skipped": guard.total, "in_row": guard.in_row}
            procs.save_checkpoint(
                ckpt_dir, step, model, optimizer, schedule, state, config_yaml, cfg.keep_checkpoints
            )
    procs.barrier()
    model.eval()
    return {"steps": cfg.steps, "wall_s": time.perf_counter() - t_start, "skipped_steps": guard.total}
