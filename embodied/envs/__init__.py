"""Interactive tasks: the policy's answer is executed in MuJoCo and the physics is the reward.

Each task module (``place``, ``carry``, ``push``) owns its scene (``sim/<task>/scene.xml``) and defines
``make_episode(seed, difficulty, width, height, num_frames, fps) -> (record, frames)``, ``parse_action(text)
-> action | None``, ``job(record, action) -> Job``, ``outcome(record, action, trace) -> terms`` and
``describe(action)``. Records have the MCQ format (``options`` is [] for numeric answers, ``answer`` is ""
since there is no label), so they are stored and loaded like any generated dataset.

:func:`env_reward` is the GRPO reward hook: every parseable completion of a call is executed, all in one
batch per task on the ``warp`` backend, and scored by physics. No label, no reward model.
"""

from __future__ import annotations

import importlib
import json
from collections import OrderedDict
from collections.abc import Sequence
from types import ModuleType

import numpy as np

from embodied.rl.rewards import format_reward

__all__ = [
    "TASKS",
    "UNPARSEABLE_PENALTY",
    "env_reward",
    "execute",
    "is_interactive",
    "random_answer",
    "task",
]

TASKS = ("place", "carry", "push")
FORMAT_WEIGHT = 0.2
"""Weight of ``reward/format`` (the ``<think>...</think><answer>...</answer>`` layout) in the total."""
UNPARSEABLE_PENALTY = 1.5
"""``reward/total`` of an unparseable answer is minus this: below the worst executed outcome of every
task (place -0.5, carry -1.25, push -0.25), so that not answering never beats a bad action."""


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


OUTCOME_CACHE_SIZE = 200_000
_outcomes: OrderedDict = OrderedDict()
"""Physics terms by (backend, task, episode meta, parsed action). A backend is deterministic for a given
model, state and control schedule, so a repeated answer to the same episode (common within a GRPO group
and across steps) is looked up instead of simulated again; bounded, least recently used first out."""


def _outcome_key(record: dict, action, backend: str) -> str:
    return json.dumps([backend, record["task"], record["meta"], action], sort_keys=True)


def execute(record: dict, action, backend: str = "cpu") -> dict[str, float]:
    """Run one parsed action for ``record`` and return its physics terms (``reward/total`` included)."""
    from embodied.envs.backend import run_jobs

    mod = task(record["task"])
    return mod.outcome(record, action, run_jobs([mod.job(record, action)], backend)[0])


def env_reward(
    texts: Sequence[str], records: Sequence[dict], backend: str = "cpu", format_weight: float = FORMAT_WEIGHT
) -> list[dict[str, float]]:
    """Named reward terms for each completion ``texts[i]`` answering ``records[i]``.

    Every term of every task is present in every dict (0 where it does not apply), so that means over a
    batch are well defined; ``reward/unparseable`` is 1 for an answer that could not be parsed (nothing
    is executed, no format reward, ``reward/total`` is ``-UNPARSEABLE_PENALTY``). An error inside a
    simulation propagates, naming task and seed.
    """
    from embodied.envs.backend import run_jobs
    from embodied.envs.core import EnvError

    if len(texts) != len(records):
        raise ValueError(f"env_reward: {len(texts)} texts for {len(records)} records")
    actions, jobs, owners = [], [], {}
    out: list[dict[str, float]] = [{} for _ in texts]
    for i, (text, rec) in enumerate(zip(texts, records)):
        mod = task(rec["task"])
        action = mod.parse_action(text)
        actions.append(action)
        if action is None:
            continue
        key = _outcome_key(rec, action, backend)
        if key in _outcomes:
            _outcomes.move_to_end(key)
            out[i] = dict(_outcomes[key])
        elif key in owners:  # the same answer twice in this call: simulated once
            owners[key].append(i)
        else:
            try:
                jobs.append(mod.job(rec, action))
            except Exception as e:
                seed = rec.get("meta", {}).get("seed")
                raise EnvError(f"task {rec['task']}, seed {seed}: building the episode failed: {e}") from e
            owners[key] = [i]
    traces = run_jobs(jobs, backend) if jobs else []
    for (key, idx), trace in zip(owners.items(), traces):
        rec = records[idx[0]]
        terms = task(rec["task"]).outcome(rec, actions[idx[0]], trace)
        _outcomes[key] = terms
        for i in idx:
            out[i] = dict(terms)
    while len(_outcomes) > OUTCOME_CACHE_SIZE:
        _outcomes.popitem(last=False)
    keys = {"reward/total", "reward/success"}
    for name in {rec["task"] for rec in records}:
        keys |= set(task(name).WEIGHTS)
    for i, text in enumerate(texts):
        parsed = actions[i] is not None
        terms = {k: out[i].get(k, 0.0) for k in keys}
        terms["reward/format"] = format_reward(text) if parsed else 0.0
        terms["reward/unparseable"] = 0.0 if parsed else 1.0
        if parsed:
            terms["reward/total"] += format_weight * terms["reward/format"]
        else:
            terms["reward/total"] = -UNPARSEABLE_PENALTY
        out[i] = terms
    return out
