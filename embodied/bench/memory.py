"""Memory: the plan of real architectures per GPU count, and the measured peak of the quickstart.

The plan (`bench.memory_architectures`, seconds, no allocation: `embodied.bench.memory_plan`) gives the
parameter counts, the FSDP2 units and the per-GPU bytes of weights, gradients and AdamW state under DDP and
FSDP2 for `bench.memory_gpus`. `bench.memory_quickstart=false` stops there.

The quickstart (generate -> eval -> SFT -> eval -> GRPO -> eval on the tiny model, whatever `policy.path`
says) runs in a child process with this run's config plus `bench.memory_overrides` (by default the real
batch sizes with fewer clips and steps). Two figures:

- `main_process_peak_rss_mb`: the child's own peak resident set (`ru_maxrss` from `wait4`), exact;
- `tree_peak_rss_mb`: the peak of the summed RSS of the child and its workers (simulation workers
  during generation), sampled every 50 ms, so a shorter spike can be missed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from embodied.config import PolicyConfig, as_schema, load_config, to_yaml


def _tree_rss(proc) -> int:
    import psutil

    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            total += p.memory_info().rss
    return total


def measure(cmd: list[str], log: Path, env: dict | None = None, interval: float = 0.05) -> dict:
    """Run `cmd` (output to `log`), sampling its process tree's RSS; returns peaks in MB, wall seconds and
    the exit code."""
    import psutil

    t0 = time.perf_counter()
    with log.open("w") as f:
        child = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)
        proc = psutil.Process(child.pid)
        peak = 0
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            with contextlib.suppress(psutil.NoSuchProcess):
                peak = max(peak, _tree_rss(proc))
            time.sleep(interval)
    child.returncode = os.waitstatus_to_exitcode(status)
    return {
        "main_process_peak_rss_mb": round(usage.ru_maxrss / 1024, 1),  # Linux reports KiB
        "tree_peak_rss_mb": round(peak / 2**20, 1),
        "wall_s": round(time.perf_counter() - t0, 1),
        "returncode": child.returncode,
    }


def run(cfg, out: Path, progress: bool = True) -> dict:
    """The plan of `bench.memory_architectures` (and of `policy.path` when it is `random:NAME`), then (unless
    `bench.memory_quickstart=false`) the
    quickstart with `bench.memory_overrides` in a child process and its peak memory."""
    from embodied.bench.memory_plan import memory_plan

    gpus = [int(n) for n in cfg.bench.memory_gpus]
    names = list(cfg.bench.memory_architectures)
    if cfg.policy.path.startswith("random:") and cfg.policy.path[7:] not in names:
        names.append(cfg.policy.path[7:])  # `bench memory policy.path=random:NAME` plans NAME too
    plan = {name: memory_plan(f"random:{name}", gpus) for name in names}
    result = {"benchmark": "memory", "plan": plan}
    if not cfg.bench.memory_quickstart:
        return result
    return result | measure_quickstart(cfg, out, progress)


def quickstart_config(cfg, out: Path):
    """The config of the measured quickstart: this run's core sections (no `bench`: the quickstart reads the
    core), with the default `policy` section (the tiny policy the quickstart is made for), then
    `bench.memory_overrides`, data and run folder under `out`."""
    overrides = [*cfg.bench.memory_overrides, f"data.root={out / 'data'}", f"run_dir={out / 'quickstart'}"]
    return load_config(None, overrides, base=dataclasses.replace(as_schema(cfg), policy=PolicyConfig()))


def measure_quickstart(cfg, out: Path, progress: bool = True) -> dict:
    """Run the quickstart with `bench.memory_overrides` in a child process and report its peak memory.

    The quickstart is the tiny policy's recipe: it runs with the default `policy` section whatever this
    run's `policy.*` says (`bench memory policy.path=random:qwen2.5-vl-3b` asks for the 3B's plan, not for a
    3B quickstart on this machine); a `policy.*` entry in `bench.memory_overrides` still applies."""
    measured = quickstart_config(cfg, out)  # fails early, here, on a bad override
    if progress and cfg.policy != measured.policy:
        print(f"measuring the quickstart on its own policy {measured.policy.path}, not {cfg.policy.path}")
    config_file = out / "quickstart_config.yaml"
    config_file.write_text(to_yaml(measured))
    cmd = [sys.executable, "-m", "embodied.cli", "quickstart", "--config", str(config_file), "--quiet"]
    if progress:
        print("measuring:", " ".join(cmd), flush=True)
    log = out / "quickstart.log"
    result = measure(cmd, log, env=os.environ.copy())
    if result["returncode"] != 0:
        tail = log.read_text()[-2000:]
        raise RuntimeError(f"quickstart failed (exit {result['returncode']}), see {log}:\n{tail}")
    summary_path = out / "quickstart" / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    return {
        "what": "embodied quickstart in a child process",
        "overrides": cfg.bench.memory_overrides,
        "config": {
            "n_train": measured.data.n_train,
            "n_val": measured.data.n_val,
            "n_test": measured.data.n_test,
            "sft_steps": measured.sft.steps,
            "sft_batch_size": measured.sft.batch_size,
            "grpo_steps": measured.grpo.steps,
            "grpo_prompts_x_group": [measured.grpo.prompts_per_step, measured.grpo.group_size],
            "eval_batch_size": measured.eval.batch_size,
            "frames": measured.data.clip.num_frames,
            "size": [measured.data.width, measured.data.height],
            "workers": measured.data.workers,
            "policy": measured.policy.path,
            "device": measured.policy.device,
            "threads": measured.threads,
        },
        **result,
        "quickstart_timings_s": summary.get("timings_s"),
        "parameters": summary.get("parameters"),
    }
