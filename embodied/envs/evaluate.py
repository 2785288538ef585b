"""Policies on interactive episodes: greedy answers executed in MuJoCo, success rates, rollout videos.

`evaluate_env` answers every held-out episode greedily, executes the parseable answers (all of a batch
at once on the warp backend) and reports per task the success rate with a 95% interval, the share of
unparseable answers and the mean of every failure term. `rollout_video` renders one answered episode:
the clip the policy saw, then the physics of its answer, with the answer and the outcome drawn on it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from embodied.envs import task
from embodied.eval.loop import wilson_interval
from embodied.policy.model import decode, encode_prompts, generate
from embodied.rl.rewards import env_reward


@torch.no_grad()
def evaluate_env(
    model,
    processor,
    examples: Sequence,
    video,
    backend: str = "cpu",
    batch_size: int = 32,
    max_new_tokens: int = 48,
    format_weight: float = 0.2,
    progress: bool = False,
    desc: str = "eval env",
) -> dict:
    """Greedy answers to ``examples`` (``embodied.data.load.Example``), scored by simulation."""
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
        terms = env_reward(texts, records, backend, format_weight)
        for rec, text, t in zip(records, texts, terms):
            predictions.append({"id": rec["id"], "task": rec["task"], "response": text, "terms": t})
    model.train(was_training)
    return summarize_env(predictions) | {"predictions": predictions}


def summarize_env(predictions: Sequence[dict]) -> dict:
    """Success rate (95% Wilson interval), unparseable share and mean terms, overall and per task."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for p in predictions:
        groups[p["task"]].append(p)

    def stats(preds: list[dict]) -> dict:
        n = len(preds)
        wins = int(sum(p["terms"]["reward/success"] for p in preds))
        keys = sorted({k for p in preds for k in p["terms"]})
        means = {k: float(np.mean([p["terms"].get(k, 0.0) for p in preds])) for k in keys} if n else {}
        return {
            "n": n,
            "success": wins / n if n else 0.0,
            "ci95": list(wilson_interval(wins, n)),
            "unparseable": means.get("reward/unparseable", 0.0),
            "terms": means,
        }

    return stats(list(predictions)) | {"per_task": {t: stats(p) for t, p in sorted(groups.items())}}


def _draw(frame: np.ndarray, lines: Sequence[tuple[str, tuple[int, int, int]]], scale: int) -> np.ndarray:
    """``frame`` upscaled ``scale`` times with text ``lines`` (text, RGB colour) in a band at the top."""
    import cv2

    big = cv2.resize(frame, None, fx=scale, fy=scale, interpolation=cv2.INTER_NEAREST)
    band = 16 * len(lines) + 6
    big[:band] = (0.35 * big[:band]).astype(np.uint8)  # darken so the text reads on any background
    for i, (text, colour) in enumerate(lines):
        cv2.putText(big, text, (6, 16 + 16 * i), cv2.FONT_HERSHEY_SIMPLEX, 0.45, colour, 1, cv2.LINE_AA)
    return big


def outcome_words(terms: dict[str, float]) -> str:
    """The outcome in words: "success", or the failure terms that fired."""
    if terms.get("reward/unparseable"):
        return "unparseable: nothing executed"
    if terms.get("reward/success"):
        return "success"
    failed = [k.split("/", 1)[1] for k, v in terms.items() if v < 0 and k != "reward/total"]
    return "failed: " + (", ".join(failed) or "missed")


def rollout_video(
    record: dict, clip: np.ndarray, text: str, out: str | Path, fps: float = 10.0, scale: int = 3
) -> dict[str, float]:
    """Write an mp4 of the clip the policy saw, then the simulated execution of its answer ``text``.

    Returns the outcome's terms (executed on the CPU backend, which renders).
    """
    from embodied.envs import core
    from embodied.envs.backend import simulate_cpu
    from embodied.video import write_video

    mod = task(record["task"])
    action = mod.parse_action(text)
    terms = env_reward([text], [record])[0]
    said = mod.describe(action) if action is not None else text.strip()[:40] or "(empty)"
    head = [(f"{record['task']}: {said}", (255, 255, 255))]
    frames = [
        _draw(f, [*head, ("watching...", (200, 200, 200))], scale) for f in clip for _ in range(int(fps / 2))
    ]
    if action is not None:
        job = mod.job(record, action)
        times = np.arange(0.0, job.n_steps * job.model.opt.timestep, 1.0 / fps)
        h, w = clip.shape[1:3]
        _, sim = simulate_cpu(job, times, core.renderer(w, h))
        colour = (120, 255, 120) if terms["reward/success"] else (255, 120, 120)
        frames += [_draw(f, [*head, (outcome_words(terms), colour)], scale) for f in sim]
    else:
        frames += [_draw(clip[-1], [*head, (outcome_words(terms), (255, 120, 120))], scale)] * int(fps)
    write_video(out, np.stack(frames), fps)
    return terms
