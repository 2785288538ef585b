"""CPU MuJoCo vs MuJoCo Warp on the same seeds and actions: agreement of the success label, and speed.

Actions are drawn to cover both outcomes: for the numeric tasks half are uniform over the stated ranges
and half lie within 20% of a physically sound answer (so successes occur), for ``place`` every option.
"""

from __future__ import annotations

import time

import numpy as np

from embodied.envs import task
from embodied.envs.backend import run_jobs, warp_device
from embodied.envs.core import Job


def sample_actions(name: str, record: dict, rng: np.random.Generator, k: int) -> list:
    """``k`` actions for ``record``: a mix of arbitrary and near-good ones (see the module docstring)."""
    mod = task(name)
    if name == "place":
        return [int(a) for a in rng.permutation(np.resize(np.arange(5), k))]
    good = mod.good_action(record)
    out = []
    for i in range(k):
        if name == "carry":
            lo, hi = np.array([r[0] for r in (mod.FORCE_RANGE, mod.SPEED_RANGE)]), np.array(
                [r[1] for r in (mod.FORCE_RANGE, mod.SPEED_RANGE)]
            )
            x = rng.uniform(lo, hi) if i % 2 else np.clip(np.array(good) * rng.uniform(0.8, 1.2, 2), lo, hi)
            out.append((round(float(x[0]), 2), round(float(x[1]), 3)))
        else:
            lo, hi = mod.IMPULSE_RANGE
            x = rng.uniform(lo, hi) if i % 2 else float(np.clip(good * rng.uniform(0.8, 1.2), lo, hi))
            out.append(round(float(x), 4))
    return out


def episode_jobs(name: str, n: int, seed: int, difficulty: str, actions_per_episode: int = 4):
    """``(records, actions, jobs)`` for ``n`` actions on ``ceil(n / actions_per_episode)`` episodes."""
    mod, rng = task(name), np.random.default_rng([seed, 17])
    records, actions = [], []
    for e in range(-(-n // actions_per_episode)):
        record, _ = mod.make_episode(seed * 100_000 + e, difficulty, num_frames=0)
        for a in sample_actions(name, record, rng, actions_per_episode):
            records.append(record)
            actions.append(a)
    records, actions = records[:n], actions[:n]
    return records, actions, [mod.job(r, a) for r, a in zip(records, actions)]


def _timed(jobs: list[Job], backend: str) -> tuple[list, float]:
    t0 = time.perf_counter()
    traces = run_jobs(jobs, backend)
    return traces, time.perf_counter() - t0


def parity(
    n_per_task: int = 64, seed: int = 0, difficulty: str = "easy", tasks=("place", "carry", "push"), warmup: bool = True
) -> dict:
    """Success labels from both backends on identical episodes and actions, plus episodes/s of each.

    The Warp timing excludes kernel compilation (a first call on one episode per task when ``warmup``).
    """
    per_task, n_all, agree_all = {}, 0, 0
    for name in tasks:
        mod = task(name)
        records, actions, jobs = episode_jobs(name, n_per_task, seed, difficulty)
        if warmup:
            run_jobs(jobs[:1], "warp")
        cpu, t_cpu = _timed(jobs, "cpu")
        warp, t_warp = _timed(jobs, "warp")
        labels = [
            (mod.outcome(r, a, c)["reward/success"], mod.outcome(r, a, w)["reward/success"])
            for r, a, c, w in zip(records, actions, cpu, warp)
        ]
        agree = sum(c == w for c, w in labels)
        steps = jobs[0].n_steps
        per_task[name] = {
            "n": len(jobs),
            "agree": agree,
            "agree_rate": agree / len(jobs),
            "success_cpu": float(np.mean([c for c, _ in labels])),
            "success_warp": float(np.mean([w for _, w in labels])),
            "disagreements": [
                {"seed": r["meta"]["seed"], "action": a, "cpu": c, "warp": w}
                for r, a, (c, w) in zip(records, actions, labels)
                if c != w
            ],
            "steps_per_episode": steps,
            "episodes_per_s": {"cpu": len(jobs) / t_cpu, "warp": len(jobs) / t_warp},
            "wall_s": {"cpu": t_cpu, "warp": t_warp},
        }
        n_all += len(jobs)
        agree_all += agree
    return {
        "n": n_all,
        "agree": agree_all,
        "agree_rate": agree_all / n_all if n_all else 0.0,
        "warp_device": warp_device(),
        "difficulty": difficulty,
        "per_task": per_task,
    }
