"""CPU MuJoCo vs MuJoCo Warp on the same seeds and actions: agreement of the success label, and speed.

Actions are drawn to cover both outcomes: for the numeric tasks half are uniform over the stated ranges
and half lie within 20% of a physically sound answer (so successes occur), for ``place`` every option.
"""

from __future__ import annotations

import time

import numpy as np

from embodied.envs import task
from embodied.envs.backend import warp_device
from embodied.envs.reward import env_reward
from embodied.tasks import LETTERS


def _ranges(name: str) -> np.ndarray:
    mod = task(name)
    return np.array([mod.FORCE_RANGE, mod.SPEED_RANGE] if name == "carry" else [mod.IMPULSE_RANGE])


def _rounded(name: str, x: np.ndarray):
    return (round(float(x[0]), 2), round(float(x[1]), 3)) if name == "carry" else round(float(x[0]), 4)


def random_action(name: str, rng: np.random.Generator):
    """An action drawn uniformly over the task's stated choices or ranges (it knows no physics)."""
    if name == "place":
        return int(rng.integers(len(task(name).OFFSETS_CM)))
    r = _ranges(name)
    return _rounded(name, rng.uniform(r[:, 0], r[:, 1]))


def sample_actions(name: str, record: dict, rng: np.random.Generator, k: int) -> list:
    """``k`` actions for ``record``: a mix of arbitrary and near-good ones (see the module docstring)."""
    if name == "place":
        return [int(a) for a in rng.permutation(np.resize(np.arange(5), k))]
    good, r = np.atleast_1d(task(name).good_action(record)), _ranges(name)
    near = [
        _rounded(name, np.clip(good * rng.uniform(0.8, 1.2, good.size), r[:, 0], r[:, 1])) for _ in range(k)
    ]
    return [random_action(name, rng) if i % 2 else near[i] for i in range(k)]


def answer_text(name: str, action) -> str:
    """A well-formed completion that answers ``action``."""
    if name == "place":
        body = LETTERS[action]
    elif name == "carry":
        body = f"{action[0]:.2f}, {action[1]:.3f}"
    else:
        body = f"{action:.4f}"
    return f"<think></think><answer>{body}</answer>"


def episodes(name: str, n: int, seed: int, difficulty: str, actions_per_episode: int = 4):
    """``(records, texts)`` for ``n`` answers on ``ceil(n / actions_per_episode)`` episodes."""
    rng = np.random.default_rng([seed, 17])
    records, actions = [], []
    for e in range(-(-n // actions_per_episode)):
        record, _ = task(name).make_episode(seed * 100_000 + e, difficulty, num_frames=0)
        for a in sample_actions(name, record, rng, actions_per_episode):
            records.append(record)
            actions.append(answer_text(name, a))
    return records[:n], actions[:n]


def _timed(texts: list[str], records: list[dict], backend: str) -> tuple[list[dict], float]:
    t0 = time.perf_counter()
    terms = env_reward(texts, records, backend)
    return terms, time.perf_counter() - t0


def parity(
    n_per_task: int = 64,
    seed: int = 0,
    difficulty: str = "easy",
    tasks=("place", "carry", "push"),
    warmup: bool = True,
) -> dict:
    """Success labels from both backends on identical episodes and answers, plus episodes/s of each.

    Timed end to end through :func:`embodied.envs.reward.env_reward` (parse, build, simulate, score). The Warp
    timing excludes kernel compilation (a first call on one episode per task when ``warmup``).
    """
    per_task, n_all, agree_all = {}, 0, 0
    for name in tasks:
        records, texts = episodes(name, n_per_task, seed, difficulty)
        if warmup:
            env_reward(texts[:1], records[:1], "warp")
        cpu, t_cpu = _timed(texts, records, "cpu")
        warp, t_warp = _timed(texts, records, "warp")
        labels = [(c["reward/success"], w["reward/success"]) for c, w in zip(cpu, warp)]
        agree = sum(c == w for c, w in labels)
        n = len(texts)
        per_task[name] = {
            "n": n,
            "agree": agree,
            "agree_rate": agree / n,
            "success_cpu": float(np.mean([c for c, _ in labels])),
            "success_warp": float(np.mean([w for _, w in labels])),
            "disagreements": [
                {"seed": r["meta"]["seed"], "answer": t, "cpu": c, "warp": w}
                for r, t, (c, w) in zip(records, texts, labels)
                if c != w
            ],
            "episodes_per_s": {"cpu": n / t_cpu, "warp": n / t_warp},
            "wall_s": {"cpu": t_cpu, "warp": t_warp},
        }
        n_all += n
        agree_all += agree
    return {
        "n": n_all,
        "agree": agree_all,
        "agree_rate": agree_all / n_all if n_all else 0.0,
        "warp_device": warp_device(),
        "difficulty": difficulty,
        "per_task": per_task,
    }
