"""Regression test: reinforcement learning alone must teach the policy a question it can plainly see.

From the format-only start (SFT on random letters: the answer format, never the answer) GRPO must lift the
shipped tiny base from chance to >= 0.9 on "which colour fills the picture?". It fails when RL stops
learning: a zero policy loss, a reward that no longer reaches the update, a sampler that ignores the
image, a base that no longer sees colour.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from embodied.config import GRPOConfig, SFTConfig
from embodied.datasets import Example
from embodied.evaluate import evaluate
from embodied.policy import load
from embodied.policy import PolicyConfig
from embodied.train.grpo import train_grpo
from embodied.train.sft import train_sft
from embodied.video import Clip, VideoConfig

COLOURS = {"red": (200, 40, 40), "blue": (40, 60, 210)}


def colour_examples(n: int, seed: int) -> list[Example]:
    """`n` one-image questions: a picture filled with red or blue (noisy shades), answer balanced."""
    rng = np.random.default_rng(seed)
    names = list(COLOURS)
    out = []
    for i in range(n):
        answer = i % 2
        options = names if rng.random() < 0.5 else names[::-1]
        rgb = np.array(COLOURS[options[answer]]) + rng.integers(-30, 30, size=3)
        img = np.clip(rgb + rng.integers(-20, 20, size=(56, 56, 3)), 0, 255).astype(np.uint8)
        record = {
            "id": f"colour-{seed}-{i}",
            "task": "arrow_of_time",  # any family: only its answer format is used
            "images": ["frame"],
            "question": "Which colour fills the picture?",
            "options": options,
            "answer": "AB"[answer],
        }
        out.append(Example(record, Clip(img[None], 2.0)))
    return out


def test_grpo_from_format_only_learns_a_visible_answer(tmp_path):
    video = VideoConfig()
    train, test = colour_examples(256, 0), colour_examples(128, 1)
    model, processor = load(PolicyConfig(path="tiny-base"))
    fmt = SFTConfig(steps=10, targets="format", restart_every=0, eval_every=0, checkpoint_every=0)
    train_sft(model, processor, train, fmt, video, tmp_path / "sft", progress=False)
    before = evaluate(model, processor, test, video, choice=False, progress=False)
    grpo = GRPOConfig(steps=30, prompts_per_step=8, lr=3e-4, kl_coef=0.0, max_new_tokens=12, checkpoint_every=0)
    train_grpo(model, processor, train, grpo, video, tmp_path / "grpo", progress=False)
    after = evaluate(model, processor, test, video, choice=False, progress=False)
    assert before["unparseable"] < 0.1, "format SFT did not teach the answer format"
    assert abs(before["accuracy"] - 0.5) < 0.15, f"format-only start is not at chance: {before['accuracy']}"
    assert after["accuracy"] >= 0.9, f"GRPO did not learn a plainly visible answer: {after['accuracy']:.3f}"
