"""Rollouts: G sampled answers per prompt, scored (reward shaping included), with DAPO's dynamic sampling.

A `Rollout` is flat and prompt-major: row `p * G + g` is answer `g` to prompt `p`. Everything the update
needs travels with it (prompt batch, completions, per-row temperatures, rewards, truncation flags), so
the update never goes back to the data.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from embodied.data.load import Example
from embodied.policy.groups import PromptPass
from embodied.policy.model import (
    completion_outputs,
    encode_prompts,
    repeat_batch,
    select_rows,
    vision_token_ids,
)
from embodied.policy.sampling import Draw, Engine, group_prompts, hf_engine
from embodied.rl.rewards import RewardFn, Shaping, score
from embodied.video import VideoConfig


def micro_batches(rows: int, size: int, lengths: Sequence[int] | None = None) -> list[list[int]]:
    """Row indices of micro-batches of at most `size` rows (0, or `size` >= `rows`: one batch of all rows,
    in order). With `lengths` (one per row), rows are taken shortest first, so that each micro-batch holds
    rows of similar length (ties keep their order)."""
    if rows == 0:
        return []
    if size <= 0 or size >= rows:
        return [list(range(rows))]
    order = sorted(range(rows), key=lambda i: lengths[i]) if lengths is not None else list(range(rows))
    return [order[start : start + size] for start in range(0, rows, size)]


@torch.no_grad()
def rollout_logprobs(model, ro: Rollout, micro_batch_size: int = 0, value_head=None, suppress=()):
    """`(P * G, T)` log-probs of the rollout's tokens under `model`, in micro-batches, without grad; with
    `value_head`, `(log-probs, values)` from the same pass (values float32); `suppress`: token ids left out
    of the softmax (`completion_logprobs`)."""
    logp, values = [], []
    for idx in micro_batches(ro.ids.shape[0], micro_batch_size):
        sub, ids, mask, temp = select_rows(ro.batch, idx), ro.ids[idx], ro.mask[idx], ro.temperature[idx]
        out = completion_outputs(model, sub, ids, mask, temp, value_head=value_head, suppress=suppress)
        logp.append(out.logp)
        values.append(out.values)
    if value_head is None:
        return torch.cat(logp)
    return torch.cat(logp), torch.cat(values).float()


@dataclass
class Rollout:
    examples: list[Example]
    """The P prompts' examples."""
    batch: dict
    """The prompt batch, each prompt repeated G times in a row (P * G rows)."""
    ids: torch.Tensor
    """`(P * G, T)` sampled completion tokens, padded after the first end-of-turn token."""
    mask: torch.Tensor
    """`(P * G, T)` 1 on completion tokens (up to and including the end-of-turn token)."""
    temperature: torch.Tensor
    """`(P * G,)` each row's sampling temperature."""
    texts: list[str]
    terms: list[dict[str, float]]
    """Named reward terms per row."""
    rewards: torch.Tensor
    """`(P, G)` total rewards."""
    truncated: torch.Tensor
    """`(P * G,)` True where generation hit the token budget without an end-of-turn token."""
    owner: torch.Tensor | None = None
    """Multi-turn episodes (`embodied.rl.episodes`): `(B,)` each row's trajectory, an index into
    `rewards.flatten()` (its tokens get that trajectory's advantage); rows are then turn 1's `P * G`, then
    the later turns'. None: one row per trajectory, row i is trajectory i."""
    turn: torch.Tensor | None = None
    """Multi-turn: `(B,)` the turn (1, 2, ...) of each row."""
    clips: list | None = None
    """Multi-turn: per trajectory, the episode's clip, then the outcome clip of each later turn."""
    stats: dict = field(default_factory=dict)
    """Multi-turn: per-step statistics of the trajectories (`turns/success@k`, ...), logged as metrics."""
    engine_logprobs: torch.Tensor | None = None
    """`(P * G, T)` the sampling engine's own log-probs of `ids` (0 past `mask`); None: the engine was the
    trained model (`rollout.engine=hf`), so the trainer's log-probs are the sampler's."""
    version: int = 0
    """The policy version (optimizer steps synced into the engine) the rollout was sampled at."""

    @property
    def group_size(self) -> int:
        return self.rewards.shape[1]


@dataclass(frozen=True)
class Sampling:
    """How a rollout samples and scores its answers (`sample_groups`, `episodes.sample_episodes`,
    `episodes.play`): `group_size` answers per prompt of at most `max_new_tokens` tokens each. Member g of
    every group samples at `temperatures[g % len]` (all at `temperature` when empty). `shaping` (e.g.
    `rewards.overlong_shaping`) adds its terms to the reward; `timeout_s` bounds one reward call."""

    group_size: int = 1
    max_new_tokens: int = 48
    temperature: float = 1.0
    temperatures: Sequence[float] = ()
    shaping: Shaping | None = None
    timeout_s: float | None = 60.0


def member_temperatures(
    temperature: float, schedule: Sequence[float], n_prompts: int, G: int
) -> torch.Tensor:
    """`(n_prompts * G,)`: member g of every group samples at `schedule[g % len(schedule)]`, or all at
    `temperature` when the schedule is empty (a spread of temperatures diversifies a group's answers)."""
    per_member = [schedule[g % len(schedule)] if schedule else temperature for g in range(G)]
    if min(per_member) <= 0:
        raise ValueError(f"sampling temperatures must be > 0, got {per_member}")
    return torch.tensor(per_member * n_prompts)


def sampling_seed(*keys: int) -> int:
    """A 63-bit seed derived from integer keys (e.g. run seed, draw, prompt index, group member)."""
    return int(np.random.SeedSequence([int(k) for k in keys]).generate_state(2, np.uint64)[0] >> np.uint64(1))


@torch.no_grad()
def sample_groups(
    model,
    processor,
    examples: Sequence[Example],
    video: VideoConfig,
    reward_fn: RewardFn,
    sampling: Sampling,
    seeds: Sequence[int] | None = None,
    prompt_pass: PromptPass | None = None,
    engine: Engine | None = None,
) -> Rollout:
    """Sample `sampling.group_size` answers per example, at most `sampling.max_new_tokens` each, and score
    them (`Sampling`).

    With `seeds` (one per example), answer g to example i is drawn with `sampling_seed(seeds[i], g)`: a
    function of that seed and the prompt alone, so splitting prompts across processes changes nothing.
    `prompt_pass`: where the sampler leaves its pass over the prompts, run with gradients, for an update at
    the same weights to take (`embodied.policy.groups`; GRPO's step owns it); None: nothing is kept. `engine`
    samples (None: Hugging Face on `model`, `embodied.policy.sampling`); its log-probs and policy version
    travel with the rollout.
    """
    G, shaping = sampling.group_size, sampling.shaping
    device = next(model.parameters()).device
    records = [e.record for e in examples]
    prompts = group_prompts(processor, records, [e.clip for e in examples], video, device, G)
    prompts.batch.prompt_pass = prompt_pass
    temps = member_temperatures(sampling.temperature, list(sampling.temperatures), len(examples), G)
    temps = temps.to(device)
    model.eval()
    rows = None if seeds is None else [sampling_seed(s, g) for s in seeds for g in range(G)]
    out = hf_engine(model, processor, engine).sample(prompts, Draw(sampling.max_new_tokens, temps, rows))
    ids, mask, texts, truncated = out.ids, out.mask, out.texts, out.truncated
    terms = score(reward_fn, texts, [records[i // G] for i in range(len(texts))], sampling.timeout_s)
    if shaping is not None:
        shaping(terms, mask.sum(1).cpu(), truncated.cpu())
    rewards = torch.tensor([t["reward/total"] for t in terms], device=device).view(len(examples), G)
    ro = Rollout(list(examples), prompts.batch, ids, mask, temps, texts, terms, rewards, truncated)
    ro.engine_logprobs, ro.version = out.logprobs, out.version
    return ro


def engine_drift(trainer: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """How far the sampling engine's log-probs `engine` `(B, T)` are from the trainer's `trainer` `(B, T)` on
    the same tokens at the same weights, over the completion tokens (`mask`): the mean and max of
    |engine - trainer| and the mean importance ratio exp(trainer - engine), 1 for a faithful engine (TRL
    #5312's stale engine read about 3e-7)."""
    m = mask.bool()
    gap = trainer[m].double() - engine[m].double()
    if not gap.numel():
        return {}
    return {
        "rollout/logprob_diff": float(gap.abs().mean()),
        "rollout/logprob_diff_max": float(gap.abs().max()),
        "rollout/importance_ratio": float(gap.exp().mean()),
    }


def engine_metrics(model, processor, ro: Rollout, micro_batch_size: int = 0) -> dict[str, float]:
    """`engine_drift` of a rollout sampled by an engine with its own log-probs (`rollout.engine=vllm`),
    against `model`'s for the distribution it drew from (the vision placeholders, never sampled, left out),
    before any update on it; {} for the Hugging Face engine (the trainer sampled)."""
    if ro.engine_logprobs is None:
        return {}
    trainer = rollout_logprobs(model, ro, micro_batch_size, suppress=vision_token_ids(processor))
    return engine_drift(trainer, ro.engine_logprobs, ro.mask) | {"rollout/policy_version": float(ro.version)}


def merge(parts: Sequence[Rollout], keep: Sequence[Sequence[int]], processor, video: VideoConfig) -> Rollout:
    """One rollout from the groups `keep[i]` of `parts[i]`; prompts are re-encoded, completions re-padded."""
    G = parts[0].group_size
    pad = processor.tokenizer.pad_token_id
    width = max(p.ids.shape[1] for p in parts)
    examples, ids, mask, temps, texts, terms, rewards, trunc = [], [], [], [], [], [], [], []
    for part, groups in zip(parts, keep):
        rows = [p * G + g for p in groups for g in range(G)]
        examples += [part.examples[p] for p in groups]
        extra = width - part.ids.shape[1]
        ids.append(torch.nn.functional.pad(part.ids[rows], (0, extra), value=pad))
        mask.append(torch.nn.functional.pad(part.mask[rows], (0, extra), value=0))
        temps.append(part.temperature[rows])
        texts += [part.texts[r] for r in rows]
        terms += [part.terms[r] for r in rows]
        rewards.append(part.rewards[list(groups)])
        trunc.append(part.truncated[rows])
    device = parts[0].ids.device
    records, clips = [e.record for e in examples], [e.clip for e in examples]
    batch = repeat_batch(encode_prompts(processor, records, clips, video, device), G)
    cat = torch.cat
    out = Rollout(examples, batch, cat(ids), cat(mask), cat(temps), texts, terms, cat(rewards), cat(trunc))
    if all(p.engine_logprobs is not None for p in parts):  # the sampler's log-probs, padded like the ids
        lps = [p.engine_logprobs[[q * G + g for q in k for g in range(G)]] for p, k in zip(parts, keep)]
        out.engine_logprobs = cat([torch.nn.functional.pad(x, (0, width - x.shape[1])) for x in lps])
        out.version = parts[-1].version
    return out


def dynamic_sample(
    draw: Callable[[], Rollout], n_groups: int, max_rounds: int, processor, video: VideoConfig
) -> tuple[Rollout | None, dict[str, float]]:
    """DAPO's dynamic sampling (Yu et al. 2025, Sec. 3.2): keep only groups whose rewards are not all
    equal (they carry zero advantage) and draw more prompts until `n_groups` are kept or `max_rounds`
    rounds were drawn. Returns the kept groups (at most `n_groups`; None if no round had any spread)."""
    parts, keep, kept, rounds = [], [], 0, 0
    while kept < n_groups and rounds < max_rounds:
        part = draw()
        rounds += 1
        spread = (part.rewards.max(1).values > part.rewards.min(1).values).nonzero().flatten().tolist()
        take = spread[: n_groups - kept]
        if take:
            parts.append(part)
            keep.append(take)
            kept += len(take)
    stats = {"sampling/rounds": rounds, "sampling/kept_groups": kept}
    return (merge(parts, keep, processor, video) if parts else None), stats
