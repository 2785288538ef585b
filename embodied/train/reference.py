"""GRPO's and PPO's KL reference: the policy as it was when the run began, held as cheaply as it can be.

With full fine-tuning the reference is a frozen copy of the policy (a second set of weights). Under LoRA
only the adapters train, so the policy at the start is the live model with its adapters off (or with a
frozen snapshot of them, when an earlier stage in the same process had trained them): the reference costs
no copy of the base weights (`embodied.policy.lora.FrozenAdapters`). For a 3B policy in bfloat16 that is
7 GiB less, and `embodied.policy.fits` plans it so.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from embodied.policy.lora import FrozenAdapters, has_lora
from embodied.train.distributed import Processes


class Reference:
    """The frozen reference policy of the KL term; `with ref.active() as model:` gives a module to score
    with (no gradients are needed through it)."""

    def __init__(self, model: torch.nn.Module, procs: Processes):
        self.adapters = FrozenAdapters(model) if has_lora(model) else None
        self.copy = None
        if self.adapters is None:
            self.copy = procs.wrap_frozen(copy.deepcopy(model).eval().requires_grad_(False))

    @property
    def shares_weights(self) -> bool:
        """Whether the reference is the policy's own weights with its adapters off (no second copy)."""
        return self.adapters is not None

    @contextmanager
    def active(self) -> Iterator[torch.nn.Module]:
        if self.adapters is None:
            yield self.copy
            return
        with self.adapters.active() as model:
            yield model
