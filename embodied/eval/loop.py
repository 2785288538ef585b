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
from embodied.eval.baselines import VIDEO_BASELINES, baseline_views, question_rng
from embodied.eval.stats import (
    format_result,
    majority_vote,
    markdown_table,
    pass_at_k,
    prediction_stats,
    resolve_k,
    wilson_interval,
)
from embodied.policy.families import family_of
from embodied.policy.model import (
    completion_logprobs,
    decode,
    encode_completions,
    encode_prompts,
    generate,
    repeat_batch,
)
from embodied.tasks import LETTERS, chosen_option
from embodied.video import Clip, VideoConfig

__all__ = [
    "evaluate",
    "format_result",
    "majority_vote",
    "markdown_table",
    "pass_at_k",
    "prediction_stats",
    "wilson_interval",
]


def choice_prefix(response: str) -> str:
    """Where forced choice puts the answer: the greedy response up to its first `<answer>` (the
    model's own reasoning), or an empty `<think></think>` (the SFT target's shape) when it has none."""
    cut = response.find("<answer>")
    return response[:cut] if cut >= 0 else "<think></think>"


@torch.no_grad()
def _choice_scores(
    model, processor, batch, records: Sequence[dict], responses: Sequence[str]
) -> torch.Tensor:
    """Forced choice: `(B, max options)` log-likelihood of `choice_prefix + <answer>X</answer>` per
    option letter X (-inf past a record's own options). The prefix is the same for every X, so only
    the answer decides; scoring `<answer>X</answer>` right after the prompt would instead ask a trained
    model about a completion it never writes (it starts with `<think>`)."""
    k = max(len(r["options"]) for r in records)
    grouped = repeat_batch(batch, k)
    texts = [f"{choice_prefix(t)}<answer>{LETTERS[j]}</answer>" for t in responses for j in range(k)]
    ids, mask = encode_completions(processor, texts, device=batch["input_ids"].device)
    lp = (completion_logprobs(model, grouped, ids, mask) * mask).sum(1).view(len(records), k)
    for i, r in enumerate(records):
        lp[i, len(r["options"]) :] = -torch.inf
    return lp


@torch.no_grad()
def sampled_responses(
    model, processor, batch, n: int, max_new_tokens: int, temperature: float
) -> list[list[str]]:
    """`n` responses per prompt of `batch`, sampled at `temperature`: `(B, n)` texts."""
    grouped = repeat_batch(batch, n)
    ids, mask = generate(model, processor, grouped, max_new_tokens, temperature, do_sample=True)
    texts = decode(processor, ids, mask)
    return [texts[i : i + n] for i in range(0, len(texts), n)]


def _items(examples: Sequence[Example], baseline: str, seed: int) -> list[tuple[dict, Clip, int]]:
    """(record, clip the policy sees, view index) for every question and every view of it."""
    return [
        (e.record, clip, v)
        for i, e in enumerate(examples)
        for v, clip in enumerate(baseline_views(e.clip, baseline, question_rng(seed, i)))
    ]


def _row(rec: dict, text: str, view: int, lp: torch.Tensor | None, sampled) -> dict:
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
        "choice": None if lp is None else LETTERS[int(lp.argmax())],
        "choice_logprobs": None if lp is None else [round(float(x), 6) for x in lp[:m]],
    }
    if sampled is not None:
        row["sampled"] = sampled
    return row


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
) -> dict:
    """Evaluate `examples` (greedy answers, plus `samples` sampled ones per question when > 0).

    `baseline` is `none` or a video baseline (`blind`, `single-frame`, `shuffled-frames`); `seed` draws
    its shuffles and seeds torch for sampling. Returns a JSON-ready dict: the overall figures,
    `per_family`, `per_family_tier`, `settings`, and every prediction row (`id`, `answer`, `predicted`,
    `response`, `choice`, ...; one row per view of a question).
    """
    if baseline != "none" and baseline not in VIDEO_BASELINES:
        raise ValueError(f"evaluate runs the policy: baseline must be none or one of {VIDEO_BASELINES}")
    ks = resolve_k(samples, k)
    if samples:
        torch.manual_seed(seed)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    items = _items(examples, baseline, seed)
    choice = choice and family_of(processor).splits_rows  # forced choice repeats rows: grids needed
    rows, sampling_s = [], 0.0
    for start in tqdm(range(0, len(items), batch_size), desc=desc, unit="batch", disable=not progress):
        chunk = items[start : start + batch_size]
        records = [rec for rec, _, _ in chunk]
        batch = encode_prompts(processor, records, [clip for _, clip, _ in chunk], video, device)
        ids, mask = generate(model, processor, batch, max_new_tokens, do_sample=False)
        texts = decode(processor, ids, mask)
        scores = (
            _choice_scores(model, processor, batch, records, texts).cpu() if choice else [None] * len(chunk)
        )
        t0 = time.perf_counter()
        sampled = (
            [
                [chosen_option(t, rec["options"]) for t in texts]
                for rec, texts in zip(
                    records, sampled_responses(model, processor, batch, samples, max_new_tokens, temperature)
                )
            ]
            if samples
            else [None] * len(chunk)
        )
        sampling_s += time.perf_counter() - t0
        for (rec, _, view), text, lp, s in zip(chunk, texts, scores, sampled):
            rows.append(_row(rec, text, view, lp, s))
    model.train(was_training)
    result = prediction_stats(rows, k=ks)
    if samples:  # what majority vote over k samples costs: k times this, per question
        result["seconds_per_sample"] = sampling_s / (len(items) * samples)
    result["settings"] = {
        "baseline": baseline,
        "samples": samples,
        "k": ks,
        "temperature": temperature if samples else None,
        "seed": seed,
        "max_new_tokens": max_new_tokens,
    }
    result["predictions"] = rows
    return result


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
