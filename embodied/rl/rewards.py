"""Rule-based rewards for multiple-choice answers (Cosmos-Reason1 format).

A response must look like `<think>...</think><answer>X</answer>`. The accuracy reward is an exact
match of the letter inside the single `<answer>` block; an empty, missing or duplicated `<answer>`
earns nothing, so the policy cannot hedge by listing several letters.
"""

from __future__ import annotations

import re

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
# One think block, then one answer block, nothing else but whitespace; no nested or repeated tags.
_FORMAT = re.compile(
    r"\s*<think>(?:(?!</?think>|</?answer>).)*</think>\s*<answer>(?:(?!</?answer>|</?think>).)*</answer>\s*",
    re.S,
)


def parse_answer(text: str) -> str | None:
    """The stripped content of the one `<answer>` block, or None if there is not exactly one non-empty one."""
    if text.count("<answer>") != 1 or text.count("</answer>") != 1:
        return None
    m = _ANSWER.search(text)
    if m is None:
        return None
    content = m.group(1).strip()
    return content or None


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
