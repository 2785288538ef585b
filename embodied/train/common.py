"""Small pieces both training loops share: seeding, batch order, the optimizer step."""

from __future__ import annotations

import random
from collections.abc import Iterator

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def index_batches(n: int, batch_size: int, seed: int) -> Iterator[list[int]]:
    """Endless batches of indices into `n` items: a fresh permutation every epoch, reproducible by seed.

    A batch never spans two epochs, so every item is seen once per epoch.
    """
    if n == 0:
        raise ValueError("no training examples")
    rng = np.random.default_rng(seed)
    batch_size = min(batch_size, n)
    while True:
        perm = rng.permutation(n)
        for i in range(0, n - batch_size + 1, batch_size):
            yield perm[i : i + batch_size].tolist()


def param_groups(model: torch.nn.Module, lr: float, vision_lr_scale: float = 1.0) -> list[dict]:
    """AdamW groups: the vision tower (with its merger) at `lr * vision_lr_scale`, the rest at `lr`."""
    vision, text = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (vision if ".visual." in f".{name}" else text).append(p)
    return [{"params": vision, "lr": lr * vision_lr_scale}, {"params": text, "lr": lr}]


class NonFiniteGuard:
    """Skips updates whose loss or gradient norm is not finite; stops the run after `limit` in a row."""

    def __init__(self, limit: int = 3):
        self.limit, self.in_row, self.total = limit, 0, 0

    def ok(self, loss: torch.Tensor, grad_norm: torch.Tensor, step: int) -> bool:
        if torch.isfinite(loss) and torch.isfinite(grad_norm):
            self.in_row = 0
            return True
        self.in_row += 1
        self.total += 1
        if self.in_row >= self.limit:
            raise FloatingPointError(
                f"step {step}: loss or gradient was not finite {self.limit} times in a row "
                f"(loss={loss.item()}, grad_norm={grad_norm.item()}); lower the lr or check the data"
            )
        return False


def optimizer_step(
    model, optimizer, loss, grad_clip: float, guard: NonFiniteGuard, step: int, backward=None
) -> float:
    """Backward (`backward(loss)`, default `loss.backward()`), clip, and step unless the loss or gradient
    is non-finite; returns the gradient norm."""
    optimizer.zero_grad(set_to_none=True)
    (backward or torch.Tensor.backward)(loss)
    return apply_gradients(model, optimizer, loss.detach(), grad_clip, guard, step)


def apply_gradients(model, optimizer, loss, grad_clip: float, guard: NonFiniteGuard, step: int) -> float:
    """Clip accumulated gradients; step unless `loss` or the gradient is non-finite; then clear them."""
    params = [p for p in model.parameters() if p.grad is not None]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else float("inf"))
    if guard.ok(torch.as_tensor(loss), grad_norm, step):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(grad_norm)


def skip_batches(order: Iterator[list[int]], n: int) -> Iterator[list[int]]:
    """Advance a batch stream by `n` batches (resuming at a saved data position)."""
    for _ in range(n):
        next(order)
    return order


class Processes:
    """This process's place in a multi-process run, and the few collectives the training loops need.

    Under `accelerate launch` (or `torchrun`) with N processes, every process draws the same global batch
    and trains on its slice `rank::N`; losses are normalised by whole-batch sizes (summed across
    processes) and multiplied by N, because DDP averages gradients: the summed gradient is then exactly
    the single-process one on the same global batch. In a plain run N = 1 and everything is the identity.
    `mixed_precision="bf16"` (GPU) wraps the forward pass in autocast with fp32 master weights.
    """

    def __init__(self, mixed_precision: str = "no", cpu: bool = True):
        from accelerate import Accelerator

        # cpu=True: processes launched by torchrun on CPU join a gloo group (accelerate's MULTI_CPU)
        self.accelerator = Accelerator(mixed_precision=mixed_precision, cpu=cpu)
        self.rank = self.accelerator.process_index
        self.world = self.accelerator.num_processes
        self.main = self.accelerator.is_main_process
        self.mixed_precision = mixed_precision

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module to run training forward passes through (DDP / autocast wrapper when needed)."""
        if self.world == 1 and self.mixed_precision == "no":
            return model
        return self.accelerator.prepare(model)

    def shard(self, items: list) -> list:
        if len(items) % self.world:
            raise ValueError(f"a global batch of {len(items)} does not split over {self.world} processes")
        return items[self.rank :: self.world]

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        return self.accelerator.reduce(x.detach().clone(), "sum") if self.world > 1 else x

    def reduce_metrics(self, metrics: dict, summed: tuple[str, ...] = ()) -> dict:
        """Metrics over all processes: keys starting with a prefix in `summed` are summed (each process
        holds its share), the rest averaged. Every process must call this at the same step."""
        if self.world == 1:
            return metrics
        keys = sorted(metrics)
        values = self.sum(torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64))
        return {k: v if k.startswith(summed) else v / self.world for k, v in zip(keys, values.tolist())}

    def backward(self, loss: torch.Tensor) -> None:
        self.accelerator.backward(loss * self.world)

    def barrier(self) -> None:
        if self.world > 1:
            self.accelerator.wait_for_everyone()
