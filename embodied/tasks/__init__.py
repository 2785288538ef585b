"""Question families. Each module owns its generator and its verifier.

A record is one JSON line (see data/FORMAT.md): `id`, `task`, `video` or `images`, `question`, `options`,
`answer` (a letter), `meta`. The prompt format follows Cosmos-Reason1: the question, the options as
`(A) ...` lines, and an instruction to reason in `<think>` and answer in `<answer>`.
"""

from __future__ import annotations

import string
from collections.abc import Iterator, Sequence

LETTERS = string.ascii_uppercase

INSTRUCTION = (
    "Answer the question about the video. Reason inside <think></think>, "
    "then give only the letter of the correct option inside <answer></answer>."
)


ACTION_INSTRUCTION = (
    "Reason inside <think></think>, then give only the numbers asked for inside <answer></answer>."
)


def format_question(question: str, options: Sequence[str]) -> str:
    """The user turn's text: question, lettered options, answer-format instruction.

    A question without options (an interactive task asking for numbers) gets ACTION_INSTRUCTION instead.
    """
    instruction = INSTRUCTION if options else ACTION_INSTRUCTION
    lines = [question, *(f"({LETTERS[i]}) {opt}" for i, opt in enumerate(options)), instruction]
    return "\n".join(lines)


def format_response(reasoning: str, letter: str) -> str:
    """The target format of a response (used for SFT targets)."""
    return f"<think>{reasoning}</think><answer>{letter}</answer>"


def tokenizer_corpus() -> Iterator[str]:
    """Every fixed phrase the families write, for training the tiny model's tokenizer."""
    from embodied.tasks import arrow_of_time

    yield INSTRUCTION
    yield from arrow_of_time.phrases()


TASKS = ("arrow_of_time",)


def sft_target(record: dict, rationale: bool = False) -> str:
    """The SFT response for a record: `<think>` (the family's templated rationale, or empty), then the letter.

    The questions carry no human reasoning, so the default leaves `<think>` empty rather than teaching a
    canned sentence.
    """
    from embodied.tasks import arrow_of_time

    families = {arrow_of_time.NAME: arrow_of_time}
    if record["task"] not in families:
        raise KeyError(f"unknown task {record['task']!r}; known: {sorted(families)}")
    reasoning = families[record["task"]].reasoning_for(record) if rationale else ""
    return format_response(reasoning, record["answer"])
