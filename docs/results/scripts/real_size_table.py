"""Collect the real-size CPU runs (runs/real/batch.sh's logs, made by /usr/bin/time -v) into one JSON:
the plan each command printed before loading, the plan the current code makes of the run's own config
(`plan_now_gib`), its peak RSS, wall seconds, seconds per step and whether the answers were text. Runs
without a peak (stopped by hand, probes) are left out.
Usage: python docs/results/scripts/real_size_table.py runs/real OUT.json"""

from __future__ import annotations

import json
import platform
import re
import subprocess
import sys
from pathlib import Path

PLAN = re.compile(r"memory plan: (\S+) with policy\.path=(\S+) .*?: ([\d.]+) GiB \((.*?); the larger")


def parse_log(path: Path) -> dict:
    text = path.read_text(errors="replace")
    out: dict = {"log": path.name}
    if m := PLAN.search(text):
        out |= {"command": m.group(1), "policy": m.group(2), "plan_gib": float(m.group(3))}
        out["plan_items_gib"] = {
            k.strip(): float(v) for k, v in (item.rsplit(" ", 1) for item in m.group(4).split(", "))
        }
    if m := re.search(r"Maximum resident set size \(kbytes\): (\d+)", text):
        out["peak_rss_gib"] = round(int(m.group(1)) / 2**20, 3)
    if m := re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", text):
        parts = [float(x) for x in m.group(1).split(":")]
        out["wall_s"] = round(sum(p * 60**i for i, p in enumerate(reversed(parts))), 1)
    if m := re.search(r"Exit status: (\d+)", text):
        out["exit_status"] = int(m.group(1))
    if "plan_gib" in out and "peak_rss_gib" in out:
        out["rss_over_plan"] = round(out["peak_rss_gib"] / out["plan_gib"], 3)
    return out


def plan_now(folder: Path, command: str) -> float | None:
    """The plan the current code prints for the run's own config (`run_dir/config.yaml`), in GiB."""
    from embodied.config import load_config
    from embodied.policy.fits import check_command

    if not (folder / "config.yaml").is_file():
        return None
    got = check_command(load_config(str(folder / "config.yaml"), []), command)
    return got["estimate_gib"] if got else None


def run_facts(folder: Path) -> dict:
    facts: dict = {}
    metrics = folder / "metrics.jsonl"
    if metrics.is_file():
        rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
        steps = [r for r in rows if "time/step" in r]
        facts["seconds_per_step"] = [round(r["time/step"], 1) for r in steps]
        keep = ("loss/sft", "loss/policy", "loss/kl", "optim/grad_norm", "reward/total", "rollout/len")
        facts["last_step"] = {k: steps[-1][k] for k in keep if steps and k in steps[-1]}
    for result in folder.glob("eval_*.json"):
        preds = json.loads(result.read_text()).get("predictions", [])
        facts["responses"] = len(preds)
        facts["non_empty_responses"] = sum(bool(p.get("response", "").strip()) for p in preds)
    return facts


def main(root: str, out: str) -> None:
    runs = []
    for log in sorted(Path(root).glob("*.log")):
        row = parse_log(log)
        if "command" not in row or "peak_rss_gib" not in row:
            continue
        row |= run_facts(Path(root) / log.stem)
        if (now := plan_now(Path(root) / log.stem, row["command"])) is not None and "peak_rss_gib" in row:
            row["plan_now_gib"] = now
            row["rss_over_plan_now"] = round(row["peak_rss_gib"] / now, 3)
        runs.append(row)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    with open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    summary = {
        "what": "random-weight real architectures on a CPU: bf16, LoRA r8, checkpointing, 4 frames of 112 px",
        "config": "configs/cpu_real_size.yaml",
        "commit": commit,
        "machine": {"cpu": cpu, "cores": 2, "python": platform.python_version()},
        "runs": runs,
    }
    Path(out).write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main(*sys.argv[1:3])
