"""Small pieces both training loops share: seeding, batch order, the optimizer step (multi-process runs:
`embodied.train.distributed`)."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from typing import TypeVar

import numpy as np
import torch

from embodied.policy.architectures import architecture_of

T = TypeVar("T")


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


def with_last(items: Iterable[T]) -> Iterator[tuple[T, bool]]:
    """Each item with whether it is the last one (a generator is read one item ahead, not all at once)."""
    it = iter(items)
    try:
        item = next(it)
    except StopIteration:
        return
    for following in it:
        yield item, False
        item = following
    yield item, True


def param_groups(model: torch.nn.Module, lr: float, vision_lr_scale: float = 1.0) -> list[dict]:
    """AdamW groups: the vision tower (with its merger) at `lr * vision_lr_scale`, the rest at `lr`."""
    vision, text = [], []
    family = architecture_of(model)
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (vision if family.is_vision(name) else text).append(p)
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

    def state(self) -> dict:
        """What a checkpoint saves of the guard."""
        return {"skipped": self.total, "in_row": self.in_row}

    def load(self, saved: dict) -> None:
        """Restore `state()` from a checkpoint's counters."""
        self.total, self.in_row = saved["skipped"], saved["in_row"]


def apply_gradients(model, optimizer, loss, grad_clip: float, guard: NonFiniteGuard, step: int) -> float:
    """Clip accumulated gradients; step unless `loss` or the gradient is non-finite; then clear them."""
    params = [p for p in model.parameters() if p.grad is not None]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else float("inf"))
    if hasattr(grad_norm, "full_tensor"):  # FSDP: a DTensor holding the norm over all shards
        grad_norm = grad_norm.full_tensor()
    if guard.ok(torch.as_tensor(loss), grad_norm, step):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(grad_norm)


def skip_batches(order: Iterator[list[int]], n: int) -> Iterator[list[int]]:
    """Advance a batch stream by `n` batches (resuming at a saved data position)."""
    for _ in range(n):
        next(order)
    return order
