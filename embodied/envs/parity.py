"""CPU MuJoCo vs MuJoCo Warp on the same seeds and actions: agreement of the success label, and speed.

Each task chooses its own probe answers (``probe_actions``), covering both outcomes: every option of a
lettered task, or for a numeric one half uniform over the stated ranges and half within 20% of a
physically sound answer (so successes occur).
"""

from __future__ import annotations

import time

import numpy as np

from embodied.envs import answer_text, task, task_names
from embodied.envs.backend import warp_device
from embodied.envs.reward import env_reward


def episodes(name: str, n: int, seed: int, difficulty: str, actions_per_episode: int = 4):
    """``(records, texts)`` for ``n`` answers on ``ceil(n / actions_per_episode)`` episodes."""
    rng = np.random.default_rng([seed, 17])
    records, actions = [], []
    for e in range(-(-n // actions_per_episode)):
        record, _ = task(name).make_episode(seed * 100_000 + e, difficulty, num_frames=0)
        for a in task(name).probe_actions(record, rng, actions_per_episode):
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
    tasks=None,
    warmup: bool = True,
) -> dict:
    """Success labels from both backends on identical episodes and answers, plus episodes/s of each, for
    ``tasks`` (default: every known task).

    Timed end to end through :func:`embodied.envs.reward.env_reward` (parse, build, simulate, score). The Warp
    timing excludes kernel compilation (a first call on one episode per task when ``warmup``).
    """
    per_task, n_all, agree_all = {}, 0, 0
    for name in task_names() if tasks is None else tasks:
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
