"""Metrics: one JSON line per logged step, and a PNG of the curves.

Names are namespaced (`loss/policy`, `reward/accuracy`, `time/step`, ...) so that runs of different
commands plot side by side.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path


class MetricsLog:
    """Appends `{"stage": ..., "step": ..., name: value, ...}` lines to a JSONL file."""

    def __init__(self, path: str | Path, stage: str):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.stage = stage

    def truncate(self, after_step: int) -> None:
        """Drop this stage's rows past `after_step`: a resumed run rewrites them, and must not log twice."""
        if not self.path.exists():
            return
        keep = [
            line
            for line in self.path.read_text().splitlines()
            if line.strip()
            and not ((row := json.loads(line))["stage"] == self.stage and row["step"] > after_step)
        ]
        self.path.write_text("".join(line + "\n" for line in keep))

    def log(self, step: int, metrics: dict) -> None:
        row = {"stage": self.stage, "step": step}
        row.update({k: _plain(v) for k, v in metrics.items()})
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")


def _plain(v):
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


def read_metrics(path: str | Path) -> list[dict]:
    p = Path(path)
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()] if p.exists() else []


def plot_curves(rows: Sequence[dict], out: str | Path, keys: Sequence[str] | None = None) -> Path:
    """One panel per metric (all stages overlaid, x = step within the stage); saved as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        for k, v in r.items():
            if k in ("stage", "step") or not isinstance(v, (int, float)) or (keys and k not in keys):
                continue
            series[k][r["stage"]].append((r["step"], v))
    names = sorted(series)
    cols = min(3, max(1, len(names)))
    nrows = max(1, math.ceil(len(names) / cols))
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 2.8 * nrows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        for stage, pts in series[name].items():
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="." if len(xs) < 30 else None, label=stage)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
