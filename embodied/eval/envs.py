"""Policies on interactive episodes: greedy answers executed in MuJoCo, success rates, test-time compute,
rollout videos.

`evaluate_env` answers every held-out episode greedily, executes the parseable answers (all of a batch
at once on the warp backend) and reports per task the success rate with a 95% interval, the share of
unparseable answers, the mean of every failure term, and how the answers spread over episodes (the
spread of the action and its correlation with the scene parameter that decides the outcome, so that a
policy answering one constant shows as one). With ``samples=n`` it also samples n answers per episode
and reports, for each N in ``k``:

* ``best_of@N``: sample N answers, execute each in the simulator, keep the best by ``reward/total``.
  Physics is the verifier (no reward model, no label). A success always totals more than any failure,
  so this is the chance that N of the n samples hold a success (the unbiased pass@k estimator).
* ``vote@N``: the majority answer of the first N samples (for numeric actions the per-coordinate
  median), executed once.

with the measured seconds per episode each costs. `best_constant` runs every answer of a grid on every
episode: the success of the best single answer for all episodes, the baseline a clip-blind policy
cannot beat. `rollout_video` renders one answered episode: the clip the policy saw, then the physics of
its answer, with the answer and the outcome drawn on it.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from embodied.envs import action_seconds, answer_form, answer_text, grid_action, parse, render_action, task
from embodied.envs.config import ONE_TURN, Turns
from embodied.envs.reward import env_reward
from embodied.eval.answerer import LocalAnswerer
from embodied.eval.endpoint import Failure
from embodied.eval.stats import majority_vote, pass_at_k, resolve_k, seed_interval, wilson_interval
from embodied.questions import LETTERS, parse_answer
from embodied.registry import carried, restore
from embodied.rl.rollout import sampling_seed


def by_task(rows: Sequence[dict]) -> dict[str, list[dict]]:
    """``rows`` (records or prediction rows, each with a ``task``) grouped by task, in their order."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        groups[row["task"]].append(row)
    return groups


def check_sample_episodes(n: int) -> None:
    """Fail at once on a negative `env_feedback.test_time_episodes` (`evaluate_env`'s ``sample_episodes``)."""
    if not isinstance(n, int) or n < 0:
        raise ValueError(
            f"env_feedback.test_time_episodes={n!r}: the test-time samples' episodes per task must be an "
            "integer >= 0 (0: every episode)"
        )


@dataclass(frozen=True)
class EnvEval:
    """How `evaluate_env` answers and scores interactive episodes: the physics `backend` and
    `format_weight` of the reward (`env.backend`, `env.format_weight`), `batch_size` episodes at a time
    with at most `max_new_tokens` tokens an answer, shown as `media` (`eval.media`); with ``samples`` > 0
    also best-of-N and majority vote for each N in ``k`` at ``temperature`` (seeded by ``seed``), on the
    first ``sample_episodes`` episodes of each task (0: every one); ``turns`` (`Turns.of(cfg.env)`) how
    episodes are played over turns (later turns are greedy: its retry sampling is for training)."""

    backend: str = "cpu"
    batch_size: int = 32
    max_new_tokens: int = 48
    format_weight: float = 0.2
    samples: int = 0
    k: Sequence[int] = ()
    temperature: float = 1.0
    seed: int = 0
    turns: Turns = ONE_TURN
    sample_episodes: int = 0
    media: str = "auto"

    @classmethod
    def of(cls, cfg, **changes) -> EnvEval:
        """`embodied eval`'s settings from a whole config (`embodied.config.Config`): its `eval` section's
        batch, token budget, samples, k, temperature and media, the `env` section's backend, format weight
        and turns, and the run's seed; `changes` replace any of them."""
        e = cfg.eval
        how = cls(cfg.env.backend, e.batch_size, e.max_new_tokens, cfg.env.format_weight, e.samples, e.k)
        how = dataclasses.replace(how, temperature=e.temperature, seed=cfg.seed, turns=Turns.of(cfg.env))
        return dataclasses.replace(how, media=e.media, **changes)


@torch.no_grad()
def evaluate_env(
    model, processor, examples: Sequence, video, how: EnvEval = EnvEval(), progress: bool = False,
    desc: str = "eval env",
) -> dict:  # fmt: skip
    """Greedy answers to ``examples`` (``embodied.data.load.Example``), scored by simulation (`EnvEval`
    says how); with ``how.samples`` > 0 also best-of-N and majority vote for each N in ``how.k`` (see the
    module docstring), on the first ``how.sample_episodes`` episodes of each task in ``examples`` order (0:
    on every episode), so the greedy figures can cover more episodes than the sampled ones cost;
    ``settings["sampled_episodes"]`` counts them.

    With ``how.turns`` > 1 every episode is also played as a multi-turn episode (`embodied.rl.episodes`):
    the greedy answer is turn 1, a failed one is followed by greedy later turns, each row keeping its turns
    in ``row["turns"]``; with ``samples``, also ``samples`` sampled trajectories per episode.
    ``result["turns"]`` (`turn_summary`) holds the success after each turn beside best-of-N at the same
    simulator calls."""
    if how.samples:
        torch.manual_seed(how.seed)
    was_training = model.training
    model.eval()
    answerer = LocalAnswerer(model, processor, video, how.max_new_tokens, how.media)
    try:
        return evaluate_env_answers(answerer, examples, how, progress, desc)
    finally:
        model.train(was_training)


def evaluate_env_answers(
    answerer, examples: Sequence, how: EnvEval = EnvEval(), progress: bool = False, desc: str = "eval env"
) -> dict:
    """`evaluate_env` with any answer source (`embodied.eval.answerer`: a local model or a served one, which
    holds its own token budget and media).

    An episode any of whose answers could not be obtained (a request that failed after its retries) is
    listed under ``failed`` (id and error) and left out of every figure: ``n`` counts the episodes answered,
    ``requested`` all of them."""
    samples, turns, backend, format_weight = how.samples, how.turns, how.backend, how.format_weight
    ks = resolve_k(samples, how.k)
    check_sample_episodes(how.sample_episodes)
    predictions, seconds = [], {"generate": 0.0, "simulate": 0.0}
    everything = ([], list(range(len(examples))))
    sampled_part, greedy_part = _split_sampled(examples, how.sample_episodes) if samples else everything
    bar = tqdm(total=len(examples), desc=desc, unit="episode", disable=not progress)
    for part, n_samples in ((sampled_part, samples), (greedy_part, 0)):
        for start in range(0, len(part), how.batch_size):
            chunk = [examples[i] for i in part[start : start + how.batch_size]]
            seeds = [sampling_seed(how.seed, start + i) for i in range(len(chunk))]
            predictions += _answer_batch(answerer, chunk, how, n_samples, seeds, seconds)
            bar.update(len(chunk))
    bar.close()
    rank = {i: r for r, i in enumerate(sampled_part + greedy_part)}
    predictions = [predictions[rank[i]] for i in range(len(examples))]  # back in the order of `examples`
    failed = [
        {"id": r["id"], "task": r["task"], "error": r["failed"]} for r in predictions if r.get("failed")
    ]
    predictions = [r for r in predictions if not r.get("failed")]
    by_id = {e.record["id"]: e.record for e in examples}
    result = summarize_env(predictions, by_id) | {"requested": len(examples), "failed": failed}
    if samples:
        sampled = [row for row in predictions if "sampled" in row]
        if not _greedy_server(answerer, examples, how, sampled):
            _vote(sampled, by_id, ks, backend, format_weight)
            per_sample = {key: v / (max(1, len(sampled)) * samples) for key, v in seconds.items()}
            result |= test_time_compute(sampled, ks, per_sample)
        result["settings"] = {"samples": samples, "k": ks, "temperature": how.temperature, "seed": how.seed,
                              "sampled_episodes": len(sampled)}  # fmt: skip
    result["settings"] = result.get("settings", {}) | answerer.settings()
    if turns.n > 1 and predictions:  # none answered: no per-turn figures
        result["turns"] = turn_summary(predictions, turns.n)
        result["turns"]["corrections"] = correction_summary(predictions, by_id)
    return result | {"predictions": predictions}


def _greedy_server(answerer, examples: Sequence, how: EnvEval, sampled: Sequence[dict]) -> bool:
    """True when the answer source says its samples are not samples (a served model whose server answers
    greedily whatever the temperature, `EndpointAnswerer.check_sampling`): best-of-N and vote are then
    unavailable, with the reason in `settings["sampling"]`, never numbers."""
    if not sampled or not hasattr(answerer, "check_sampling"):
        return False
    texts = [[x["response"] for x in row["sampled"]] for row in sampled]
    first = next(e for e in examples if e.record["id"] == sampled[0]["id"])
    seed = sampling_seed(how.seed, 0)
    return bool(answerer.check_sampling(first.record, first.clip, seed, texts, how.temperature))


def _split_sampled(examples: Sequence, per_task: int) -> tuple[list[int], list[int]]:
    """Indices of ``examples``: the first ``per_task`` of each task (every one when 0), then the rest."""
    seen: dict[str, int] = defaultdict(int)
    first, rest = [], []
    for i, e in enumerate(examples):
        name = e.record["task"]
        (first if not per_task or seen[name] < per_task else rest).append(i)
        seen[name] += 1
    return first, rest


def _answer_batch(answerer, chunk, how: EnvEval, samples: int, seeds, seconds: dict) -> list[dict]:
    """`evaluate_env`'s rows for one batch: the greedy answer scored, with ``how.turns`` > 1 its greedy
    trajectory, and with ``samples`` the sampled answers (and trajectories), ``seeds`` one per episode.
    An episode any of whose answers could not be obtained (a failed request) is a row with ``failed``."""
    backend, format_weight, temperature = how.backend, how.format_weight, how.temperature
    turns = how.turns.evaluation()  # later turns drawn as the first: env.retry_* are for training
    records, clips = [e.record for e in chunk], [e.clip for e in chunk]
    texts = answerer.greedy(records, clips)
    lost = {
        i: {"id": records[i]["id"], "task": records[i]["task"], "failed": x.error}
        for i, x in enumerate(texts)
        if isinstance(x, Failure)
    }
    keep = [i for i in range(len(chunk)) if i not in lost]
    chunk, records = [chunk[i] for i in keep], [records[i] for i in keep]
    clips, texts, seeds = [clips[i] for i in keep], [texts[i] for i in keep], [seeds[i] for i in keep]
    terms = env_reward(texts, records, backend, format_weight) if records else []
    rows = [
        {"id": rec["id"], "task": rec["task"], "response": text, "terms": t}
        for rec, text, t in zip(records, texts, terms)
    ]

    def reward_fn(texts, recs):
        return env_reward(texts, recs, backend, format_weight)

    if turns.n > 1 and rows:
        greedy = answerer.play(chunk, reward_fn, turns, first=(texts, terms))
        for row, traj in zip(rows, greedy.per_trajectory()):
            _keep_turns(row, traj, "turns")
        if samples:
            temps = torch.full((len(chunk) * samples,), float(temperature))
            t0 = time.perf_counter()  # sampled turn 1 is drawn here (the samples below reuse it)
            trajs = answerer.play(chunk, reward_fn, turns, samples, temps, seeds).per_trajectory()
            seconds["generate"] += time.perf_counter() - t0
            for i, row in enumerate(rows):
                _keep_turns(row, trajs[i * samples : (i + 1) * samples], "sampled_turns")
    if samples and rows:
        t0 = time.perf_counter()
        sampled = answerer.sample(records, clips, samples, temperature, seeds)
        seconds["generate"] += time.perf_counter() - t0
        for row, texts in zip(rows, sampled):
            if any(isinstance(t, Failure) for t in texts):
                row["failed"] = next(t for t in texts if isinstance(t, Failure)).error
            row["sampled"] = [{"response": t if isinstance(t, str) else ""} for t in texts]
        _sample_terms(records, rows, backend, format_weight, seconds)
    answered = iter(rows)  # back in the chunk's order, the failed episodes in their places
    return [lost[i] if i in lost else next(answered) for i in range(len(lost) + len(rows))]


def _keep_turns(row: dict, traj, key: str) -> None:
    """Store a trajectory (``turns``) or a list of sampled ones (``sampled_turns``) on ``row``; a trajectory
    that is a `Failure` (a request of a later turn failed) marks the row failed."""
    trajs = traj if key == "sampled_turns" else [traj]
    bad = [t for t in trajs if isinstance(t, Failure)]
    if bad:
        row["failed"] = bad[0].error
        trajs = [[] if isinstance(t, Failure) else t for t in trajs]
    if key == "turns":
        row["turns"] = [{"response": x, "terms": t} for x, t in trajs[0]]
    else:
        row["sampled_turns"] = [
            [{"success": t["reward/success"], "unparseable": t["reward/unparseable"]} for _, t in tr]
            for tr in trajs
        ]


def _executed(turns: Sequence[dict]) -> int:
    """Simulator calls of a trajectory: its turns whose answer parsed."""
    return sum(1 for t in turns if not t.get("unparseable", t.get("terms", {}).get("reward/unparseable")))


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


def _mean_ci(values: Sequence[float]) -> dict:
    """Mean of per-episode values with a 95% t interval over episodes (`seed_interval`), clipped to [0, 1]."""
    m, lo, hi = seed_interval([float(v) for v in values])
    return {"rate": m, "ci95": [max(0.0, lo), min(1.0, hi)]}


def _sample_terms(records, rows, backend, format_weight, seconds) -> None:
    """Execute every sampled answer (the verifier's work for best-of-N)."""
    t0 = time.perf_counter()
    texts = [s["response"] for row in rows for s in row["sampled"]]
    recs = [rec for rec, row in zip(records, rows) for _ in row["sampled"]]
    terms = iter(env_reward(texts, recs, backend, format_weight))
    for row in rows:
        for s in row["sampled"]:
            t = next(terms)
            s["success"], s["total"] = t["reward/success"], t["reward/total"]
    seconds["simulate"] += time.perf_counter() - t0


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


def _vote(predictions, records: dict, ks, backend, format_weight) -> None:
    """``row["vote@N"]``: the success of executing the majority answer of the first N samples."""
    jobs = []
    for row in predictions:
        rec = records[row["id"]]
        actions = [parse(rec, s["response"]) for s in row["sampled"]]
        lettered = bool(rec["options"])
        for n in ks:
            action = vote_action(row["task"], actions[:n], lettered)
            text = answer_text(row["task"], action, rec) if action is not None else ""
            jobs.append((row, n, text))
    terms = env_reward(
        [t for _, _, t in jobs], [records[row["id"]] for row, _, _ in jobs], backend, format_weight
    )
    for (row, n, _), t in zip(jobs, terms):
        row[f"vote@{n}"] = t["reward/success"]


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
