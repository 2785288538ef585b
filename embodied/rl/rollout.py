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
from embodied.policy.model import decode, encode_prompts, eos_token_ids, generate, repeat_batch
from embodied.rl.rewards import RewardFn, Shaping, score
from embodied.video import VideoConfig


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
    keep_prefix: bool = False,
) -> Rollout:
    """Sample `sampling.group_size` answers per example, at most `sampling.max_new_tokens` each, and score
    them (`Sampling`).

    With `seeds` (one per example), answer g to example i is drawn with `sampling_seed(seeds[i], g)`: a
    function of that seed and the prompt alone, so splitting prompts across processes changes nothing.
    `keep_prefix`: the sampler's pass over the prompts runs with gradients and stays on the rollout's batch
    for an update with the same weights to take (`embodied.policy.groups`).
    """
    G, max_new_tokens, shaping = sampling.group_size, sampling.max_new_tokens, sampling.shaping
    device = next(model.parameters()).device
    records = [e.record for e in examples]
    prompts = encode_prompts(processor, records, [e.clip for e in examples], video, device)
    batch = repeat_batch(prompts, G)
    batch.keep_prefix = keep_prefix
    temps = member_temperatures(sampling.temperature, list(sampling.temperatures), len(examples), G)
    temps = temps.to(device)
    model.eval()
    rows = None if seeds is None else [sampling_seed(s, g) for s in seeds for g in range(G)]
    ids, mask = generate(model, processor, batch, max_new_tokens, temps, seeds=rows)
    texts = decode(processor, ids, mask)
    ended = torch.isin(ids, torch.tensor(eos_token_ids(model, processor), device=ids.device)).any(1)
    truncated = ~ended
    terms = score(reward_fn, texts, [records[i // G] for i in range(len(texts))], sampling.timeout_s)
    if shaping is not None:
        shaping(terms, mask.sum(1).cpu(), truncated.cpu())
    rewards = torch.tensor([t["reward/total"] for t in terms], device=device).view(len(examples), G)
    return Rollout(list(examples), batch, ids, mask, temps, texts, terms, rewards, truncated)


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
    return Rollout(examples, batch, cat(ids), cat(mask), cat(temps), texts, terms, cat(rewards), cat(trunc))


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
