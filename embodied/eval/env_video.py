"""Rollout videos of interactive episodes: the clip the policy saw, then the physics of its answer, with
the answer and the outcome drawn on it (`rollout_video`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from embodied.envs import action_seconds, parse, render_action, task
from embodied.envs.reward import env_reward, failed_terms


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
    return "failed: " + (", ".join(failed_terms(terms)) or "missed")


def rollout_video(
    record: dict,
    clip: np.ndarray,
    text: str | Sequence[str],
    out: str | Path,
    fps: float = 10.0,
    scale: int = 3,
) -> dict[str, float]:
    """Write an mp4 of the clip the policy saw, then the simulated execution of its answer ``text``; for a
    multi-turn episode (``text`` a list, one answer per turn) each turn's execution in turn, labelled.

    Returns the last outcome's terms (executed on the CPU backend, which renders).
    """
    from embodied.video import write_video

    mod = task(record["task"])
    texts = [text] if isinstance(text, str) else list(text)
    heads = []
    for k, answer in enumerate(texts):
        action = parse(record, answer)
        said = mod.describe(action) if action is not None else answer.strip()[:40] or "(empty)"
        turn = f"turn {k + 1}: " if len(texts) > 1 else ""
        heads.append([(f"{record['task']}: {turn}{said}", (255, 255, 255))])
    watching = heads[0] if len(texts) == 1 else [(record["task"], (255, 255, 255))]
    frames = [
        _draw(f, [*watching, ("watching...", (200, 200, 200))], scale)
        for f in clip
        for _ in range(int(fps / 2))
    ]
    for answer, head in zip(texts, heads):
        action = parse(record, answer)
        terms = env_reward([answer], [record])[0]
        if action is not None:
            h, w = clip.shape[1:3]
            times = np.arange(0.0, action_seconds(record, action), 1.0 / fps)
            _, sim = render_action(record, action, times, w, h)
            colour = (120, 255, 120) if terms["reward/success"] else (255, 120, 120)
            frames += [_draw(f, [*head, (outcome_words(terms), colour)], scale) for f in sim]
        else:
            frames += [_draw(clip[-1], [*head, (outcome_words(terms), (255, 120, 120))], scale)] * int(fps)
    write_video(out, np.stack(frames), fps)
    return terms
