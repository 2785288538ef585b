"""The sampling seam: every answer the framework generates comes from one engine interface.

GRPO's and expert iteration's rollouts (`embodied.rl.rollout.sample_groups`), multi-turn episodes
(`embodied.rl.episodes.Generate`), `embodied eval` (`embodied.eval.answerer.LocalAnswerer`), PAPO's
masked-input accuracy and the perception pretraining's caption scores all ask an `Engine` for completions of
`Prompts` drawn as a `Draw` says, and get `Samples` back. `rollout.engine` picks the engine:

* `hf` (`HFEngine`, the default): Hugging Face `generate` on the trained model itself, through the
  framework's shared-prefix loop (`embodied.policy.model.generate`). It is the policy, so there is nothing to
  sync and its samples' log-probs are the trainer's own.
* `vllm` (`embodied.policy.vllm_engine`): a vLLM engine in this process, synced with the policy's weights
  after every optimizer step; its own sampling log-probs travel with the samples.

The prompt batch is always the framework's own encoding (`encode_prompts`, `encode_conversations`): the
update scores exactly those ids and pixels, whichever engine sampled from them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from embodied.policy.model import decode, encode_prompts, eos_token_ids, generate, repeat_batch
from embodied.video import Clip, VideoConfig


@dataclass(frozen=True)
class Draw:
    """How an engine draws each row's completion: at most `max_new_tokens` tokens, greedy when `temperature`
    is None, else sampled at `temperature` (one number, or a `(B,)` tensor per row), each row from its own
    seed when `seeds` are given (else from torch's global generator), among the tokens of at least `min_p`
    times the top token's probability when `min_p` > 0."""

    max_new_tokens: int
    temperature: float | torch.Tensor | None = None
    seeds: Sequence[int] | None = None
    min_p: float = 0.0


@dataclass
class Prompts:
    """The rows an engine answers: the framework's encoded batch (what the update scores) and, per row, the
    record, clips and conversation it was encoded from (what an engine that encodes for itself reads)."""

    batch: Any
    """The encoded prompt batch (`encode_prompts`; a `GroupedBatch` when prompts repeat)."""
    records: list[dict] | None = None
    """Per row: its record (None: the batch alone, e.g. masked pixels no engine but `hf` can take)."""
    clips: list[list[Clip]] | None = None
    """Per row: the clip it shows, then each earlier turn's outcome clip."""
    history: list[list[tuple[str, str]]] | None = None
    """Per row: each earlier turn's `(answer, words of the turn after it)`; None: a first turn."""
    images: bool = False
    """The clips are shown as separate images (`eval.media=images`), not as one video."""
    video: VideoConfig | None = None
    """How the clips were sized for `batch` (None: the defaults)."""


@dataclass
class Samples:
    """An engine's completions of `Prompts`, one per row."""

    ids: torch.Tensor
    """`(B, T)` completion tokens, padded after the first end-of-turn token."""
    mask: torch.Tensor
    """`(B, T)` 1 on completion tokens (up to and including the end-of-turn token)."""
    texts: list[str]
    truncated: torch.Tensor
    """`(B,)` True where the completion hit `max_new_tokens` without an end-of-turn token."""
    logprobs: torch.Tensor | None = None
    """`(B, T)` the engine's own log-probs of the sampled tokens (0 past `mask`); None: the engine is the
    trained model (`hf`), whose log-probs the trainer computes itself."""
    version: int = 0
    """The policy version (optimizer steps synced into the engine) the samples were drawn at."""


class Engine(Protocol):
    """Where completions come from (see the module docstring)."""

    name: str
    """`rollout.engine`'s value for it."""

    def sample(self, prompts: Prompts, draw: Draw) -> Samples:
        """One completion per row of `prompts`."""
        ...

    def sync(self, model) -> dict[str, float]:
        """Make the engine sample from `model`'s current weights (after an optimizer step); returns what to
        log (`time/sync`, `rollout/policy_version`)."""
        ...


class HFEngine:
    """Hugging Face `generate` on the policy itself (`embodied.policy.model.generate`)."""

    name = "hf"

    def __init__(self, model, processor):
        self.model, self.processor = model, processor
        self.version = 0

    @torch.no_grad()
    def sample(self, prompts: Prompts, draw: Draw) -> Samples:
        batch, n = prompts.batch, draw.max_new_tokens
        if draw.temperature is None:
            ids, mask = generate(self.model, self.processor, batch, n, do_sample=False)
        else:
            args = (self.model, self.processor, batch, n, draw.temperature)
            ids, mask = generate(*args, do_sample=True, seeds=draw.seeds, min_p=draw.min_p)
        eos = torch.tensor(eos_token_ids(self.model, self.processor), device=ids.device)
        truncated = ~torch.isin(ids, eos).any(1)
        return Samples(ids, mask, decode(self.processor, ids, mask), truncated, version=self.version)

    def sync(self, model) -> dict[str, float]:
        # the engine is the policy: every optimizer step is already what it samples from
        self.version += 1
        return {}


def hf_engine(model, processor, engine: Engine | None = None) -> Engine:
    """`engine`, or the Hugging Face engine on `model` when None (every call site's default)."""
    return engine if engine is not None else HFEngine(model, processor)


def sync_engine(engine: Engine | None, model) -> dict[str, float]:
    """After an optimizer step: `engine` made to sample from `model`'s weights (its metrics); nothing to do
    without an engine (Hugging Face on the model itself)."""
    return {} if engine is None else engine.sync(model)


def repeat_prompts(prompts: Prompts, group: int) -> Prompts:
    """Each row of `prompts` repeated `group` times in a row (row `p * group + g` is member g of row p)."""

    def each(rows: list | None) -> list | None:
        return None if rows is None else [x for x in rows for _ in range(group)]

    batch, rows = repeat_batch(prompts.batch, group), (prompts.records, prompts.clips, prompts.history)
    return Prompts(batch, *(each(x) for x in rows), prompts.images, prompts.video)


def group_prompts(
    processor, records: Sequence[dict], clips: Sequence[Clip], video: VideoConfig, device, group: int
) -> Prompts:
    """The prompts of `records` shown with `clips`, encoded once each and repeated `group` times in a row."""
    batch = encode_prompts(processor, records, clips, video, device)
    return repeat_prompts(Prompts(batch, list(records), [[c] for c in clips], video=video), group)
