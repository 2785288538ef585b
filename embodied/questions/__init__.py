"""Question families. Each module owns its generator and its verifier.

A record is one JSON line (see data/FORMAT.md): `id`, `family`, `video` or `images`, `question`, `options`,
`answer` (a letter), `meta`. The prompt format follows Cosmos-Reason1: the question, the options as
`(A) ...` lines, and an instruction to reason in `<think>` and answer in `<answer>`.

A family is one module that follows `PROTOCOL` (`embodied/questions/protocol.py` says what it must define and
what it may): `NAME`, `VERSION` (bumped whenever what it generates for a seed changes), `num_options(tier,
variant)`, `make(world, rng, answer, tier, fam, clip) -> (record, frames)` for simulated scenes, a
`verify(...)` that checks the recorded answer is the one right option against the ground truth (the
unshuffled original, or the simulated outcome), `reasoning_for(record)` (templated SFT rationale) and
`trace_for(record)` (the simulator-derived SFT trace of `sft.rationale=trace`, from the record's meta); and
optional `HOOKS` with defaults, such as `from_frames(frames, fps, rng, answer, tier, fam)` for families that
work on any footage. `answer` is the index of the correct option, chosen by the caller so that letters are
balanced per family and tier; `fam` is the `FamilySpec` and `clip` the dataset's `ClipSpec`. Material that
cannot give a question with exactly one right answer raises `Ambiguous`.

The modules of this package that declare a family are found without importing them (`FAMILIES`, by `RANK`);
one kept elsewhere joins with `register(module)`. `family(name)` returns either kind.
"""

from __future__ import annotations

import itertools
import re
import string
from collections.abc import Sequence

import numpy as np

from embodied.questions.protocol import (  # noqa: F401  (the protocol's names, re-exported here)
    FAMILIES,
    HOOKS,
    PROTOCOL,
    ClipSpec,
    FamilySpec,
    family,
    family_names,
    hook,
    is_family,
    register,
    unregister,
)

LETTERS = string.ascii_uppercase

INSTRUCTION = (
    "Answer the question about the video. Reason inside <think></think>, "
    "then give only the letter of the correct option inside <answer></answer>."
)

TIERS = ("easy", "hard")


class Ambiguous(ValueError):
    """The material cannot make a question with exactly one right answer (e.g. identical puzzle pieces).

    `reason` names the kind of refusal (`look_alike_pieces`, `look_alike_segments`, `uniform_patches`, ...);
    generation from footage counts refusals per reason in the manifest."""

    def __init__(self, message: str, reason: str = "ambiguous"):
        super().__init__(message)
        self.reason = reason


ACTION_INSTRUCTION = (
    "Reason inside <think></think>, then give only the numbers asked for inside <answer></answer>."
)


def format_question(question: str, options: Sequence[str], instruction: str | None = None) -> str:
    """The user turn's text: question, lettered options, answer-format instruction.

    A question without options (an interactive task asking for numbers) gets ACTION_INSTRUCTION instead;
    `instruction` replaces the default one ("" for none, e.g. the free-text captions of `embodied pretrain`).
    """
    if instruction is None:
        instruction = INSTRUCTION if options else ACTION_INSTRUCTION
    lines = [question, *(f"({LETTERS[i]}) {opt}" for i, opt in enumerate(options))]
    return "\n".join([*lines, instruction] if instruction else lines)


def format_response(reasoning: str, letter: str) -> str:
    """The target format of a response (used for SFT targets)."""
    return f"<think>{reasoning}</think><answer>{letter}</answer>"


ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)


def parse_answer(text: str) -> str | None:
    """The stripped content of the one `<answer>` block, or None if there is not exactly one non-empty one."""
    if text.count("<answer>") != 1 or text.count("</answer>") != 1:
        return None
    m = ANSWER_TAG.search(text)
    if m is None:
        return None
    content = m.group(1).strip()
    return content or None


RATIONALES = ("none", "template", "trace")
"""What `sft_target` writes inside `<think>`: nothing | the family's fixed sentence (`reasoning_for`) | the
simulator-derived trace (`trace_for`): what the clip shows that decides the answer, then the answer's text."""


def sft_target(record: dict, rationale: bool | str = False, answer_as: str = "letter") -> str:
    """The SFT response for a record: `<think>` (see `RATIONALES`; False = none, True = template), then the
    answer: the letter, or the right option's text as `answer_as` says (`ANSWER_AS`).

    The questions carry no human reasoning, so the default leaves `<think>` empty rather than teaching a
    canned sentence. A trace is a target, never an input: it holds only what the clip and the question show
    (a puzzle's pieces in their original places), written from the record's simulator metadata.
    """
    module = family(record["family"])  # an unknown family is an error even without a rationale
    mode = "template" if rationale is True else "none" if rationale is False else rationale
    if mode not in RATIONALES:
        raise ValueError(f"rationale must be one of {RATIONALES} (or a bool), got {rationale!r}")
    reasoning = {"none": "", "template": module.reasoning_for, "trace": module.trace_for}[mode]
    if answer_as not in ANSWER_AS:
        raise ValueError(f"answer_as must be one of {ANSWER_AS}, got {answer_as!r}")
    spelled = answer_as == "text" or (answer_as == "order" and option_orders(record) is not None)
    answer = answer_text(record) if spelled else record["answer"]
    return format_response(reasoning(record) if reasoning else "", answer)


ANSWER_AS = ("letter", "order", "text")
"""What an SFT target writes inside `<answer>`: the right option's letter; on ordering questions its order
(`2, 3, 1`) and the letter elsewhere; or its text on every question (`forward`). Each is read as that option
(`chosen_option`)."""


def option_orders(record: dict) -> list[list[int]] | None:
    """The options of an ordering question as orders (`"2, 1, 3"` -> `[2, 1, 3]`), or None for any other
    question: its family says which of its records have orders as options (`options_are_orders`; the
    temporal puzzle's and the spatial puzzle's arrangement variant do). A record of no known family (an
    interactive episode) has none."""
    name = record.get("family")
    if not is_family(name) or not hook(family(name), "options_are_orders")(record):
        return None
    return [[int(x) for x in option.split(",")] for option in record["options"]]


def asks_orders(name: str) -> bool:
    """Whether some questions of family `name` have orders as options (its module says which, through
    `options_are_orders`): the families `grpo.order_credit` can pay partial credit on."""
    return is_family(name) and hook(family(name), "options_are_orders") is not HOOKS["options_are_orders"]


def is_letter(content: str | None, n_options: int) -> bool:
    """Whether `content` is one of the first `n_options` option letters (`A`, not `AB` or an empty string)."""
    return content is not None and len(content) == 1 and content in LETTERS[:n_options]


def _spelled(text: str) -> str:
    """An answer text compared loosely: lower case, no final period, commas and whitespace as one space."""
    return " ".join(p for p in re.split(r"[\s,]+", text.strip().lower().rstrip(".").strip()) if p)


def written_order(text: str) -> list[int] | None:
    """`text` as an order of integers (`2, 3, 1` or `2 3 1` -> [2, 3, 1]), or None if it is anything else
    (digits are ASCII: `isdigit` alone accepts `²`, which `int` refuses)."""
    parts = [p for p in re.split(r"[\s,]+", text.strip().rstrip(".")) if p]
    return [int(p) for p in parts] if parts and all(p.isascii() and p.isdigit() for p in parts) else None


def nearest_order_option(content: str, options: Sequence[str]) -> str | None:
    """The letter of the option an order that is no option comes nearest to, or None.

    Only when every option is an order of the same pieces (`1..k`, k >= 2: a temporal puzzle, a spatial
    arrangement) and `content` is an order of k integers. The option it agrees with on most positions (the
    share of right positions, as `rl.rewards.partial_order_credit` counts them) is chosen; a tie between
    options, or no agreement at all, chooses none, so an order that says nothing decisive earns nothing and
    a random order scores below chance rather than at it.
    """
    orders = [written_order(o) for o in options]
    if not orders or any(o is None or len(o) < 2 or sorted(o) != list(range(1, len(o) + 1)) for o in orders):
        return None
    if len({len(o) for o in orders}) != 1:
        return None
    written = written_order(content)
    if written is None or len(written) != len(orders[0]):
        return None
    agree = [sum(a == b for a, b in zip(written, o)) for o in orders]
    best = max(agree)
    return LETTERS[agree.index(best)] if best > 0 and agree.count(best) == 1 else None


def chosen_option(text: str, options: Sequence[str] | None = None, nearest: bool = True) -> str | None:
    """The option letter a response chooses. Its one `<answer>` content (`parse_answer`; None when there
    is none) counts as the option it names: its letter, or the exact text of one of `options` (case, a
    final period, and spacing around commas aside: `2,3,1` is the option `2, 3, 1`). On an ordering
    question an order that is no option chooses the option it agrees with on most positions, and none on
    a tie (`nearest_order_option`), as a reader forced to pick an option would; `nearest=False` reads only
    exact options. Any other content comes back as it is, and matches no option. Without `options` only
    letters name options."""
    content = parse_answer(text)
    if content is None or not options or is_letter(content, len(options)):
        return content
    spelled = _spelled(content)
    for letter, option in zip(LETTERS, options):
        if _spelled(option) == spelled:
            return letter
    return (nearest_order_option(content, options) if nearest else None) or content


def answer_text(record: dict) -> str:
    """The text of the record's right option."""
    return record["options"][LETTERS.index(record["answer"])]


def places_trace(record: dict) -> str:
    """An ordering puzzle's trace: for each shown piece (numbered where it is shown), its 1-based place in
    the original (`meta.shown_order`), then `->` and the right order (the answer's text), e.g.
    `3 1 2 -> 2, 3, 1`: the per-piece judgement the clip allows, then the sequence the options list."""
    shown = record["meta"]["shown_order"]
    return " ".join(str(int(i) + 1) for i in shown) + " -> " + answer_text(record)


# --- helpers shared by the families ---------------------------------------------------------------------


def balanced_answers(n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """`n` answer indices in `0..k-1`, each used `n // k` or `n // k + 1` times, in random order."""
    extra = rng.permutation(k)[: n % k]
    return rng.permutation(np.concatenate([np.repeat(np.arange(k), n // k), extra]).astype(int))


def shuffled_order(n: int, rng: np.random.Generator) -> list[int]:
    """A uniformly random permutation of `range(n)` other than the identity (the shown order is shuffled)."""
    while True:
        p = [int(x) for x in rng.permutation(n)]
        if p != list(range(n)):
            return p


def restoring_order(shown: Sequence[int]) -> list[int]:
    """`shown[j]` is the original index of the piece shown at place j; returns, for each original index
    in order, the 1-based place where that piece is shown (the sequence that restores the original)."""
    where = {orig: j for j, orig in enumerate(shown)}
    return [where[i] + 1 for i in range(len(shown))]


def order_options(
    correct: Sequence[int], answer: int, k: int, rng: np.random.Generator, accept=None
) -> list[list[int]]:
    """`k` distinct orders of `1..n` with `correct` at index `answer`; distractors drawn uniformly from the
    other orders that `accept(order)` allows (e.g. those that visibly differ from the truth). The identity
    is never a distractor: it would mean "nothing was shuffled". Raises `Ambiguous` if too few remain."""
    n = len(correct)
    banned = {tuple(correct), tuple(range(1, n + 1))}
    if n <= 5:  # few enough orders (120) to list and filter them all
        pool = [list(p) for p in itertools.permutations(range(1, n + 1)) if p not in banned]
        pool = [p for p in pool if accept is None or accept(p)]
    else:  # 9! orders of a 3x3 grid: draw random ones until k - 1 acceptable distinct ones are found
        found: dict[tuple, None] = {}
        for _ in range(50 * k):
            p = tuple(int(x) + 1 for x in rng.permutation(n))
            if p not in banned and p not in found and (accept is None or accept(list(p))):
                found[p] = None
                if len(found) == k - 1:
                    break
        pool = [list(p) for p in found]
    if len(pool) < k - 1:
        raise Ambiguous(
            f"only {len(pool)} distractor orders of {n} pieces look different from the truth",
            "few_distractors",
        )
    picks = rng.choice(len(pool), size=k - 1, replace=False)
    options = [pool[i] for i in picks]
    options.insert(answer, list(correct))
    return options


def order_text(order: Sequence[int]) -> str:
    return ", ".join(str(x) for x in order)


def visible_shuffle(pieces: np.ndarray, rng: np.random.Generator, tol: float, tries: int = 20) -> list[int]:
    """A shuffled order of `pieces (N, ...)` that visibly changes them (swapping two look-alike pieces does
    not count); raises `Ambiguous` when none is found in `tries` draws."""
    for _ in range(tries):
        shown = shuffled_order(len(pieces), rng)
        if piece_difference(pieces[shown], pieces) > tol:
            return shown
    raise Ambiguous("no shuffle visibly changes the pieces: they look alike", "look_alike_pieces")


def piece_difference(a: np.ndarray, b: np.ndarray) -> float:
    """Largest mean absolute difference (0-255) between corresponding pieces of `a` and `b` `(N, ...)`:
    how visible the most changed piece is (a whole-image mean would dilute one swapped patch of nine)."""
    diff = np.abs(a.astype(np.int16) - b.astype(np.int16))
    return float(diff.reshape(len(a), -1).mean(axis=1).max())


CHANGE_LEVEL = 20.0
"""A block of the picture has visibly changed when its mean grey level moved by more than this (0-255): far
above camera and compression noise (2-5 grey levels), well below the edge of a moving object."""
CHANGE_BLOCKS = 14
"""Blocks across the shorter side of a frame for `changed_area` (8-pixel blocks at 112 pixels)."""


def changed_area(a: np.ndarray, b: np.ndarray) -> float:
    """Share (0-1) of the picture that visibly differs between two frames `(H, W, 3)`: the fraction of blocks
    whose mean absolute grey difference exceeds `CHANGE_LEVEL`.

    Unlike a mean over all pixels, a person who stands still (a few blocks around the mouth change) scores
    low even when a bright window behind them flickers, and a moving body or camera scores high."""
    d = np.abs(a.astype(np.float32).mean(axis=-1) - b.astype(np.float32).mean(axis=-1))
    s = max(1, min(d.shape) // CHANGE_BLOCKS)
    h, w = d.shape[0] // s * s, d.shape[1] // s * s
    blocks = d[:h, :w].reshape(h // s, s, w // s, s).mean(axis=(1, 3))
    return float((blocks > CHANGE_LEVEL).mean())


# --- simulated scenes -----------------------------------------------------------------------------------


def reset_world(world, rng: np.random.Generator, tier: str, **options) -> dict:
    """`world.reset(rng, difficulty=tier, **options)` (every world is a `SceneWorld`); returns `info`."""
    _, info = world.reset(rng, difficulty=tier, **options)
    return info


def window_start(info: dict, duration: float, rng: np.random.Generator) -> float:
    """Start (s) of a clip of `duration` inside the world's irreversible motion `info["motion"] = (t0, t1)`:
    uniform over the starts that keep the clip inside it (at t0 when the clip is longer)."""
    t0, t1 = (float(x) for x in info["motion"])
    return float(rng.uniform(t0, max(t0, t1 - duration)))


def scene_meta(world_name: str, info: dict) -> dict:
    """Scene fields of a record's `meta`. World parameters go in as a JSON string so that records of
    different worlds share one Arrow schema (Hugging Face `datasets` loads mixed files)."""
    import json

    return {"scene": world_name, "params": json.dumps(info.get("params", {}), sort_keys=True)}


# One think block, then one answer block, nothing else but whitespace; no nested or repeated tags.
_LAYOUT = re.compile(
    r"\s*<think>(?:(?!</?think>|</?answer>).)*</think>\s*<answer>(?:(?!</?answer>|</?think>).)*</answer>\s*",
    re.S,
)


def format_reward(text: str) -> float:
    """1.0 for exactly `<think>...</think><answer>...</answer>` (whitespace allowed between), else 0.0."""
    return 1.0 if _LAYOUT.fullmatch(text) and parse_answer(text) is not None else 0.0
