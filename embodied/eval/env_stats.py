"""The figures of an interactive evaluation (`embodied.eval.env_loop.evaluate_env`'s rows): success and
reward terms per task, how the answers spread over episodes, success over turns and the direction of a
second answer, best-of-N and majority vote, and the markdown table of them all.

Pure functions of prediction rows and records (the episodes were executed before), as
`embodied.eval.stats` is for the MCQ side.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from embodied.envs import grid_action, parse, task
from embodied.eval.stats import majority_vote, pass_at_k, seed_interval, wilson_interval
from embodied.questions import parse_answer


def by_task(rows: Sequence[dict]) -> dict[str, list[dict]]:
    """``rows`` (records or prediction rows, each with a ``task``) grouped by task, in their order."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        groups[row["task"]].append(row)
    return groups


def summarize_env(predictions: Sequence[dict], records: dict | None = None) -> dict:
    """Success rate (95% Wilson interval), unparseable share and mean terms, overall and per task; with the
    ``records`` by id, also each task's answer spread (`action_spread`)."""
    groups = by_task(predictions)

    def stats(preds: list[dict]) -> dict:
        n = len(preds)
        wins = int(sum(p["terms"]["reward/success"] for p in preds))
        keys = sorted({k for p in preds for k in p["terms"]})
        means = {k: float(np.mean([p["terms"].get(k, 0.0) for p in preds])) for k in keys} if n else {}
        return {
            "n": n,
            "success": wins / n if n else None,  # none answered: no figure, not a 0 that reads as one
            "ci95": list(wilson_interval(wins, n)) if n else None,
            "unparseable": means.get("reward/unparseable", 0.0),
            "terms": means,
        }

    per_task = {t: stats(p) for t, p in sorted(groups.items())}
    if records is not None:
        for t, preds in groups.items():
            per_task[t]["spread"] = action_spread(preds, records)
    return stats(list(predictions)) | {"per_task": per_task}


def action_spread(predictions: Sequence[dict], records: dict) -> dict:
    """How the greedy answers of one task spread over its episodes: distinct answers, the entropy (bits)
    of the answer distribution, the standard deviation of the action as one number
    (``action_value``) and its Pearson correlation with the scene parameter that decides the outcome
    (``decisive``); NaN where undefined (fewer than three parsed answers, or a constant). For records in
    grid form (`embodied.envs.answer_form`) an answer is its letter (a constant letter is one distinct
    answer even where the options are relative to the episode, as push's multiples of the demo's impulse),
    and the correlation is between the chosen option's rank and the rank of the option nearest to the
    deciding parameter."""
    if not predictions:
        return {}
    mod = task(predictions[0]["task"])
    parsed = [(p["response"], records[p["id"]]) for p in predictions]
    parsed = [(parse(r, text), r, text) for text, r in parsed]
    parsed = [(a, r, text) for a, r, text in parsed if a is not None]
    grid = bool(parsed) and "answer_grid" in parsed[0][1]["meta"]
    if grid:
        ranks = [_grid_ranks(r, a, mod.action_value, mod.decisive(r)) for a, r, _ in parsed]
        values = np.array([x for x, _ in ranks], dtype=float)
        names = [repr(parse_answer(text)) for _, _, text in parsed]
    else:
        values = np.array([mod.action_value(a) for a, _, _ in parsed], dtype=float)
        names = [repr(a) for a, _, _ in parsed]
    counts = np.unique(names, return_counts=True)[1] if parsed else np.array([])
    p = counts / counts.sum() if counts.size else counts
    corr, constant = float("nan"), values.size == 0 or np.ptp(values) == 0
    if values.size >= 3 and not constant:
        if grid:
            decisive = np.array([y for _, y in ranks], dtype=float)
        else:
            decisive = np.array([mod.decisive(r) for _, r, _ in parsed], dtype=float)
        corr = float(np.corrcoef(values, decisive)[0, 1]) if np.ptp(decisive) > 0 else corr
    return {
        "distinct": int(counts.size),
        "entropy_bits": float(-(p * np.log2(p)).sum()) + 0.0 if counts.size > 1 else 0.0,
        "std": 0.0 if constant else float(values.std()),
        "corr_decisive": corr,
    }


def _grid_ranks(record: dict, action, value_of, decisive: float) -> tuple[float, float]:
    """For a record in grid form: the rank of ``action``'s value among the distinct values of the options,
    and the rank of the option nearest to ``decisive`` (in log space when every value is positive, as on
    push's geometric multiples), so a constant letter on options relative to the episode is a constant."""
    values = sorted({value_of(a) for a in (grid_action(x) for x in record["meta"]["answer_grid"])})
    v = np.array(values, dtype=float)
    if (v > 0).all() and decisive > 0:
        nearest = int(np.argmin(np.abs(np.log(v) - np.log(decisive))))
    else:
        nearest = int(np.argmin(np.abs(v - decisive)))
    return float(values.index(value_of(action))), float(nearest)


def turn_summary(predictions: Sequence[dict], turns: int) -> dict:
    """Per task and overall, for rows played as multi-turn episodes (`evaluate_env(turns=...)`):

    * ``greedy``: ``success@k`` (solved within the first k greedy turns) with its 95% Wilson interval over
      episodes, and ``calls`` (simulator calls per episode: executed turns);
    * with sampled trajectories: ``sampled``: ``success@k`` (mean over episodes of the share of sampled
      trajectories solved within k turns, 95% t interval over episodes) and its ``calls``; ``best_of@k``:
      single-turn best-of-k (the unbiased pass@k of the single-turn samples, same interval), the control
      with the same number of simulator calls (k per episode); ``paired``, for k >= 2, the per-episode
      differences ``sampled_turn<k>_minus_turn1`` (sampled success@k minus success@1) and
      ``sampled_turn<k>_minus_best_of_<k>`` (sampled success@k minus best-of-k): ``[mean, low, high]``, 95%
      t interval over episodes (`seed_interval`, not clipped).

    The sampled figures cover the rows that were sampled (``sampled_n``: `evaluate_env`'s
    ``sample_episodes``).
    """

    def block(rows: list[dict]) -> dict:
        n = len(rows)
        out: dict = {"n": n, "greedy": {}}
        for k in range(1, turns + 1):
            wins = int(sum(any(t["terms"]["reward/success"] for t in r["turns"][:k]) for r in rows))
            out["greedy"][f"success@{k}"] = {"rate": wins / n, "ci95": list(wilson_interval(wins, n))}
        out["greedy"]["calls"] = float(np.mean([_executed(r["turns"]) for r in rows]))
        rows = [r for r in rows if "sampled_turns" in r]  # the sampled figures: on the sampled episodes
        if rows:
            out["sampled_n"] = len(rows)
            sampled, best = {}, {}  # k -> per-episode value
            for k in range(1, turns + 1):
                sampled[k] = [
                    np.mean([any(t["success"] for t in traj[:k]) for traj in r["sampled_turns"]])
                    for r in rows
                ]
                best[k] = [
                    pass_at_k(len(r["sampled"]), int(sum(s["success"] for s in r["sampled"])), k)
                    for r in rows
                ]
            out["sampled"] = {f"success@{k}": _mean_ci(v) for k, v in sampled.items()}
            out["sampled"]["calls"] = float(
                np.mean([_executed(tr) for r in rows for tr in r["sampled_turns"]])
            )
            out["best_of"] = {f"best_of@{k}": _mean_ci(v) | {"calls": float(k)} for k, v in best.items()}
            diff = lambda a, b: list(seed_interval(np.subtract(a, b).tolist()))  # noqa: E731
            out["paired"] = {}
            for k in range(2, turns + 1):
                out["paired"][f"sampled_turn{k}_minus_turn1"] = diff(sampled[k], sampled[1])
                out["paired"][f"sampled_turn{k}_minus_best_of_{k}"] = diff(sampled[k], best[k])
        return out

    tasks = sorted({r["task"] for r in predictions})
    return block(list(predictions)) | {
        "per_task": {t: block([r for r in predictions if r["task"] == t]) for t in tasks}
    }


def _executed(turns: Sequence[dict]) -> int:
    """Simulator calls of a trajectory: its turns whose answer parsed."""
    return sum(1 for t in turns if not t.get("unparseable", t.get("terms", {}).get("reward/unparseable")))


def _mean_ci(values: Sequence[float]) -> dict:
    """Mean of per-episode values with a 95% t interval over episodes (`seed_interval`), clipped to [0, 1]."""
    m, lo, hi = seed_interval([float(v) for v in values])
    return {"rate": m, "ci95": [max(0.0, lo), min(1.0, hi)]}


def correction_summary(predictions: Sequence[dict], by_id: dict[str, dict]) -> dict:
    """Per task with ``CORRECTIONS`` (`embodied.envs`): does the greedy second answer move the way the first
    answer's failure asks? For every greedy trajectory whose turn 1 failed with a term of ``CORRECTIONS``
    and whose turn 2 parsed, the action coordinate of that term is compared across the two turns (parsed
    from the answers, lettered options included). Per term: ``n``, ``right`` (share that moved the right
    way, with its 95% Wilson interval ``ci95``) and ``repeated`` (share that did not move it). ``balanced``
    is the mean of ``right`` over the terms seen: a policy that ignores what happened and always moves one
    way scores 0.5 on a task with two opposite failures, one that repeats its answer 0."""
    out: dict = {}
    for name in sorted({r["task"] for r in predictions}):
        corrections = getattr(task(name), "CORRECTIONS", None)
        if not corrections:
            continue
        moves: dict[str, list[int]] = {term: [] for term in corrections}
        for row in predictions:
            turns = row.get("turns", [])
            if row["task"] != name or len(turns) < 2:
                continue
            record = by_id[row["id"]]
            first, second = (parse(record, t["response"]) for t in turns[:2])
            if first is None or second is None:
                continue
            for term, (coord, sign) in corrections.items():
                if turns[0]["terms"].get(term, 0.0) < 0:
                    a, b = (np.atleast_1d(np.asarray(x, dtype=float))[coord] for x in (first, second))
                    moves[term].append(int(np.sign(b - a) * sign))
        block: dict = {}
        for term, m in moves.items():
            right, n = sum(1 for v in m if v > 0), len(m)
            block[term.split("/", 1)[1]] = {
                "n": n,
                "right": right / n if n else None,
                "ci95": list(wilson_interval(right, n)) if n else None,
                "repeated": sum(1 for v in m if v == 0) / n if n else None,
            }
        seen = [b["right"] for b in block.values() if b["n"]]
        out[name] = {"terms": block, "balanced": float(np.mean(seen)) if seen else None}
    return out


def vote_action(name: str, actions: Sequence, lettered: bool | None = None):
    """The majority answer among parsed ``actions`` (None = unparseable, no vote): the most frequent option
    for a lettered question (a lettered task, or a numeric one asked as a grid: ``lettered``), the
    per-coordinate median for a numeric one; None if nothing parsed."""
    votes = [a for a in actions if a is not None]
    if lettered is None:
        lettered = not task(name).NUMERIC
    if not votes or lettered:
        return majority_vote(votes) if votes else None
    med = np.median(np.array(votes, dtype=float), axis=0)
    return tuple(round(float(x), 4) for x in med) if med.ndim else round(float(med), 4)


def test_time_compute(predictions: Sequence[dict], ks: Sequence[int], per_sample: dict) -> dict:
    """best_of@N and vote@N success, overall and per task, with the seconds per episode each costs."""

    def curve(rows) -> dict:
        out = {}
        for n in ks:
            best = [
                pass_at_k(len(r["sampled"]), int(sum(s["success"] for s in r["sampled"])), n) for r in rows
            ]
            out[f"best_of@{n}"] = float(np.mean(best))
            out[f"vote@{n}"] = float(np.mean([r[f"vote@{n}"] for r in rows]))
        return out

    tasks = sorted({r["task"] for r in predictions})
    return {
        "test_time": curve(predictions)
        | {"per_task": {t: curve([r for r in predictions if r["task"] == t]) for t in tasks}},
        "seconds_per_episode": {
            f"best_of@{n}": n * (per_sample["generate"] + per_sample["simulate"]) for n in ks
        }
        | {f"vote@{n}": n * per_sample["generate"] + per_sample["simulate"] for n in ks},
        "seconds_per_sample": per_sample,
    }


def _corr(spread: dict) -> str:
    value = spread.get("corr_decisive")
    return "" if value is None else "n/a" if value != value else f"{value:.2f}"


def env_markdown(result: dict, title: str = "") -> str:
    """A markdown table of an `evaluate_env` result: success, spread of the answers and, when sampled,
    best-of-N and majority vote with their seconds per episode; one row per task and one for all."""
    tt, ks = result.get("test_time"), result.get("settings", {}).get("k", [])
    head = [
        "task",
        "n",
        "success [95% CI]",
        "unparseable",
        "distinct answers",
        "corr. with deciding parameter",
    ]
    head += [f"best-of-{n}" for n in ks] + [f"vote-{n}" for n in ks]
    rows = []
    for name, s in [*result["per_task"].items(), ("**all**", result)]:
        spread = s.get("spread", {})
        if s["success"] is None:
            rows.append(f"| {name} | 0 | none answered |" + " |" * (len(head) - 3))
            continue
        cells = [name, str(s["n"]), f"{s['success']:.3f} [{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}]"]
        cells += [
            f"{s['unparseable']:.1%}",
            str(spread.get("distinct", "")),
            _corr(spread),
        ]
        if tt:
            c = tt if name == "**all**" else tt["per_task"][name]
            cells += [f"{c[f'best_of@{n}']:.3f}" for n in ks] + [f"{c[f'vote@{n}']:.3f}" for n in ks]
        rows.append("| " + " | ".join(cells) + " |")
    lines = ([f"### {title}", ""] if title else []) + [
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    lines += rows
    if tt:
        sec = result["seconds_per_episode"]
        lines += ["", "seconds per episode: " + ", ".join(f"{k} {v:.3f}" for k, v in sec.items())]
    sampling = result.get("settings", {}).get("sampling")
    notes = ([f"best-of-N and vote {sampling}"] if sampling else []) + list(result.get("notes", []))
    return "\n".join(lines + (["", *notes] if notes else [])) + "\n"
