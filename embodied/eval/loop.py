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

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from embodied.data.load import Example
from embodied.data.schema import kind
from embodied.eval.answerer import Answerer, LocalAnswerer
from embodied.eval.baselines import VIDEO_BASELINES, baseline_views, question_rng
from embodied.eval.endpoint import Failure
from embodied.eval.stats import drop_sampled, prediction_stats, resolve_k
from embodied.policy.architectures import architecture_of
from embodied.questions import LETTERS, chosen_option
from embodied.rl.rollout import sampling_seed
from embodied.video import Clip, VideoConfig


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


@dataclass(frozen=True)
class MCQEval:
    """How `evaluate` answers and scores multiple-choice questions: `batch_size` question views at a time, at
    most `max_new_tokens` tokens an answer, shown as `media` (`eval.media`, `embodied.eval.answerer.MEDIA`),
    with forced `choice` or not; a progress bar (`progress`) labelled `desc`. `baseline` is `none` or a video
    baseline (`blind`, `single-frame`, `shuffled-frames`); with `samples` > 0 also that many sampled answers
    a question at `temperature`, for pass@k and cons@k for each k in `k`. `seed` draws the baselines'
    shuffles and seeds the sampling. `evaluate_answers` reads neither `max_new_tokens` nor `media`: its
    answer source holds its own."""

    batch_size: int = 64
    max_new_tokens: int = 48
    choice: bool = True
    progress: bool = True
    desc: str = "eval"
    baseline: str = "none"
    samples: int = 0
    k: Sequence[int] = ()
    temperature: float = 1.0
    seed: int = 0
    media: str = "auto"

    @classmethod
    def of(cls, cfg, **changes) -> MCQEval:
        """`embodied eval`'s settings from a whole config (`embodied.config.Config`): its `eval` section's
        batch, token budget, forced choice, baseline, samples, k, temperature and media, and the run's seed;
        `changes` replace any of them (and set `progress`, `desc`)."""
        e = cfg.eval
        fields = {"batch_size": e.batch_size, "max_new_tokens": e.max_new_tokens, "choice": e.choice}
        fields |= {"baseline": e.baseline, "samples": e.samples, "k": e.k, "temperature": e.temperature}
        return cls(**fields | {"seed": cfg.seed, "media": e.media} | changes)


@torch.no_grad()
def evaluate(
    model,
    processor,
    examples: Sequence[Example],
    video: VideoConfig,
    how: MCQEval = MCQEval(),
    engine=None,
) -> dict:
    """Evaluate `examples` with a local model (greedy answers, plus `how.samples` sampled ones per question),
    as `how` (`MCQEval`) says; `engine` (`embodied.policy.sampling`, synced with `model`) answers, None:
    Hugging Face `generate` on `model`.

    Returns a JSON-ready dict: the overall figures, `per_family`, `per_family_tier`, `settings`, and every
    prediction row (`id`, `answer`, `predicted`, `response`, `choice`, ...; one row per view of a question).
    """
    if how.samples:
        torch.manual_seed(how.seed)
    was_training = model.training
    model.eval()
    # forced choice repeats rows: grids needed
    how = dataclasses.replace(how, choice=how.choice and architecture_of(processor).splits_rows)
    answerer = LocalAnswerer(model, processor, video, how.max_new_tokens, how.media, engine)
    try:
        result = evaluate_answers(answerer, examples, how)
    finally:
        model.train(was_training)
    result["settings"]["max_new_tokens"] = how.max_new_tokens
    return result


def evaluate_answers(answerer: Answerer, examples: Sequence[Example], how: MCQEval = MCQEval()) -> dict:
    """`evaluate` with any answer source (`embodied.eval.answerer`): a local model or a served one.

    A question whose answer (greedy or sampled, any view) could not be obtained is listed under `failed`
    and left out of every figure: `n` counts the questions answered, `requested` all of them. Forced choice
    is reported only when the source gave it for every answered question (`settings["choice"]` says why
    not otherwise)."""
    if how.baseline != "none" and how.baseline not in VIDEO_BASELINES:
        raise ValueError(f"evaluate runs the policy: baseline must be none or one of {VIDEO_BASELINES}")
    ks = resolve_k(how.samples, how.k)
    items = _items(examples, how.baseline, how.seed)
    rows, sampling_s, sample_texts = [], 0.0, []
    for start in tqdm(
        range(0, len(items), how.batch_size), desc=how.desc, unit="batch", disable=not how.progress
    ):
        chunk = items[start : start + how.batch_size]
        records, clips = [it[0] for it in chunk], [it[1] for it in chunk]
        texts = answerer.greedy(records, clips)
        scores = answerer.choice(records, clips, texts) if how.choice else [None] * len(chunk)
        t0 = time.perf_counter()
        seeds = [seeds_of(how.seed, it) for it in chunk]
        drawn = (
            answerer.sample(records, clips, how.samples, how.temperature, seeds)
            if how.samples
            else [None] * len(chunk)
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
    if how.samples:  # what majority vote over k samples costs: k times this, per question
        result["seconds_per_sample"] = sampling_s / (len(items) * how.samples)
    if how.samples and hasattr(answerer, "check_sampling") and items:
        first = items[0]
        why = answerer.check_sampling(
            first[0], first[1], seeds_of(how.seed, first), sample_texts, how.temperature
        )
        if why:  # a server that answers greedily: no pass@k or cons@k, never a number
            drop_sampled(result)
            result.pop("seconds_per_sample", None)
    result["settings"] = answerer.settings() | {
        "baseline": how.baseline,
        "samples": how.samples,
        "k": ks,
        "temperature": how.temperature if how.samples else None,
        "seed": how.seed,
    }
    if how.choice and "choice_accuracy" not in result and result["n"]:
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


def evaluate_free(model, processor, examples: Sequence[Example], cfg, **changes) -> dict:
    """`evaluate` with a run config's video, batch size and token budget (not the rest of `eval`: media,
    samples and the others keep `MCQEval`'s defaults), free generation (no forced choice), no bar, seeded by
    `cfg.seed`; `changes` replace any `MCQEval` field (baseline, samples, k). The result has `wall_s`."""
    t0 = time.perf_counter()
    e = cfg.eval
    how = MCQEval(e.batch_size, e.max_new_tokens, choice=False, progress=False, seed=cfg.seed, **changes)
    result = evaluate(model, processor, examples, cfg.video, how)
    return result | {"wall_s": time.perf_counter() - t0}
