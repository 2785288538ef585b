"""Interactive tasks: the policy's answer is executed in MuJoCo and the physics is the reward.

Each task module (``place``, ``carry``, ``push``) owns its scene (``sim/<task>/scene.xml``) and defines
``make_episode(seed, difficulty, width, height, num_frames, fps) -> (record, frames)``, ``parse_action(text)
-> action | None``, ``job(record, action) -> Job``, ``outcome(record, action, trace) -> terms`` and
``describe(action)``. Records have the MCQ format (``options`` is [] for numeric answers, ``answer`` is ""
since there is no label), so they are stored and loaded like any generated dataset.

The GRPO reward that executes answers is :func:`embodied.envs.reward.env_reward`: every parseable
completion of a call is executed, all in one batch per task on the ``warp`` backend, and scored by physics.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import numpy as np

__all__ = ["TASKS", "execute", "is_interactive", "random_answer", "task"]

TASKS = ("place", "carry", "push")


def task(name: str) -> ModuleType:
    """The module of interactive task ``name``."""
    if name not in TASKS:
        raise KeyError(f"unknown interactive task {name!r}; known: {list(TASKS)}")
    return importlib.import_module(f"embodied.envs.{name}")


def is_interactive(record: dict) -> bool:
    return record.get("task") in TASKS


def random_answer(record: dict, rng: np.random.Generator) -> str:
    """A well-formed completion for ``record`` with a random action on the task's answer grid: the answer
    format for SFT (``sft.targets=format``), with no physics in it."""
    return f"<think></think><answer>{task(record['task']).random_answer(rng)}</answer>"


def execute(record: dict, action, backend: str = "cpu") -> dict[str, float]:
    """Run one parsed action for ``record`` and return its physics terms (``reward/total`` included)."""
    from embodied.envs.backend import simulate_jobs

    mod = task(record["task"])
    return mod.outcome(record, action, simulate_jobs([mod.job(record, action)], backend)[0])
