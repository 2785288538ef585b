"""Our rewards as verl's and EasyR1's custom reward functions, for data written by `embodied export`.

verl (`reward.custom_reward_function.path=<this file>`, `.name=compute_score`): verl's loader
(`verl.trainer.ppo.reward.get_custom_reward_fn`) imports this file and its reward managers call
`compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=...)` once per response,
adding `reward.custom_reward_function.reward_kwargs` as keyword arguments. `compute_score_batch` is the
same for verl's legacy `batch` reward manager (`data_sources=, solution_strs=, ground_truths=, extra_infos=`).
EasyR1 (`worker.reward.reward_function=<this file>:easyr1_compute_score`, `REWARD_TYPE = "batch"`) calls
`easyr1_compute_score(reward_inputs)` with `response`, `response_length` and `ground_truth` per response.

Every call goes through the trainer's own reward: `embodied.rl.rewards.routed_rewards` (the rule-based MCQ
reward `mcq_reward`, and for interactive tasks `env_reward`: parse the action, execute it in MuJoCo, score
the outcome) checked by `embodied.rl.rewards.score`, which raises instead of scoring 0 when a reward fails.
The defaults are the trainer's (`grpo.accuracy_weight`, `grpo.format_weight`, `grpo.order_credit`,
`env.format_weight`, `env.backend`); pass others as reward kwargs. The ground truth is the record JSON that
`embodied export` writes (a bare answer letter also works for a multiple-choice question).

Only torch, numpy, mujoco and tqdm are imported (never transformers), so this runs in verl's environment
with `embodied` installed beside it without dependencies (scripts/setup_verl.sh).
"""

from __future__ import annotations

import json
import threading

from embodied.data.schema import upgrade
from embodied.rl.rewards import ENV_FORMAT_WEIGHT, routed_rewards, score

REWARD_NAME = "embodied"
REWARD_TYPE = "batch"
"""EasyR1 reads these two module attributes: `easyr1_compute_score` takes the whole batch."""

ACCURACY_WEIGHT = 1.0
FORMAT_WEIGHT = 0.5
ORDER_CREDIT = 0.0
BACKEND = "cpu"
"""The trainer's defaults (`GRPOConfig`, `EnvConfig`); tests/test_verl.py checks that they still agree."""

_lock = (
    threading.Lock()
)  # verl's reward loop calls from several threads; the outcome cache is not thread-safe


def record_from_ground_truth(ground_truth: str, data_source: str = "") -> dict:
    """The record `embodied export` wrote as ground truth; a bare letter makes a multiple-choice record
    (its family from `data_source` = `embodied/<family>`). Raises `ValueError` for anything else. Ground
    truths exported before issue 23 (a question's family under `task`) read as today's records."""
    text = str(ground_truth).strip()
    if text.startswith("{"):
        try:
            record = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"ground truth is not valid record JSON ({e}): {text[:80]!r}") from e
        named = isinstance(record, dict) and ("family" in record or "task" in record)
        if not named or "answer" not in record:
            raise ValueError(
                f"ground truth JSON lacks family (or task)/answer; re-export with `embodied export`: "
                f"{text[:80]!r}"
            )
        return upgrade(record)
    if len(text) == 1 and text.isalpha():
        family = data_source.split("/", 1)[1] if data_source.startswith("embodied/") else data_source
        return {"id": "?", "family": family or "?", "answer": text.upper(), "options": [], "meta": {}}
    raise ValueError(
        f"ground truth {text[:80]!r} is neither a record written by `embodied export` nor an answer letter"
    )


def score_responses(
    texts: list[str],
    records: list[dict],
    accuracy_weight: float = ACCURACY_WEIGHT,
    format_weight: float = FORMAT_WEIGHT,
    order_credit: float = ORDER_CREDIT,
    env_format_weight: float = ENV_FORMAT_WEIGHT,
    backend: str = BACKEND,
    timeout_s: float | None = 60.0,
) -> list[dict[str, float]]:
    """Our trainer's reward terms (`reward/total`, ...) for `texts[i]` answering `records[i]`; interactive
    answers of one call are simulated together."""
    reward_fn = routed_rewards(backend, env_format_weight, accuracy_weight, format_weight, order_credit)
    with _lock:
        return score(reward_fn, list(texts), list(records), timeout_s)


def _summary(terms: dict[str, float]) -> dict[str, float]:
    """verl's result dict: `score` and the same extra keys for every kind of record (verl stacks them)."""
    acc = terms.get("reward/accuracy", terms.get("reward/success", 0.0))
    return {"score": float(terms["reward/total"]), "acc": float(acc), "format": float(terms["reward/format"])}


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict | None = None,
    reward_router_address: str | None = None,
    reward_model_tokenizer=None,
    **weights: float | str,
) -> dict[str, float]:
    """verl's custom reward: `{"score": reward/total, "acc": accuracy or success, "format"}` for one response.

    `weights`: `accuracy_weight`, `format_weight`, `order_credit`, `env_format_weight`, `backend` (verl's
    `reward_kwargs`); any other name is an error. The reward-model arguments verl may add are ignored.
    """
    record = record_from_ground_truth(ground_truth, data_source)
    return _summary(score_responses([solution_str], [record], **weights)[0])


def compute_score_batch(
    data_sources: list[str],
    solution_strs: list[str],
    ground_truths: list[str],
    extra_infos: list[dict] | None = None,
    **weights: float | str,
) -> list[dict[str, float]]:
    """`compute_score` over a batch (verl's `batch` reward manager): interactive answers simulate together."""
    records = [record_from_ground_truth(g, s) for g, s in zip(ground_truths, data_sources, strict=True)]
    return [_summary(t) for t in score_responses(list(solution_strs), records, **weights)]


def easyr1_compute_score(reward_inputs: list[dict], **weights: float | str) -> list[dict[str, float]]:
    """EasyR1's batch reward: `{"overall", "format", "accuracy"}` per `{"response", "ground_truth", ...}`."""
    records = [record_from_ground_truth(r["ground_truth"]) for r in reward_inputs]
    terms = score_responses([r["response"] for r in reward_inputs], records, **weights)
    return [
        {"overall": s["score"], "format": s["format"], "accuracy": s["acc"]} for s in map(_summary, terms)
    ]
