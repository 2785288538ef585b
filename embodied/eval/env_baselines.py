"""The baseline of interactive episodes: the best constant answer.

`best_constant` runs every answer of a grid on every episode: the success of the best single answer for all
episodes, the baseline a clip-blind policy cannot beat (`embodied.eval.baselines` holds the MCQ side's
shortcut baselines).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from tqdm.auto import tqdm

from embodied.envs import answer_form, answer_text, task
from embodied.envs.reward import env_reward
from embodied.eval.env_stats import by_task
from embodied.eval.stats import wilson_interval
from embodied.questions import LETTERS
from embodied.registry import carried, restore


def best_constant(
    records: Sequence[dict], backend: str = "cpu", progress: bool = False, workers: int = 1
) -> dict:
    """Per task, the one answer that succeeds on most of ``records`` (chosen on these same episodes, so an
    upper bound for any policy that ignores the clip), with its success rate and 95% interval: every
    action of the task's ``CONSTANT_GRID`` and, for records in grid form (`embodied.envs.answer_form`),
    also every letter (the same option on every episode; where options are relative to the episode, as
    push's multiples of the demo's stated impulse, a constant letter uses the question's text, so it can
    beat every constant number). ``number`` and ``grid`` keep the best of each kind. With ``workers`` > 1
    the episodes are split over that many spawned processes (the same answer, summed wins)."""
    tasks = by_task(records)
    n_options = {
        name: min(len(r["options"]) for r in recs)
        for name, recs in tasks.items()
        if task(name).NUMERIC and "answer_grid" in recs[0]["meta"]
    }
    if workers > 1 and len(records) > 1:
        import multiprocessing as mp

        chunks = [list(records[i::workers]) for i in range(min(workers, len(records)))]
        with mp.get_context("spawn").Pool(len(chunks), initializer=restore, initargs=(carried(),)) as pool:
            parts = pool.starmap(_constant_wins, [(c, backend, n_options) for c in chunks])
    else:
        parts = [_constant_wins(records, backend, n_options, progress)]
    out = {}
    for name, recs in sorted(tasks.items()):
        n, kinds = len(recs), {}
        grids = {"number": [task(name).describe(a) for a in task(name).CONSTANT_GRID]}
        if name in n_options:
            grids["grid"] = [f"option {LETTERS[k]}: {recs[0]['options'][k]}" for k in range(n_options[name])]
        for kind, said in grids.items():
            wins = np.sum([part[name][kind] for part in parts if name in part], axis=0).astype(int)
            best = int(np.argmax(wins))  # the first of the most successful
            kinds[kind] = (int(wins[best]), said[best])
        wins, said = max(kinds.values(), key=lambda x: x[0])
        out[name] = {"answer": said, "success": wins / n, "ci95": list(wilson_interval(wins, n)), "n": n} | {
            kind: {"answer": a, "success": w / n, "ci95": list(wilson_interval(w, n))}
            for kind, (w, a) in kinds.items()
        }
    return out


def _constant_wins(
    records: Sequence[dict], backend: str, n_options: dict[str, int], progress: bool = False
) -> dict[str, dict[str, list[int]]]:
    """`best_constant`'s counts on ``records``: per task, the successes of every ``CONSTANT_GRID`` action
    (``number``) and, for tasks in ``n_options``, of every letter (``grid``), in grid order."""
    out: dict[str, dict[str, list[int]]] = {}
    for name, recs in tqdm(sorted(by_task(records).items()), desc="best constant", disable=not progress):
        numeric = [answer_form(r, "number") for r in recs]
        out[name] = {"number": []}
        for action in task(name).CONSTANT_GRID:
            terms = env_reward([answer_text(name, action)] * len(recs), numeric, backend)
            out[name]["number"].append(int(sum(t["reward/success"] for t in terms)))
        if name in n_options:
            texts = [f"<think></think><answer>{LETTERS[k]}</answer>" for k in range(n_options[name])]
            out[name]["grid"] = [
                int(sum(t["reward/success"] for t in env_reward([text] * len(recs), recs, backend)))
                for text in texts
            ]
    return out
