"""The physics reward of interactive answers: parse the answer, execute it in MuJoCo, score the outcome.

`env_reward` is a batch `RewardFn` (`embodied.rl.rewards`): every parseable completion of a call is executed,
all in one batch per task on the `warp` backend, and scored by its task's `outcome` as named terms. Each
task module declares its own terms (`WEIGHTS`) and its worst executed outcome (`WORST_OUTCOME`); an
unparseable answer scores below every task's worst, so that not answering never beats a bad action.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence

from embodied.envs import parse, task, task_names
from embodied.envs.backend import simulate_jobs
from embodied.envs.core import EnvError
from embodied.questions import format_reward

ENV_FORMAT_WEIGHT = 0.2
"""Weight of ``reward/format`` (the ``<think>...</think><answer>...</answer>`` layout) in the total."""
UNPARSEABLE_MARGIN = 0.25
"""How far below the worst executed outcome of any task an unparseable answer scores."""


def failed_terms(terms: dict[str, float]) -> list[str]:
    """The failure terms that fired in one answer's reward terms, without their `reward/` prefix (the
    negative ones but the total: e.g. `["short"]` for a push that stopped short), in the terms' order."""
    return [k.split("/", 1)[1] for k, v in terms.items() if v < 0 and k != "reward/total"]


def unparseable_penalty() -> float:
    """``reward/total`` of an unparseable answer is minus this: ``UNPARSEABLE_MARGIN`` below the lowest
    ``WORST_OUTCOME`` of every known task, so that not answering never beats a bad action (one value for
    every task, so that a mixed batch ranks not answering the same way everywhere)."""
    return max(-task(name).WORST_OUTCOME for name in task_names()) + UNPARSEABLE_MARGIN


OUTCOME_CACHE_SIZE = 200_000
_outcomes: OrderedDict = OrderedDict()
"""Physics terms by (backend, task, episode meta, parsed action). A backend is deterministic for a given
model, state and control schedule, so a repeated answer to the same episode (common within a GRPO group
and across steps) is looked up instead of simulated again; bounded, least recently used first out."""


def _outcome_key(record: dict, action, backend: str) -> str:
    return json.dumps([backend, record["task"], record["meta"], action], sort_keys=True)


def clear_outcome_cache() -> None:
    """Forget every stored physics outcome (for timings that must simulate everything)."""
    _outcomes.clear()


def cached_outcomes() -> int:
    """How many physics outcomes are stored."""
    return len(_outcomes)


def env_reward(
    texts: Sequence[str],
    records: Sequence[dict],
    backend: str = "cpu",
    format_weight: float = ENV_FORMAT_WEIGHT,
) -> list[dict[str, float]]:
    """Named reward terms for each completion ``texts[i]`` answering ``records[i]``.

    Every term of every task is present in every dict (0 where it does not apply), so that means over a
    batch are well defined; ``reward/unparseable`` is 1 for an answer that could not be parsed (nothing
    is executed, no format reward, ``reward/total`` is ``-unparseable_penalty()``). An error inside a
    simulation propagates, naming task and seed.
    """
    if len(texts) != len(records):
        raise ValueError(f"env_reward: {len(texts)} texts for {len(records)} records")
    actions, jobs, owners = [], [], {}
    out: list[dict[str, float]] = [{} for _ in texts]
    for i, (text, rec) in enumerate(zip(texts, records)):
        mod = task(rec["task"])
        action = parse(rec, text)  # the letter of a record in grid form, else the task's own answer
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
    traces = simulate_jobs(jobs, backend) if jobs else []
    for (key, idx), trace in zip(owners.items(), traces):
        rec = records[idx[0]]
        terms = task(rec["task"]).outcome(rec, actions[idx[0]], trace)
        _outcomes[key] = terms
        for i in idx:
            out[i] = dict(terms)
    while len(_outcomes) > OUTCOME_CACHE_SIZE:
        _outcomes.popitem(last=False)
    penalty = unparseable_penalty()
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
            terms["reward/total"] = -penalty
        out[i] = terms
    return out
