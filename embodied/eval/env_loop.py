"""Policies on interactive episodes: greedy answers executed in MuJoCo, and test-time compute.

`evaluate_env` answers every held-out episode greedily, executes the parseable answers (all of a batch
at once on the warp backend) and scores them (`embodied.eval.env_stats.summarize_env`: per task the success
rate with a 95% interval, the share of unparseable answers, the mean of every failure term and how the
answers spread over episodes). With ``samples=n`` it also samples n answers per episode and reports, for
each N in ``k``:

* ``best_of@N``: sample N answers, execute each in the simulator, keep the best by ``reward/total``.
  Physics is the verifier (no reward model, no label). A success always totals more than any failure,
  so this is the chance that N of the n samples hold a success (the unbiased pass@k estimator).
* ``vote@N``: the majority answer of the first N samples (for numeric actions the per-coordinate
  median), executed once.

with the measured seconds per episode each costs (`embodied.eval.env_stats.test_time_compute`). This module
runs the episodes; `env_stats` turns its rows into figures, `env_baselines` holds the best constant answer a
clip-blind policy cannot beat and `env_video` renders an answered episode, as the MCQ side keeps `loop`,
`stats` and `baselines` apart.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from embodied.envs import answer_text, parse
from embodied.envs.config import ONE_TURN, Turns
from embodied.envs.reward import env_reward
from embodied.eval.answerer import LocalAnswerer
from embodied.eval.endpoint import Failure
from embodied.eval.env_stats import (
    correction_summary,
    summarize_env,
    test_time_compute,
    turn_summary,
    vote_action,
)
from embodied.eval.stats import resolve_k
from embodied.rl.rollout import sampling_seed


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
    desc: str = "eval env", engine=None,
) -> dict:  # fmt: skip
    """Greedy answers to ``examples`` (``embodied.data.load.Example``), scored by simulation (`EnvEval`
    says how); with ``how.samples`` > 0 also best-of-N and majority vote for each N in ``how.k`` (see the
    module docstring), on the first ``how.sample_episodes`` episodes of each task in ``examples`` order (0:
    on every episode), so the greedy figures can cover more episodes than the sampled ones cost;
    ``settings["sampled_episodes"]`` counts them.

    With ``how.turns`` > 1 every episode is also played as a multi-turn episode (`embodied.rl.episodes`):
    the greedy answer is turn 1, a failed one is followed by greedy later turns, each row keeping its turns
    in ``row["turns"]``; with ``samples``, also ``samples`` sampled trajectories per episode. ``engine``
    (`rollout.engine`; None: Hugging Face `generate` on the model) answers every turn.
    ``result["turns"]`` (`turn_summary`) holds the success after each turn beside best-of-N at the same
    simulator calls."""
    if how.samples:
        torch.manual_seed(how.seed)
    was_training = model.training
    model.eval()
    answerer = LocalAnswerer(model, processor, video, how.max_new_tokens, how.media, engine)
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
