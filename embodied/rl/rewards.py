"""Rule-based rewards for multiple-choice answers (Cosmos-Reason1 format).

A response must look like `<think>...</think><answer>X</answer>`. The accuracy reward is an exact
match of the letter inside the single `<answer>` block; an empty, missing or duplicated `<answer>`
earns nothing, so the policy cannot hedge by listing several letters.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import torch

from embodied.tasks import parse_answer

# One think block, then one answer block, nothing else but whitespace; no nested or repeated tags.
_FORMAT = re.compile(
    r"\s*<think>(?:(?!</?think>|</?answer>).)*</think>\s*<answer>(?:(?!</?answer>|</?think>).)*</answer>\s*",
    re.S,
)


def accuracy_reward(text: str, answer: str) -> float:
    """1.0 when the answer block holds exactly the expected letter, else 0.0."""
    return 1.0 if parse_answer(text) == answer else 0.0


def format_reward(text: str) -> float:
    """1.0 for exactly `<think>...</think><answer>...</answer>` (whitespace allowed between), else 0.0."""
    return 1.0 if _FORMAT.fullmatch(text) and parse_answer(text) is not None else 0.0


def mcq_reward(
    text: str, answer: str, accuracy_weight: float = 1.0, format_weight: float = 0.5
) -> dict[str, float]:
    """Named reward terms for one response; `reward/total` is their weighted sum."""
    acc = accuracy_reward(text, answer)
    fmt = format_reward(text)
    return {
        "reward/accuracy": acc,
        "reward/format": fmt,
        "reward/total": accuracy_weight * acc + format_weight * fmt,
    }


# --- reward functions over a batch of completions ----------------------------------------------------

RewardFn = Callable[[list[str], list[dict]], list[dict[str, float]]]
"""`reward_fn(texts, records) -> terms`: one dict of named terms per completion, each with `reward/total`.

`records[i]` is the record completion `i` answers (the G completions of a group share one). A reward
function sees the whole batch at once, so a simulator can run every completion's world in one batch.
"""


class RewardError(RuntimeError):
    """A reward function raised, timed out or returned something unusable: the run stops; nothing scores 0."""


def mcq_rewards(accuracy_weight: float = 1.0, format_weight: float = 0.5) -> RewardFn:
    """The rule-based MCQ reward (`mcq_reward`) as a batch `RewardFn`."""

    def reward_fn(texts: list[str], records: list[dict]) -> list[dict[str, float]]:
        return [mcq_reward(t, r["answer"], accuracy_weight, format_weight) for t, r in zip(texts, records)]

    return reward_fn


def score(reward_fn: RewardFn, texts: list[str], records: list[dict], timeout_s: float | None = 60.0):
    """Call `reward_fn` and check its output; any failure is a `RewardError` naming what was being scored.

    A raising or hanging reward function must never turn into a reward of 0: that would silently train the
    policy towards whatever made the scorer fail. `timeout_s` bounds one call (None = no limit); a timed-out
    call keeps running in its thread, but the run stops.
    """
    ids = sorted({str(r.get("id", "?")) for r in records})
    tasks = sorted({str(r.get("task", "?")) for r in records})
    where = f"tasks {tasks}, records {ids[:5]}{' ...' if len(ids) > 5 else ''}"
    name = getattr(reward_fn, "__qualname__", repr(reward_fn))
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward")
    try:
        terms = pool.submit(reward_fn, list(texts), list(records)).result(timeout=timeout_s)
    except FutureTimeout:
        raise RewardError(f"reward function {name} timed out after {timeout_s} s on {where}") from None
    except Exception as e:
        raise RewardError(f"reward function {name} raised {type(e).__name__}: {e} on {where}") from e
    finally:
        pool.shutdown(wait=False)
    if not isinstance(terms, list) or len(terms) != len(texts):
        got = len(terms) if isinstance(terms, list) else type(terms).__name__
        raise RewardError(f"reward function {name} returned {got} results for {len(texts)} completions")
    for i, t in enumerate(terms):
        total = t.get("reward/total") if isinstance(t, dict) else None
        if not isinstance(total, (int, float)) or not math.isfinite(total):
            raise RewardError(
                f"reward function {name} gave completion {i} (record {records[i].get('id', '?')}) "
                f"no finite 'reward/total': {t!r}"
            )
    return terms


def mean_terms(terms: list[dict[str, float]]) -> dict[str, float]:
    """Mean of each named term over the completions that report it (a mixed batch has several kinds)."""
    keys = dict.fromkeys(k for t in terms for k in t)
    return {k: sum(t[k] for t in terms if k in t) / sum(k in t for t in terms) for k in keys}


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int = 0) -> torch.Tensor:
    """DAPO's overlong reward shaping (Yu et al. 2025, Eq. 13), `(B,)` lengths -> `(B,)` penalties in [-1, 0].

    0 up to `max_len - buffer` tokens, then linear down to -1 at `max_len`; -1 beyond it. A completion that
    hit the generation budget without ending counts as longer than `max_len` (pass `max_len + 1` for it),
    so `buffer=0` is the hard penalty: -1 for every truncated completion, 0 otherwise.
    """
    if buffer < 0 or buffer >= max_len:
        raise ValueError(f"overlong buffer must be in [0, max_len), got {buffer} (max_len {max_len})")
    lengths = lengths.float()
    start = max_len - buffer
    soft = (start - lengths) / buffer if buffer else torch.zeros_like(lengths)
    return torch.where(lengths <= start, 0.0, torch.where(lengths <= max_len, soft, -1.0))
