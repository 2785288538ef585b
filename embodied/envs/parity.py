"""CPU MuJoCo vs a batched backend (MuJoCo Warp or MJX) on the same seeds and actions: agreement of the
success label, and speed end to end through the reward (`embodied bench envs` times the physics alone, at
several batch sizes: embodied/bench/envs.py).

Each task chooses its own probe answers (``probe_actions``), covering both outcomes: every option of a
lettered task, or for a numeric one half uniform over the stated ranges and half within 20% of a
physically sound answer (so successes occur).
"""

from __future__ import annotations

import time

import numpy as np

from embodied.envs import answer_text, task, task_names
from embodied.envs.backend import backend_device
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
    backend: str = "warp",
) -> dict:
    """Success labels from the CPU backend and ``backend`` (warp or mjx) on identical episodes and answers,
    plus episodes/s of each, for ``tasks`` (default: every known task).

    Timed end to end through :func:`embodied.envs.reward.env_reward` (parse, build, simulate, score). The
    batched timing excludes compilation only when ``warmup`` (a first call on one episode per task: enough
    for Warp's kernels; MJX compiles again for every new batch size, so its first batch pays it).
    """
    per_task, n_all, agree_all = {}, 0, 0
    for name in task_names() if tasks is None else tasks:
        records, texts = episodes(name, n_per_task, seed, difficulty)
        if warmup:
            env_reward(texts[:1], records[:1], backend)
        cpu, t_cpu = _timed(texts, records, "cpu")
        other, t_other = _timed(texts, records, backend)
        labels = [(c["reward/success"], w["reward/success"]) for c, w in zip(cpu, other)]
        agree = sum(c == w for c, w in labels)
        n = len(texts)
        per_task[name] = {
            "n": n,
            "agree": agree,
            "agree_rate": agree / n,
            "success_cpu": float(np.mean([c for c, _ in labels])),
            f"success_{backend}": float(np.mean([w for _, w in labels])),
            "disagreements": [
                {"seed": r["meta"]["seed"], "answer": t, "cpu": c, backend: w}
                for r, t, (c, w) in zip(records, texts, labels)
                if c != w
            ],
            "episodes_per_s": {"cpu": n / t_cpu, backend: n / t_other},
            "wall_s": {"cpu": t_cpu, backend: t_other},
        }
        n_all += n
        agree_all += agree
    return {
        "n": n_all,
        "agree": agree_all,
        "agree_rate": agree_all / n_all if n_all else 0.0,
        "backend": backend,
        "device": backend_device(backend),
        "difficulty": difficulty,
        "per_task": per_task,
    }
