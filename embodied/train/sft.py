"""Supervised fine-tuning: teach the answer format and the first physical intuitions.

Targets are `<think>...</think><answer>X</answer>` (`tasks.sft_target`); the loss is the mean negative
log-likelihood over all target tokens of the batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from embodied.data.schema import kind
from embodied.envs import is_interactive, random_answer
from embodied.policy.model import (
    completion_logprobs,
    encode_completions,
    encode_examples,
    end_of_turn,
    select_rows,
    trim_left_padding,
)
from embodied.questions import LETTERS, family_names, is_family, sft_target
from embodied.rl.rollout import micro_batches
from embodied.train.common import (
    NonFiniteGuard,
    apply_gradients,
    index_batches,
    param_groups,
    skip_batches,
    with_last,
)
from embodied.train.config import SFTConfig
from embodied.train.distributed import Processes
from embodied.train.metrics import MetricsLog
from embodied.train.runner import Cadence, Runner
from embodied.train.state import Run


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
    validation (on the processes that validate), e.g. to keep a snapshot of the model. The run stops early
    at `cfg.stop_at` validation accuracy or after `cfg.max_seconds` (`embodied.train.runner.Cadence`).
    """
    procs, cadence = run.procs or Processes(), Cadence.of(cfg)
    log = MetricsLog(run.out_dir / "metrics.jsonl", "sft")
    algo = SFT.build(cfg, run, procs, target_fn)
    return Runner.build(algo, run, cadence, procs, log, on_validate).run_steps()


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


@dataclass
class SFT:
    """The SFT step (`embodied.train.runner.Algorithm`): the policy as the loss sees it (`net`, wrapped under
    DDP or FSDP), its device, the batch order, the optimizer and its learning-rate schedule (a fresh pair at
    the start of each `restart_every` cycle), and the loss and token counts its logs and checkpoints carry."""

    cfg: SFTConfig
    run: Run
    procs: Processes
    net: torch.nn.Module
    device: torch.device
    order: Iterator[list[int]]
    cycle: int
    optimizer: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LambdaLR
    target_fn: Callable[[dict], str] | None = None
    guard: NonFiniteGuard = field(default_factory=NonFiniteGuard)
    loss_sum: float = 0.0
    tokens: int = 0
    grad_norm: float = 0.0
    stage, title, unit, modules = "sft", "SFT", "step", None

    @classmethod
    def build(cls, cfg: SFTConfig, run: Run, procs: Processes, target_fn=None) -> SFT:
        """Check the settings, wrap the model, draw the batch order, make the first optimizer."""
        if cfg.targets not in ("answer", "format"):
            raise ValueError(f"sft.targets={cfg.targets!r}; choose answer or format")
        if cfg.micro_batch_size < 0:
            raise ValueError(f"sft.micro_batch_size={cfg.micro_batch_size}; use 0 (the whole batch) or more")
        model = run.model
        net, device = procs.wrap(model), next(model.parameters()).device
        model.train()
        cycle = cfg.restart_every if cfg.restart_every > 0 else cfg.steps
        order = index_batches(len(run.train), cfg.batch_size, run.seed)
        optimizer, schedule = _fresh_optimizer(model, cfg, cycle)
        return cls(cfg, run, procs, net, device, order, cycle, optimizer, schedule, target_fn)

    def state(self) -> dict:
        """The counters a checkpoint saves."""
        return {"loss_sum": self.loss_sum, "tokens": self.tokens} | self.guard.state()

    def load(self, state: dict) -> None:
        """The guard and counters of an SFT checkpoint (the runner loaded the weights, the optimizer and the
        schedule into `build`'s fresh pair); the batch order skips the batches already trained on."""
        self.loss_sum, self.tokens = state["loss_sum"], state["tokens"]
        self.guard.load(state)
        self.order = skip_batches(self.order, state["step"])

    def step(self, step: int) -> None:
        """One optimizer step on the next batch (a fresh optimizer at the start of each cycle)."""
        if (step - 1) % self.cycle == 0 and step > 1:  # each warm restart (step 1's was made by `build`)
            self.optimizer, self.schedule = _fresh_optimizer(self.run.model, self.cfg, self.cycle)
        self.grad_norm = self.train_step(step)

    def train_step(self, step: int) -> float:
        """One optimizer step on the next batch (this process's slice): its targets, the loss accumulated
        over micro-batches, the guarded step; returns the gradient norm."""
        cfg, procs, processor, device = self.cfg, self.procs, self.run.processor, self.device
        target_fn = self.target_fn
        chunk = [self.run.train[i] for i in procs.shard(next(self.order))]
        records = [e.record for e in chunk]
        batch = encode_examples(processor, chunk, self.run.video, device)
        targets = (
            [target_fn(r) for r in records] if target_fn else sft_targets(records, cfg, self.run.seed, step)
        )
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
        grad_norm = apply_gradients(self.run.model, self.optimizer, loss, cfg.grad_clip, self.guard, step)
        self.schedule.step()
        self.loss_sum += procs.sum(loss.detach()).item()
        self.tokens += int(tokens)
        return grad_norm

    def report(self, step: int, due: bool, step_s: float) -> dict:
        """Every `log_every` steps (and the last): the mean loss since the last row, the learning rates, the
        gradient norm, the step's seconds and the counts."""
        if not due:
            return {}
        cfg = self.cfg
        n = cfg.log_every if step % cfg.log_every == 0 else (step - 1) % cfg.log_every + 1
        lrs = self.schedule.get_last_lr()
        row = {
            "loss/sft": self.loss_sum / n,
            "optim/lr": lrs[1],
            "optim/lr_vision": lrs[0],
            "optim/grad_norm": self.grad_norm,
            "time/step": step_s,
            "train/tokens": self.tokens,
            "train/skipped_steps": self.guard.total,
        }
        self.loss_sum = 0.0
        return row

    def postfix(self, row: dict) -> dict:
        return {"loss": f"{row['loss/sft']:.3f}"}

    def summary(self) -> dict:
        return {"skipped_steps": self.guard.total}
