"""Benchmark evaluation: greedy answers, sampled answers (pass@k, cons@k), forced choice, baselines.

`accuracy` is strict: the response must hold exactly one non-empty `<answer>` with the right letter,
so a model that has not learned the format scores 0 there. `choice_accuracy` asks the model instead
which `<answer>X</answer>` it finds most likely where it answers, after its own greedy reasoning
(forced choice, as log-likelihood harnesses do; see `choice_prefix`): it shows what an untrained or
format-breaking model knows, and sits at chance for a random model. With `samples=n > 0`, n
responses per question are sampled at `temperature` for pass@k (unbiased estimator) and cons@k
(majority vote); see `embodied.eval.stats`. With a `baseline` (see `embodied.eval.baselines`) the policy
answers modified clips. docs/evaluation.md defines every number.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from tqdm.auto import tqdm

from embodied.data.load import Example
from embodied.data.schema import kind
from embodied.eval.answerer import Answerer, LocalAnswerer, choice_prefix, sampled_responses
from embodied.eval.baselines import VIDEO_BASELINES, baseline_views, question_rng
from embodied.eval.endpoint import Failure
from embodied.eval.stats import (
    drop_sampled,
    format_result,
    majority_vote,
    markdown_table,
    pass_at_k,
    prediction_stats,
    resolve_k,
    wilson_interval,
)
from embodied.policy.architectures import architecture_of
from embodied.questions import LETTERS, chosen_option
from embodied.rl.rollout import sampling_seed
from embodied.video import Clip, VideoConfig

__all__ = [
    "choice_prefix",
    "evaluate",
    "evaluate_answers",
    "format_result",
    "majority_vote",
    "markdown_table",
    "pass_at_k",
    "prediction_stats",
    "sampled_responses",
    "wilson_interval",
]


def _items(examples: Sequence[Example], baseline: str, seed: int) -> list[tuple[dict, Clip, int, int]]:
    """(record, clip the policy sees, view index, question index) for every question and every view of it."""
    return [
        (e.record, clip, v, i)
        for i, e in enumerate(examples)
        for v, clip in enumerate(baseline_views(e.clip, baseline, question_rng(seed, i)))
    ]


def _row(rec: dict, text: str, view: int, lp, sampled) -> dict:
    m = len(rec["options"])
    row = {
        "id": rec["id"],
        "family": kind(rec),
        "difficulty": rec.get("meta", {}).get("difficulty"),
        "n_options": m,
        "view": view,
        "answer": rec["answer"],
        "predicted": chosen_option(text, rec["options"]),
        "response": text,
        "choice": None if lp is None else LETTERS[int(torch.as_tensor(lp).argmax())],
        "choice_logprobs": None if lp is None else [round(float(x), 6) for x in lp[:m]],
    }
    if sampled is not None:
        row["sampled"] = sampled
    return row


def _failed_row(rec: dict, view: int, failure: Failure) -> dict:
    """A question view whose answer never came (a request that failed): listed, never scored."""
    return {"id": rec["id"], "family": kind(rec), "view": view, "failed": True, "error": failure.error}


@torch.no_grad()
def evaluate(
    model,
    processor,
    examples: Sequence[Example],
    video: VideoConfig,
    batch_size: int = 64,
    max_new_tokens: int = 48,
    choice: bool = True,
    progress: bool = True,
    desc: str = "eval",
    *,
    baseline: str = "none",
    samples: int = 0,
    k: Sequence[int] = (),
    temperature: float = 1.0,
    seed: int = 0,
    media: str = "auto",
) -> dict:
    """Evaluate `examples` with a local model (greedy answers, plus `samples` sampled ones per question).

    `baseline` is `none` or a video baseline (`blind`, `single-frame`, `shuffled-frames`); `seed` draws
    its shuffles and seeds torch for sampling; `media` is `eval.media` (`embodied.eval.answerer.MEDIA`).
    Returns a JSON-ready dict: the overall figures, `per_family`, `per_family_tier`, `settings`, and every
    prediction row (`id`, `answer`, `predicted`, `response`, `choice`, ...; one row per view of a question).
    """
    if samples:
        torch.manual_seed(seed)
    was_training = model.training
    model.eval()
    choice = choice and architecture_of(processor).splits_rows  # forced choice repeats rows: grids needed
    answerer = LocalAnswerer(model, processor, video, max_new_tokens, media)
    try:
        result = evaluate_answers(
            answerer, examples, batch_size, choice, progress, desc,
            baseline=baseline, samples=samples, k=k, temperature=temperature, seed=seed,
        )  # fmt: skip
    finally:
        model.train(was_training)
    result["settings"]["max_new_tokens"] = max_new_tokens
    return result


def evaluate_answers(
    answerer: Answerer,
    examples: Sequence[Example],
    batch_size: int = 64,
    choice: bool = True,
    progress: bool = True,
    desc: str = "eval",
    *,
    baseline: str = "none",
    samples: int = 0,
    k: Sequence[int] = (),
    temperature: float = 1.0,
    seed: int = 0,
) -> dict:
    """`evaluate` with any answer source (`embodied.eval.answerer`): a local model or a served one.

    A question whose answer (greedy or sampled, any view) could not be obtained is listed under `failed`
    and left out of every figure: `n` counts the questions answered, `requested` all of them. Forced choice
    is reported only when the source gave it for every answered question (`settings["choice"]` says why
    not otherwise)."""
    if baseline != "none" and baseline not in VIDEO_BASELINES:
        raise ValueError(f"evaluate runs the policy: baseline must be none or one of {VIDEO_BASELINES}")
    ks = resolve_k(samples, k)
    items = _items(examples, baseline, seed)
    rows, sampling_s, sample_texts = [], 0.0, []
    for start in tqdm(range(0, len(items), batch_size), desc=desc, unit="batch", disable=not progress):
        chunk = items[start : start + batch_size]
        records, clips = [it[0] for it in chunk], [it[1] for it in chunk]
        texts = answerer.greedy(records, clips)
        scores = answerer.choice(records, clips, texts) if choice else [None] * len(chunk)
        t0 = time.perf_counter()
        seeds = [seeds_of(seed, it) for it in chunk]
        drawn = (
            answerer.sample(records, clips, samples, temperature, seeds) if samples else [None] * len(chunk)
        )
        sampling_s += time.perf_counter() - t0
        sample_texts += [d for d in drawn if d is not None]
        for (rec, _, view, _), text, lp, s in zip(chunk, texts, scores, drawn):
            lost = [x for x in [text, *(s or [])] if isinstance(x, Failure)]
            if lost:
                rows.append(_failed_row(rec, view, lost[0]))
                continue
            sampled = None if s is None else [chosen_option(t, rec["options"]) for t in s]
            rows.append(_row(rec, text, view, lp, sampled))
    result = _scored(rows, ks)
    if samples:  # what majority vote over k samples costs: k times this, per question
        result["seconds_per_sample"] = sampling_s / (len(items) * samples)
    if samples and hasattr(answerer, "check_sampling") and items:
        first = items[0]
        why = answerer.check_sampling(first[0], first[1], seeds_of(seed, first), sample_texts, temperature)
        if why:  # a server that answers greedily: no pass@k or cons@k, never a number
            drop_sampled(result)
            result.pop("seconds_per_sample", None)
    result["settings"] = answerer.settings() | {
        "baseline": baseline,
        "samples": samples,
        "k": ks,
        "temperature": temperature if samples else None,
        "seed": seed,
    }
    if choice and "choice_accuracy" not in result and result["n"]:
        result["settings"]["choice"] = "unavailable: the answer source gave no log-probs for every answer"
    result["predictions"] = rows
    return result


def _scored(rows: list[dict], ks: Sequence[int]) -> dict:
    """The figures over the questions answered in every view; `requested` counts all questions, `failed`
    lists the others once each (`id`, `family`, one view's `error`)."""
    lost: dict[str, dict] = {}
    for r in rows:
        if r.get("failed"):
            lost.setdefault(r["id"], r)
    result = prediction_stats([r for r in rows if r["id"] not in lost], k=ks)
    result["requested"] = len({r["id"] for r in rows})
    result["failed"] = [
        {"id": i, "family": lost[i]["family"], "error": lost[i]["error"]} for i in sorted(lost)
    ]
    return result


def seeds_of(seed: int, item: tuple) -> int:
    """The sampling seed of an item of `_items` (question index and view)."""
    return sampling_seed(seed, item[3], item[2])


def evaluate_free(model, processor, examples: Sequence[Example], cfg, **kwargs) -> dict:
    """`evaluate` with a run config's video and `eval` settings, free generation (no forced choice), no bar,
    seeded by `cfg.seed`; `kwargs` go through (baseline, samples, k). The result has `wall_s`."""
    t0 = time.perf_counter()
    result = evaluate(
        model,
        processor,
        examples,
        cfg.video,
        cfg.eval.batch_size,
        cfg.eval.max_new_tokens,
        choice=False,
        progress=False,
        seed=cfg.seed,
        **kwargs,
    )
    return result | {"wall_s": time.perf_counter() - t0}
