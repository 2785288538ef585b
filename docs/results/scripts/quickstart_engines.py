"""The quickstart through each rollout engine, side by side (docs/training.md, "Rollout engines"): per seed
and engine, the held-out accuracy after GRPO with its 95% Wilson interval, the wall time and the engine's
drift, from run folders made by

    for s in 0 1 2; do for e in vllm hf; do
      .venv-vllm/bin/embodied quickstart -q rollout.engine=$e seed=$s data.seed=$s run_dir=RUNS/$e-s$s \\
          data.root=RUNS/data-s$s
    done; done

(one environment, `.venv-vllm`, for both engines; runs alternated). Usage: quickstart_engines.py RUNS COMMIT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def drift(run: Path) -> float | None:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    gaps = [r["rollout/logprob_diff_max"] for r in rows if "rollout/logprob_diff_max" in r]
    return max(gaps) if gaps else None


def val_curve(run: Path) -> list[tuple[int, float]]:
    """GRPO's validation accuracy at each evaluated step (the first row of a step that has one)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    out: dict[int, float] = {}
    for r in rows:
        if r.get("stage") == "grpo" and "eval/accuracy" in r:
            out.setdefault(r["step"], r["eval/accuracy"])
    return sorted(out.items())


def main(runs: Path, commit: str) -> dict:
    out: dict = {"commit": commit, "environment": ".venv-vllm (locks/vllm.txt)", "runs": []}
    for run in sorted(runs.glob("*-s*")):
        if not (run / "summary.json").is_file():
            continue
        engine, seed = run.name.split("-s")
        grpo = json.loads((run / "eval_grpo.json").read_text())
        summary = json.loads((run / "summary.json").read_text())
        out["runs"].append({
            "engine": engine, "seed": int(seed), "accuracy": grpo["accuracy"], "ci95": grpo["ci95"],
            "n": grpo["n"], "wall_s": summary["wall_s"], "logprob_diff_max": drift(run),
            "val_curve": val_curve(run), "environment": grpo["environment"],
        })  # fmt: skip
    for engine in sorted({r["engine"] for r in out["runs"]}):
        rows = [r for r in out["runs"] if r["engine"] == engine]
        out[engine] = {
            "seeds": [r["seed"] for r in rows],
            "accuracy": [r["accuracy"] for r in rows],
            "min_accuracy": min(r["accuracy"] for r in rows),
            "wall_s": [r["wall_s"] for r in rows],
        }
    return out


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), sys.argv[2]), indent=1))
