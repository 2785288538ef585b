"""Every reward: the rules for multiple-choice answers, the simulator for interactive answers, the routing
between them, DAPO's overlong shaping, and `score`, which checks any reward function's output.

A response must look like `<think>...</think><answer>X</answer>` (Cosmos-Reason1). The accuracy reward is an
exact match of the letter inside the single `<answer>` block; an empty, missing or duplicated `<answer>`
earns nothing, so the policy cannot hedge by listing several letters. Ordering questions (temporal puzzles,
spatial-puzzle arrangements) can add partial credit for a wrong order that puts some pieces in place
(`partial_order_credit`, off by default); it is its own term, `reward/order_credit`, and never changes
`reward/accuracy`. An interactive answer is parsed by its task, executed in MuJoCo and scored by the
physical outcome as named terms.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import torch

from embodied.data.schema import kind
from embodied.envs import is_interactive
from embodied.envs.reward import ENV_FORMAT_WEIGHT, env_reward  # noqa: F401  (re-exported)
from embodied.questions import (  # noqa: F401  (parse_answer, option_orders re-exported)
    LETTERS,
    chosen_option,
    format_reward,
    is_letter,
    option_orders,
    parse_answer,
)


def accuracy_reward(text: str, answer: str, options: Sequence[str] | None = None) -> float:
    """1.0 when the answer block chooses the expected letter (the letter itself, or with `options` the
    right option's text, or on an ordering question the order nearest the right option's:
    `tasks.chosen_option`), else 0.0."""
    return 1.0 if chosen_option(text, options) == answer else 0.0


def partial_order_credit(chosen: Sequence[int], truth: Sequence[int], discount: float) -> float:
    """Partial credit for choosing the order `chosen` when `truth` is right: `discount` times the share of
    positions where the two orders agree, and 0 when they are equal (the right order earns the accuracy
    reward instead).

    Visual Jigsaw (Wu et al. 2025, "Visual Jigsaw Post-Training Improves MLLMs", arXiv:2509.25190, its
    reward function): an exact permutation earns 1, a valid but wrong one `gamma * (1/K) * sum_i 1[o_i = g_i]`
    with `gamma = 0.2`, anything else 0; so accuracy + this credit is their reward. Here the "permutation" is
    the order of the option the letter chooses (always valid). Their released scorer
    (penghao-wu/visual_jigsaw, `verl/utils/reward_score/visual_jigsaw.py`) grants the partial credit only for
    more than 4 pieces; here it applies to every order length.
    """
    if len(chosen) != len(truth):
        raise ValueError(f"orders of different lengths: {list(chosen)} vs {list(truth)}")
    if list(chosen) == list(truth):
        return 0.0
    same = sum(a == b for a, b in zip(chosen, truth))
    return discount * same / len(truth)


def order_credit_reward(text: str, answer: str, orders: Sequence[Sequence[int]], discount: float) -> float:
    """`partial_order_credit` of the option that `text`'s one `<answer>` chooses among `orders` (the
    question's options as orders, `answer` the right letter), by its letter or its order (`2, 3, 1`). A
    missing, empty or duplicated `<answer>`, or one that names no option, earns 0."""
    chosen = chosen_option(text, [", ".join(str(i) for i in order) for order in orders])
    if not is_letter(chosen, len(orders)):
        return 0.0
    return partial_order_credit(orders[LETTERS.index(chosen)], orders[LETTERS.index(answer)], discount)


def mcq_reward(
    text: str,
    answer: str,
    accuracy_weight: float = 1.0,
    format_weight: float = 0.5,
    order_credit: float = 0.0,
    orders: Sequence[Sequence[int]] | None = None,
    options: Sequence[str] | None = None,
) -> dict[str, float]:
    """Named reward terms for one response; `reward/total` is their weighted sum. With `options` (the
    question's option texts) an answer that spells an option's text counts as that option's letter.

    With `order_credit > 0` (the discount of `partial_order_credit`) every response also gets
    `reward/order_credit`: the partial credit of its chosen order when `orders` (the question's options as
    orders, `option_orders`) is given, else 0. It counts in the total at `accuracy_weight`, as a share of
    the accuracy reward; `reward/accuracy` stays 1 only for the right option.

    Both terms score the option the answer chooses (`tasks.chosen_option`), so on an ordering question an
    order that is no option earns what its nearest option earns, and nothing on a tie. Writing a wrong or
    malformed order therefore pays exactly what choosing that option by its letter pays, never more.
    """
    acc = accuracy_reward(text, answer, options)
    fmt = format_reward(text)
    terms = {"reward/accuracy": acc, "reward/format": fmt}
    credit = 0.0
    if order_credit > 0:
        credit = order_credit_reward(text, answer, orders, order_credit) if orders is not None else 0.0
        terms["reward/order_credit"] = credit
    terms["reward/total"] = accuracy_weight * (acc + credit) + format_weight * fmt
    return terms


def check_order_credit(discount: float) -> None:
    """Raise `ValueError` unless 0 <= `discount` < 1: a wrong order must earn less than the right one."""
    if not 0.0 <= discount < 1.0:
        raise ValueError(f"grpo.order_credit must be in [0, 1) (0 = off; Visual Jigsaw: 0.2), got {discount}")


def record_reward(
    text: str,
    record: dict,
    accuracy_weight: float = 1.0,
    format_weight: float = 0.5,
    order_credit: float = 0.0,
) -> dict[str, float]:
    """`mcq_reward` of `text` answering `record`, with the record's orders when partial credit is on."""
    orders = option_orders(record) if order_credit > 0 else None
    return mcq_reward(
        text, record["answer"], accuracy_weight, format_weight, order_credit, orders, record.get("options")
    )


# --- reward functions over a batch of completions ----------------------------------------------------

RewardFn = Callable[[list[str], list[dict]], list[dict[str, float]]]
"""`reward_fn(texts, records) -> terms`: one dict of named terms per completion, each with `reward/total`.

`records[i]` is the record completion `i` answers (the G completions of a group share one). A reward
function sees the whole batch at once, so a simulator can run every completion's world in one batch.
"""


class RewardError(RuntimeError):
    """A reward function raised, timed out or returned something unusable: the run stops; nothing scores 0."""


def mcq_rewards(
    accuracy_weight: float = 1.0, format_weight: float = 0.5, order_credit: float = 0.0
) -> RewardFn:
    """The rule-based MCQ reward (`mcq_reward`) as a batch `RewardFn`; `order_credit` > 0 adds partial credit
    on ordering questions (`partial_order_credit`)."""
    check_order_credit(order_credit)

    def reward_fn(texts: list[str], records: list[dict]) -> list[dict[str, float]]:
        return [
            record_reward(t, r, accuracy_weight, format_weight, order_credit) for t, r in zip(texts, records)
        ]

    return reward_fn


def routed_rewards(
    backend: str = "cpu",
    env_format_weight: float = ENV_FORMAT_WEIGHT,
    accuracy_weight: float = 1.0,
    format_weight: float = 0.5,
    order_credit: float = 0.0,
) -> RewardFn:
    """One batch reward for any mix of records: physics (`env_reward`) for interactive ones, rules
    (`mcq_reward`, with `order_credit` on ordering questions) for MCQs. Interactive completions of a call are
    executed together (one Warp batch per task on `warp`)."""
    check_order_credit(order_credit)

    def reward_fn(texts: list[str], records: list[dict]) -> list[dict[str, float]]:
        env_idx = [i for i, r in enumerate(records) if is_interactive(r)]
        out: list[dict[str, float]] = [{} for _ in texts]
        sim = (
            env_reward([texts[i] for i in env_idx], [records[i] for i in env_idx], backend, env_format_weight)
            if env_idx
            else []
        )
        for i, terms in zip(env_idx, sim):
            out[i] = terms
        for i, (text, rec) in enumerate(zip(texts, records)):
            if not is_interactive(rec):
                out[i] = record_reward(text, rec, accuracy_weight, format_weight, order_credit)
        return out

    return reward_fn


def rewards_for(cfg) -> RewardFn:
    """The training reward a whole config (`embodied.config.Config`) asks for: `routed_rewards` with the
    physics backend and format weight of `cfg.env` and the MCQ weights and partial credit of `cfg.grpo`, so
    one command trains on questions, interactive episodes or a mix of both."""
    g = cfg.grpo
    return routed_rewards(
        cfg.env.backend, cfg.env.format_weight, g.accuracy_weight, g.format_weight, g.order_credit
    )


def score(reward_fn: RewardFn, texts: list[str], records: list[dict], timeout_s: float | None = 60.0):
    """Call `reward_fn` and check its output; any failure is a `RewardError` naming what was being scored.

    A raising or hanging reward function must never turn into a reward of 0: that would silently train the
    policy towards whatever made the scorer fail. `timeout_s` bounds one call (None = no limit); a timed-out
    call keeps running in its thread, but the run stops.
    """
    ids = sorted({str(r.get("id", "?")) for r in records})
    kinds = sorted({str(kind(r, "?")) for r in records})
    where = f"{kinds}, records {ids[:5]}{' ...' if len(ids) > 5 else ''}"
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


Shaping = Callable[[list[dict[str, float]], torch.Tensor, torch.Tensor], None]
"""`shaping(terms, lengths, truncated)` adds its named terms to each completion's terms (and to its
`reward/total`) in place, from the `(B,)` completion lengths and truncation flags."""


def overlong_shaping(max_len: int, mode: str = "off", buffer: int = 0, weight: float = 1.0) -> Shaping | None:
    """DAPO's overlong shaping as a `Shaping` (`reward/overlong`, weighted by `weight`): `hard` gives every
    truncated answer -1, `soft` also ramps down over the last `buffer` tokens; `off` gives None."""
    if mode == "off":
        return None
    if mode not in ("hard", "soft"):
        raise ValueError(f"overlong mode {mode!r}; choose off, hard or soft")

    def shaping(terms: list[dict[str, float]], lengths: torch.Tensor, truncated: torch.Tensor) -> None:
        # a truncated answer would have gone on: it counts as longer than the budget
        lengths = torch.where(truncated, max_len + 1, lengths)
        penalty = overlong_penalty(lengths, max_len, buffer if mode == "soft" else 0).tolist()
        for t, p in zip(terms, penalty):
            t["reward/overlong"] = p
            t["reward/total"] += weight * p

    return shaping
