"""`embodied bench envs`: the physics of the simulator reward, CPU MuJoCo against the batched backends.

Per task and batched backend (`bench.env_backends`: mjx, warp), at each batch size (`bench.env_batches`):
the same answers to the same episodes (`embodied.envs.parity.episodes`: half near a sound answer, half
uniform, every option of a lettered task) are built into jobs once, then simulated as one batch of worlds.
Reported, in `run_dir/bench_envs.json` (and `bench_envs_partial.json` after every cell, for a run that is
cut off):

* episodes/s of the physics alone (`simulate_jobs`: the batch's fields and states in, one trace per episode
  out), the first call's extra time (`compile_s`: jit / kernel compilation, excluded from episodes/s) and
  the speed-up over CPU MuJoCo;
* agreement of the success label with CPU MuJoCo on the first `bench.env_episodes` answers of the batch
  (the CPU backend simulates those, one after another, for its own episodes/s);
* the devices: JAX's or Warp's device name, the CPU count and processor, the versions.

Batch sizes run largest first, so a run cut short still has the figure that matters most. A backend whose
package is missing is reported as not installed (the CPU figures still come). Settings: `env.tasks`,
`env.difficulty`, `bench.env_episodes`, `bench.env_backends`, `bench.env_batches`, `seed`.
"""

from __future__ import annotations

import contextlib
import importlib.metadata as md
import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from embodied.environment import stamped
from embodied.envs import parse, task
from embodied.envs.backend import BACKENDS, backend_device, simulate_jobs
from embodied.envs.parity import episodes

GPU_BATCHES = (1, 16, 256, 4096)
CPU_BATCHES = (1, 4, 16)
"""`bench.env_batches` when it is empty: the GPU sizes where the backend runs on a GPU, else the CPU ones."""


def batch_sizes(spec, on_gpu: bool) -> list[int]:
    """The batch sizes to time, largest first: ``spec`` (ints, or one comma-separated string) or, when empty,
    `GPU_BATCHES` / `CPU_BATCHES`. A size below 1 or not a whole number is an error."""
    if isinstance(spec, str):
        spec = [p for p in spec.replace(" ", "").split(",") if p]
    values = list(spec) or list(GPU_BATCHES if on_gpu else CPU_BATCHES)
    out = []
    for v in values:
        try:
            n = int(v)
        except (TypeError, ValueError):
            n = 0
        if n < 1 or str(n) != str(v).strip():
            raise ValueError(f"bench.env_batches: {v!r} is not a batch size (a whole number >= 1)")
        out.append(n)
    return sorted(set(out), reverse=True)


def _versions() -> dict:
    out = {}
    for dist in ("mujoco", "mujoco-mjx", "jax", "jaxlib", "mujoco-warp", "warp-lang"):
        with contextlib.suppress(md.PackageNotFoundError):
            out[dist] = md.version(dist)
    return out


def _labels(name: str, records: list[dict], actions: list, traces) -> list[float]:
    return [task(name).outcome(r, a, t)["reward/success"] for r, a, t in zip(records, actions, traces)]


def _timed(jobs, backend: str):
    t0 = time.perf_counter()
    traces = simulate_jobs(jobs, backend)
    return traces, time.perf_counter() - t0


def _backends(names: list[str]) -> dict:
    out = {}
    for b in names:
        if b not in BACKENDS or b == "cpu":
            raise ValueError(f"bench.env_backends: {b!r}; choose among {[x for x in BACKENDS if x != 'cpu']}")
        try:
            device = backend_device(b)
        except ImportError as e:
            out[b] = {"status": "not installed", "reason": str(e)}
            continue
        out[b] = {"status": "ran", "device": device, "gpu": device.startswith(("cuda", "gpu"))}
    return out


@dataclass
class _Answers:
    """One task's answers built into jobs, and the CPU backend's labels for the first ``len(labels)``."""

    jobs: list
    actions: list
    records: list[dict]
    texts: list[str]
    labels: list[float]


def _cell(wall: float, first: float, steps: int, cpu: dict, ans: _Answers, labels: list[float]) -> dict:
    n, k = len(labels), min(len(labels), len(ans.labels))
    agree = [i for i in range(k) if labels[i] == ans.labels[i]]
    return {
        "n": n,
        "wall_s": wall,
        "compile_s": max(first - wall, 0.0),
        "episodes_per_s": n / wall,
        "steps_per_s": n * steps / wall,
        "speedup_vs_cpu": (n / wall) / cpu["episodes_per_s"] if cpu["n"] else None,
        "success": float(np.mean(labels)),
        "compared": k,
        "agree": len(agree),
        "agree_rate": len(agree) / k if k else None,
        "disagreements": [
            {
                "seed": ans.records[i]["meta"]["seed"],
                "answer": ans.texts[i],
                "cpu": ans.labels[i],
                "batched": labels[i],
            }
            for i in range(k)
            if labels[i] != ans.labels[i]
        ],
    }


def measure(
    tasks: list[str],
    backends: list[str],
    batches,
    cpu_episodes: int = 64,
    seed: int = 0,
    difficulty: str = "easy",
    on_cell=None,
) -> dict:
    """The bench's result (module docstring); ``on_cell(result)`` is called after every measured cell."""
    result = {
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()},
        "versions": _versions(),
        "difficulty": difficulty,
        "seed": seed,
        "cpu_episodes": cpu_episodes,
        "backends": _backends(backends),
        "per_task": {},
        "complete": False,
    }
    ran = [b for b, r in result["backends"].items() if r["status"] == "ran"]
    sizes = {b: batch_sizes(batches, result["backends"][b]["gpu"]) for b in ran}
    for b in ran:
        result["backends"][b]["batches"] = sizes[b]
    n_max = max([cpu_episodes, *(s[0] for s in sizes.values())])
    built: dict[str, _Answers] = {}
    report = on_cell or (lambda r: None)
    for size in sorted({s for v in sizes.values() for s in v} | {0}, reverse=True):
        for name in tasks:
            if name not in built:  # the first (largest) batch of this task: build it, time the CPU
                built[name], result["per_task"][name] = _build(name, n_max, cpu_episodes, seed, difficulty)
                result["per_task"][name] |= {b: {} for b in ran}
                report(result)
            ans, row = built[name], result["per_task"][name]
            for b in [b for b in ran if size in sizes[b]]:
                first = _timed(ans.jobs[:size], b)[1]
                traces, wall = _timed(ans.jobs[:size], b)
                labels = _labels(name, ans.records[:size], ans.actions[:size], traces)
                row[b][str(size)] = _cell(wall, first, row["steps_per_episode"], row["cpu"], ans, labels)
                report(result)
    result["agreement"] = _agreement(result, ran)
    result["complete"] = True
    return result


def _build(name: str, n: int, cpu_episodes: int, seed: int, difficulty: str) -> tuple[_Answers, dict]:
    """Jobs for ``n`` answers of task ``name``; the CPU backend's figures on the first ``cpu_episodes``."""
    t0 = time.perf_counter()
    records, texts = episodes(name, n, seed, difficulty)
    actions = [parse(r, t) for r, t in zip(records, texts)]
    jobs = [task(name).job(r, a) for r, a in zip(records, actions)]
    build = time.perf_counter() - t0
    k = min(cpu_episodes, n)
    traces, wall = _timed(jobs[:k], "cpu")
    labels = _labels(name, records[:k], actions[:k], traces)
    cpu = {
        "n": k,
        "wall_s": wall,
        "episodes_per_s": k / wall if k else None,
        "steps_per_s": k * jobs[0].n_steps / wall if k else None,
        "success": float(np.mean(labels)) if k else None,
    }
    row = {"steps_per_episode": jobs[0].n_steps, "build_s_per_episode": build / n, "cpu": cpu}
    return _Answers(jobs, actions, records, texts, labels), row


def _agreement(result: dict, ran: list[str]) -> dict:
    """Per backend, over tasks: the label agreement of each task's largest batch."""
    out = {}
    for b in ran:
        n = agree = 0
        for row in result["per_task"].values():
            if row.get(b):
                top = row[b][str(max(int(s) for s in row[b]))]
                n, agree = n + top["compared"], agree + top["agree"]
        out[b] = {"compared": n, "agree": agree, "agree_rate": agree / n if n else None}
    return out


def run(cfg, out: Path, progress: bool = True) -> dict:
    env, partial = cfg.env, Path(out) / "bench_envs_partial.json"
    result = measure(
        list(env.tasks),
        list(cfg.bench.env_backends),
        cfg.bench.env_batches,
        cfg.bench.env_episodes,
        cfg.seed,
        env.difficulty,
        on_cell=lambda r: partial.write_text(json.dumps(stamped(r), indent=2)),
    )
    if progress:
        print(summary(result))
    return result


def summary(result: dict) -> str:
    """One line per task, backend and batch size."""
    lines = [f"machine: {result['machine']['cpus']} CPUs ({result['machine']['processor']})"]
    for b, r in result["backends"].items():
        lines.append(f"{b}: " + (r["device"] if r["status"] == "ran" else f"not installed ({r['reason']})"))
    for name, row in result["per_task"].items():
        c = row["cpu"]
        lines.append(f"{name:6s} cpu      n={c['n']:5d} episodes/s {c['episodes_per_s']:9.1f}")
        for b in result["backends"]:
            for size, cell in sorted(row.get(b, {}).items(), key=lambda kv: int(kv[0])):
                lines.append(
                    f"{name:6s} {b:4s} B={int(size):5d} episodes/s {cell['episodes_per_s']:9.1f} "
                    f"({cell['speedup_vs_cpu']:.2f}x cpu), compile {cell['compile_s']:.1f} s, "
                    f"labels agree {cell['agree']}/{cell['compared']}"
                )
    return "\n".join(lines)
