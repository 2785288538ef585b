"""Expert iteration's targets: which sampled answers a round fine-tunes on, as pure functions of a rollout.

A single-turn round keeps per prompt at most one answer (`select`): the highest-reward one that succeeded
(`keep=success`) or the highest-reward one whenever the answers differ (`keep=best`); truncated answers are
never kept. A multi-turn round keeps per prompt and turn the best answer that succeeded at that turn, as the
conversation that led to it (`select_turns`), and with `retry_targets` also teaches the failed runs a
sibling's answer. `balanced` draws a round's fine-tuning examples by task; `task_successes` is the per-task
success the round logs. The round loop that samples, keeps and fine-tunes is `embodied.train.expert`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from embodied.data.load import Example
from embodied.envs import parse, task
from embodied.rl.episodes import again
from embodied.rl.rollout import Rollout

KEEP = ("success", "best")
RETRY_TARGETS = ("own", "group", "better")
BALANCE_FLOOR = 0.1
"""`expert.balance=failures`: a task's weight is its share of failed samples this round plus this floor, so a
task the policy has solved keeps a little of every round's fine-tuning."""


def succeeded(terms: dict[str, float]) -> bool:
    """Whether an answer's reward terms say it succeeded: `reward/success` (interactive tasks), else
    `reward/accuracy` (MCQs)."""
    value = terms.get("reward/success", terms.get("reward/accuracy"))
    if value is None:
        raise KeyError(
            f"expert.keep=success needs reward/success or reward/accuracy; terms are {sorted(terms)}"
        )
    return value >= 0.5


def _has_success(terms: dict[str, float]) -> bool:
    return "reward/success" in terms or "reward/accuracy" in terms


def task_name(record: dict) -> str:
    """What `expert/success_<task>` and `expert.balance` group by: an episode's task, an MCQ's family."""
    return record.get("task") or record.get("family", "mcq")


def balanced(examples: Sequence[Example], success: dict[str, list[float]], size: int, seed: int) -> list:
    """`expert.balance=failures`: `size` fine-tuning examples drawn from `examples` so that each task's share
    is proportional to its share of this round's samples that failed (`success`: task -> 0/1 per sampled
    answer; a task not sampled this round counts as solved), plus `BALANCE_FLOOR`. A task's examples are
    drawn in shuffled passes (every one before any repeats), seeded by `seed`. One task: `examples` as
    they are."""
    groups: dict[str, list] = {}
    for ex in examples:
        groups.setdefault(task_name(ex.record), []).append(ex)
    if len(groups) < 2:
        return list(examples)
    weight = {t: 1.0 - float(np.mean(success.get(t) or [1.0])) + BALANCE_FLOOR for t in groups}
    total, rng, out = sum(weight.values()), np.random.default_rng(seed), []
    for t in sorted(groups):
        n, group = max(1, round(size * weight[t] / total)), groups[t]
        passes = np.concatenate([rng.permutation(len(group)) for _ in range(-(-n // len(group)))])
        out += [group[i] for i in passes[:n]]
    return out


def task_successes(ro: Rollout) -> list[tuple[str, float]]:
    """Per scored row of `ro` that says whether it succeeded, its prompt's task (`record["task"]`, an MCQ's
    `family`) and 1.0 / 0.0: the training success per task that `expert/success_<task>` logs, so a round on
    several tasks shows which one moves. A multi-turn row is its trajectory's prompt's (`ro.owner`)."""
    G = ro.group_size
    owners = ro.owner.tolist() if ro.owner is not None else range(len(ro.terms))
    out = []
    for row, owner in enumerate(owners):
        if _has_success(ro.terms[row]):
            out.append((task_name(ro.examples[owner // G].record), float(succeeded(ro.terms[row]))))
    return out


def select(ro: Rollout, keep: str) -> list[int | None]:
    """Per prompt of `ro`, the row of the answer to keep, or None: the highest `reward/total` among its
    untruncated answers that succeeded (`keep="success"`), or among all its untruncated answers when their
    rewards are not all equal (`keep="best"`: an answer above its group's mean). Ties go to the first row."""
    if keep not in KEEP:
        raise ValueError(f"expert.keep={keep!r}; choose one of {list(KEEP)}")
    G = ro.group_size
    chosen: list[int | None] = []
    for p in range(len(ro.examples)):
        rows = [p * G + g for g in range(G) if not bool(ro.truncated[p * G + g])]
        if keep == "success":
            rows = [r for r in rows if succeeded(ro.terms[r])]
        elif len({float(ro.rewards[p, r - p * G]) for r in range(p * G, p * G + G)}) < 2:
            rows = []
        chosen.append(max(rows, key=lambda r: (float(ro.rewards[p, r - p * G]), -r)) if rows else None)
    return chosen


@dataclass(frozen=True)
class _Trajectories:
    """A multi-turn rollout read by trajectory: `rows[t][k]` is the row of trajectory `t`'s turn `k` (turns
    count from 1); the trajectories of prompt `p` are `p * G` to `p * G + G - 1`."""

    ro: Rollout
    rows: dict[int, dict[int, int]]

    @classmethod
    def of(cls, ro: Rollout) -> _Trajectories:
        rows: dict[int, dict[int, int]] = {}
        for i, (t, k) in enumerate(zip(ro.owner.tolist(), ro.turn.tolist())):
            rows.setdefault(t, {})[k] = i
        return cls(ro, rows)

    def of_prompt(self, p: int) -> range:
        return range(p * self.ro.group_size, (p + 1) * self.ro.group_size)

    def solved(self, i: int) -> bool:
        """Row `i` is a target: untruncated, and it succeeded."""
        return not bool(self.ro.truncated[i]) and succeeded(self.ro.terms[i])

    def total(self, i: int) -> float:
        return float(self.ro.terms[i]["reward/total"])

    def answers_before(self, t: int, k: int) -> tuple[str, ...]:
        """Trajectory `t`'s answers of the turns before `k` (each failed, or `t` would have ended)."""
        return tuple(self.ro.texts[self.rows[t][j]] for j in range(1, k))

    def conversation(self, ex: Example, t: int, k: int, suffix: str, words: bool) -> Example:
        """`ex` as trajectory `t` reached turn `k`: its earlier answers, each with the words and the clip of
        its outcome; the id gets `/turn<k>` and `suffix`."""
        earlier = [self.rows[t][j] for j in range(1, k)]
        history = tuple((self.ro.texts[i], again(self.ro.terms[i], words)) for i in earlier)
        record = ex.record | {"id": f"{ex.record['id']}/turn{k}{suffix}"}
        return Example(record, ex.clip, history, tuple(self.ro.clips[t][1:k]))


def select_turns(ro: Rollout, words: bool = False, targets: str = "own") -> list[tuple[Example, str]]:
    """Multi-turn rollouts (`rl.episodes.sample_episodes`): per prompt and turn, the highest-reward
    untruncated answer that succeeded at that turn (ties to the first row), as `(example, answer)`. A turn-k
    example is that trajectory's conversation: the clip and question, its k - 1 failed answers each with the
    words and the clip of its outcome, so fine-tuning on it teaches the answer that worked after seeing them.
    A turn-k record's id gets `/turn<k>` (one target per id).

    `targets="group"` (`expert.retry_targets`) also keeps, for every distinct sequence of failed answers
    that some trajectory of the prompt ran into without then succeeding itself, that conversation with the
    group's best success (any turn) as its target, id `/turn<k>/<j>`: every answer is executed from the
    episode's reset, so the sibling's answer succeeds after those failures too. `targets="better"` keeps the
    same conversations with a nearer target: among the group's executed answers (any turn, untruncated)
    that scored a higher `reward/total` than the last failed answer and are not one of the failed answers,
    the nearest to it by the task's `action_value` (ties: the higher total), success or not. A retry is
    then taught the smallest move that the simulator scored better, a correction of the failed answer,
    where `group` teaches the right answer whatever the failure was."""
    if targets not in RETRY_TARGETS:
        raise ValueError(f"expert.retry_targets={targets!r}; choose one of {list(RETRY_TARGETS)}")
    trajs = _Trajectories.of(ro)
    best = _best_per_turn(trajs)
    kept = []
    for (p, k), i in sorted(best.items()):
        ex = ro.examples[p]
        kept.append((trajs.conversation(ex, int(ro.owner[i]), k, "", words) if k > 1 else ex, ro.texts[i]))
    if targets != "own":
        for p, ex in enumerate(ro.examples):
            kept += _retry_targets(trajs, best, p, ex, targets, words)
    return kept


def _best_per_turn(trajs: _Trajectories) -> dict[tuple[int, int], int]:
    """`(prompt, turn) -> row`: the highest `reward/total` among the rows that succeeded at that turn, the
    first of equals in the rollout's order of trajectories."""
    best: dict[tuple[int, int], int] = {}
    for t, turns in trajs.rows.items():
        for k, i in turns.items():
            key = (t // trajs.ro.group_size, k)
            if trajs.solved(i) and (key not in best or trajs.total(i) > trajs.total(best[key])):
                best[key] = i
    return best


def _retry_targets(
    trajs: _Trajectories, best: dict, p: int, ex: Example, targets: str, words: bool
) -> list[tuple[Example, str]]:
    """`select_turns`' `group` and `better` targets of prompt `p`: one conversation per distinct sequence of
    failed answers that no trajectory of `p` went on to solve, and is not already taught by `best`, with the
    group's best success (`group`) or the nearest better-scored answer (`better`) as its target."""
    ro = trajs.ro
    own = {k: i for (q, k), i in best.items() if q == p}  # turn -> this prompt's best success at it
    success = ro.texts[max(own.values(), key=lambda i: (trajs.total(i), -i))] if own else None
    members = [i for t in trajs.of_prompt(p) for i in trajs.rows[t].values()]
    seen = {trajs.answers_before(int(ro.owner[i]), k) for k, i in own.items() if k > 1}
    out = []
    for t in trajs.of_prompt(p):
        for k in sorted(trajs.rows[t])[1:]:  # a later turn: every earlier answer of t failed
            failed = trajs.answers_before(t, k)
            if failed in seen or any(trajs.solved(trajs.rows[t][j]) for j in range(1, k + 1)):
                continue  # taught already, or this run found its own success
            if targets == "better":
                answer = _nearer_better(trajs, ex.record, members, trajs.rows[t][k - 1], set(failed))
            else:
                answer = success
            if answer is None:
                continue
            seen.add(failed)
            out.append((trajs.conversation(ex, t, k, f"/{len(seen)}", words), answer))
    return out


def _nearer_better(
    trajs: _Trajectories, record: dict, members: list[int], last: int, failed: set[str]
) -> str | None:
    """`select_turns(targets="better")`: among rows `members` of one prompt, the answer nearest to row
    `last`'s (by the task's `action_value`) that scored a higher `reward/total`, is untruncated, parses and
    is not in `failed`; ties to the higher total. None if there is none."""
    ro, value = trajs.ro, task(record["task"]).action_value
    action = parse(record, ro.texts[last])
    if action is None:
        return None
    options = {}  # answer -> (distance, -total) of its last row in `members`; min() keeps the first of equals
    for i in members:
        text = ro.texts[i]
        if bool(ro.truncated[i]) or text in failed or trajs.total(i) <= trajs.total(last):
            continue
        other = parse(record, text)
        if other is not None:
            options[text] = (abs(value(other) - value(action)), -trajs.total(i))
    return min(options, key=options.get) if options else None


def prompt_id(example_id: str) -> str:
    """The training prompt's id of a kept example: a later turn's conversation adds `/turn<k>[/<j>]` at the
    end (only that suffix is cut, so an id that holds "/turn" elsewhere keeps it)."""
    return re.sub(r"/turn\d+(/\d+)?$", "", example_id)
