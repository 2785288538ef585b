"""`embodied bench quickstart --against REF`: this checkout's quickstart against another commit's, alternated.

Speed claims on a shared machine mean something only as ratios measured side by side. REF is checked out
into a git worktree (`git worktree add --detach`, under `run_dir`) and both quickstarts run in child
processes with the same interpreter, config overrides and thread count, alternately: REF, this, REF, this,
... (`bench.quickstart_runs` each). "This" is the checkout's HEAD, also run from a worktree, so edits made
while the bench runs change nothing. Each run starts from a fresh data folder, so generation is timed too.
Reported: every run's `wall_s`, stage timings and test accuracy, the median of each side, the ratio of the
medians (this over REF), per-stage ratios, and the load average around each run (how busy the machine was).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def worktree(ref: str, out: Path) -> tuple[Path, str]:
    """A detached worktree of `ref` under `out` (reused if it already holds that commit)."""
    sha = git("rev-parse", "--verify", f"{ref}^{{commit}}")
    path = out / f"worktree-{sha[:12]}"
    if path.exists() and git("rev-parse", "HEAD", cwd=path) == sha:
        return path, sha
    if path.exists():
        git("worktree", "remove", "--force", str(path))
    git("worktree", "add", "--force", "--detach", str(path), sha)  # --force: a stale entry of a deleted one
    return path, sha


def quickstart_once(code: Path, run_dir: Path, overrides: list[str]) -> dict:
    """One `embodied quickstart` of the package in `code` (a checkout), fresh data under `run_dir`."""
    shutil.rmtree(run_dir, ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=str(code))
    cmd = [sys.executable, "-m", "embodied.cli", "quickstart", "-q", f"run_dir={run_dir}"]
    cmd += [f"data.root={run_dir / 'data'}", *overrides]
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=code, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"quickstart in {code} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    shutil.rmtree(run_dir / "data", ignore_errors=True)  # 3,600 clips per run; the summary stays
    return {
        "wall_s": summary["wall_s"],
        "process_s": round(wall, 1),
        "timings_s": summary["timings_s"],
        "accuracy": summary["accuracy"],
        "ci95": summary["ci95"],
        "threads": summary.get("threads"),
        "loadavg_1m_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
    }


def _median(runs: list[dict], key) -> float:
    return statistics.median(key(r) for r in runs)


def run(cfg, out: Path, progress: bool = True) -> dict:
    b = cfg.bench
    if not b.against:
        raise ValueError("embodied bench quickstart needs a commit to compare with: --against REF")
    ref_code, ref_sha = worktree(b.against, out.resolve())
    # this side runs from a worktree of HEAD too: commits or edits made in the checkout while the bench runs
    # (a shared machine) cannot change what is measured; uncommitted changes are not measured (flagged)
    new_code, head = worktree("HEAD", out.resolve())
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    overrides = [
        f"seed={cfg.seed}",
        f"data.seed={cfg.data.seed}",
        f"threads={cfg.threads}",
        *b.quickstart_overrides,
    ]
    sides = {"ref": ref_code, "new": new_code}
    runs: dict[str, list[dict]] = {"ref": [], "new": []}
    order = []
    for i in range(b.quickstart_runs):
        for side in ("ref", "new") if i % 2 == 0 or not b.quickstart_swap else ("new", "ref"):
            r = quickstart_once(sides[side], out.resolve() / "runs" / f"{side}-{i}", overrides)
            runs[side].append(r)
            order.append(side)
            with (out / "bench_quickstart_runs.jsonl").open("a") as f:  # kept if the bench is cut short
                f.write(json.dumps({"side": side, "pair": i, **r}) + "\n")
            if progress:
                print(
                    f"[bench quickstart] {side} run {i}: wall_s {r['wall_s']} accuracy {r['accuracy']}",
                    flush=True,
                )
    med = {s: _median(runs[s], lambda r: r["wall_s"]) for s in runs}
    stages = sorted(set(runs["new"][0]["timings_s"]) & set(runs["ref"][0]["timings_s"]))
    stage_ratio = {
        k: round(
            _median(runs["new"], lambda r, k=k: r["timings_s"][k])
            / max(_median(runs["ref"], lambda r, k=k: r["timings_s"][k]), 1e-9),
            3,
        )
        for k in stages
    }
    return {
        "against": b.against,
        "ref_commit": ref_sha,
        "new_commit": head,
        "checkout_had_uncommitted_changes": dirty,
        "runs_each": b.quickstart_runs,
        "order": order,
        "overrides": overrides,
        "cpu_count": os.cpu_count(),
        "runs": runs,
        "median_wall_s": med,
        "wall_ratio_new_over_ref": round(med["new"] / med["ref"], 3),
        "pairwise_ratios": [
            round(n["wall_s"] / r["wall_s"], 3) for n, r in zip(runs["new"], runs["ref"], strict=True)
        ],
        "stage_ratio_new_over_ref": stage_ratio,
        "accuracy_grpo": {s: [r["accuracy"]["grpo"] for r in runs[s]] for s in runs},
        "target_ratio": 0.7,
    }
