"""Benchmark evaluation: greedy answers, accuracy with a 95% interval, chance, unparseable share.

`accuracy` is strict: the response must hold exactly one non-empty `<answer>` with the right letter,
so a model that has not learned the format scores 0 there. `choice_accuracy` asks the model instead
which `<answer>X</answer>` it finds most likely right after the prompt (forced choice, as
log-likelihood harnesses do): it shows what an untrained or format-breaking model knows, and sits at
chance for a random model.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

import torch
from tqdm.auto import tqdm

from embodied.datasets import Example
from embodied.policy import (
    completion_logprobs,
    decode,
    encode_completions,
    encode_prompts,
    generate,
    repeat_batch,
)
from embodied.rl.rewards import parse_answer
from embodied.tasks import LETTERS
from embodied.video import VideoConfig


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for a binomial proportion (good at small n and near 0 or 1)."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


@torch.no_grad()
def _choice_letters(model, processor, batch, records: Sequence[dict]) -> list[str]:
    """Forced choice: the option letter whose `<answer>X</answer>` has the highest log-likelihood."""
    k = max(len(r["options"]) for r in records)
    grouped = repeat_batch(batch, k)
    texts = [f"<answer>{LETTERS[j]}</answer>" for _ in records for j in range(k)]
    ids, mask = encode_completions(processor, texts, device=batch["input_ids"].device)
    lp = (completion_logprobs(model, grouped, ids, mask) * mask).sum(1).view(len(records), k)
    for i, r in enumerate(records):
        lp[i, len(r["options"]) :] = -torch.inf
    return [LETTERS[j] for j in lp.argmax(1).tolist()]


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
) -> dict:
    """Greedy evaluation of `examples`. Returns a JSON-ready dict with overall and per-task figures and
    every prediction (`id`, `answer`, `predicted`, `response`)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    predictions = []
    for start in tqdm(range(0, len(examples), batch_size), desc=desc, unit="batch", disable=not progress):
        chunk = examples[start : start + batch_size]
        records = [e.record for e in chunk]
        batch = encode_prompts(processor, records, [e.clip for e in chunk], video, device)
        ids, mask = generate(model, processor, batch, max_new_tokens, do_sample=False)
        texts = decode(processor, ids, mask)
        chosen = _choice_letters(model, processor, batch, records) if choice else [None] * len(records)
        for rec, text, letter in zip(records, texts, chosen):
            predictions.append(
                {
                    "id": rec["id"],
                    "task": rec["task"],
                    "answer": rec["answer"],
                    "predicted": parse_answer(text),
                    "response": text,
                    "choice": letter,
                }
            )
    model.train(was_training)
    result = summarize(predictions, {e.record["id"]: len(e.record["options"]) for e in examples})
    result["predictions"] = predictions
    return result


def summarize(predictions: Sequence[dict], n_options: dict[str, int]) -> dict:
    """Accuracy, 95% interval, chance, unparseable share and forced-choice accuracy, overall and per task."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for p in predictions:
        groups[p["task"]].append(p)

    def stats(preds: list[dict]) -> dict:
        n = len(preds)
        correct = sum(p["predicted"] == p["answer"] for p in preds)
        out = {
            "n": n,
            "accuracy": correct / n if n else 0.0,
            "ci95": list(wilson_interval(correct, n)),
            "chance": sum(1 / n_options[p["id"]] for p in preds) / n if n else 0.0,
            "unparseable": sum(p["predicted"] is None for p in preds) / n if n else 0.0,
        }
        if preds and preds[0].get("choice") is not None:
            out["choice_accuracy"] = sum(p["choice"] == p["answer"] for p in preds) / n
        return out

    result = stats(list(predictions))
    result["per_task"] = {task: stats(preds) for task, preds in sorted(groups.items())}
    return result


def format_result(result: dict) -> str:
    """One line for humans: accuracy [interval], chance, unparseable, forced choice."""
    lo, hi = result["ci95"]
    line = (
        f"accuracy {result['accuracy']:.3f} [{lo:.3f}, {hi:.3f}] on n={result['n']} "
        f"(chance {result['chance']:.2f}, unparseable {result['unparseable']:.1%}"
    )
    if "choice_accuracy" in result:
        line += f", forced-choice {result['choice_accuracy']:.3f}"
    return line + ")"
