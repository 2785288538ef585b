"""Metrics: one JSON line per logged step, and a PNG of the curves.

Names are namespaced (`loss/policy`, `reward/accuracy`, `time/step`, ...) so that runs of different
commands plot side by side. The same rows also go to TensorBoard and W&B when `log.backends` asks for them
(`embodied.train.tracking`).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from embodied.train import tracking as _tracking


class MetricsLog:
    """Appends `{"stage": ..., "step": ..., name: value, ...}` lines to a JSONL file, and the same values to
    the tracking backends (TensorBoard, W&B) in force when it was made (`tracking.configure`, or the
    `tracking` argument), with files next to the JSONL file. The backends open on the first row."""

    def __init__(self, path: str | Path, stage: str, tracking: _tracking.Tracking | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.stage = stage
        self.tracking = tracking or _tracking.current()
        self._tracker: _tracking.Tracker | None = None
        self._purge_step: int | None = None

    @property
    def tracker(self) -> _tracking.Tracker | None:
        """The TensorBoard/W&B side of this log, opened on first use (None when only jsonl is on)."""
        if self._tracker is None and self.tracking.extra:
            self._tracker = _tracking.Tracker(self.path.parent, self.stage, self.tracking, self._purge_step)
        return self._tracker

    def truncate(self, after_step: int) -> None:
        """Drop this stage's rows past `after_step` (metrics and samples; TensorBoard drops its events from
        the next step on): a resumed run rewrites them, and must not log twice."""
        self._purge_step = after_step + 1
        for path in (self.path, self.path.parent / "samples.jsonl"):
            if path.exists():
                keep = [
                    line
                    for line in path.read_text().splitlines()
                    if line.strip()
                    and not ((row := json.loads(line))["stage"] == self.stage and row["step"] > after_step)
                ]
                path.write_text("".join(line + "\n" for line in keep))

    def log(self, step: int, metrics: dict) -> None:
        """One row at `step`: to the JSONL file, and every number to the tracking backends."""
        row = {"stage": self.stage, "step": step}
        row.update({k: _plain(v) for k, v in metrics.items()})
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self.tracker is not None:
            self.tracker.scalars(step, metrics)

    def log_samples(self, step: int, samples: Sequence[dict]) -> None:
        """Rollout samples at `step`, each `{id, question, truth, frames (T, H, W, 3) uint8, answers: [text],
        rewards: [{term: value}]}`: text and rewards to `samples.jsonl` next to the metrics, the frame strip
        and the text to TensorBoard (images and text) and W&B (a table)."""
        with (self.path.parent / "samples.jsonl").open("a") as f:
            for s in samples:
                row = {"stage": self.stage, "step": step} | {
                    k: v for k, v in s.items() if k not in ("frames", "turn_frames")
                }
                f.write(json.dumps(row) + "\n")
        if self.tracker is not None:
            self.tracker.samples(step, samples)

    def log_rollout(self, step: int, rollout) -> None:
        """Every `log.samples_every` steps, the samples of a GRPO `Rollout`'s first `log.samples` prompts."""
        every = self.tracking.cfg.samples_every
        if rollout is not None and every > 0 and step % every == 0:
            self.log_samples(step, _tracking.rollout_samples(rollout, self.tracking.cfg.samples))

    def close(self) -> None:
        """Flush the tracking backends and finish the W&B run (also done at exit)."""
        if self._tracker is not None:
            self._tracker.close()
            self._tracker = None


def _plain(v):
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


def read_metrics(path: str | Path) -> list[dict]:
    p = Path(path)
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()] if p.exists() else []


def rl_curves(metrics: list[dict], start_val: float) -> dict:
    """An RL run's curves from its metrics rows: `val` as (step, seconds, accuracy) starting from
    `start_val` at step 0, and (step, value) series of reward (accuracy where scored), groups with reward
    spread, token entropy and PAPO's real / masked-input accuracy (empty where never logged)."""
    logged = [r for r in metrics if "reward/total" in r]
    evals = [r for r in metrics if "eval/accuracy" in r]

    def series(key: str) -> list:
        return [(r["step"], r[key]) for r in logged if key in r]

    return {
        "val": [(0, 0.0, start_val)] + [(r["step"], r["time/elapsed"], r["eval/accuracy"]) for r in evals],
        "reward": [(r["step"], r.get("reward/accuracy", r["reward/total"])) for r in logged],
        "group_spread": series("reward/group_spread"),
        "entropy": series("entropy/mean"),
        "papo_real": series("papo/accuracy_real"),
        "papo_masked": series("papo/accuracy_masked"),
    }


def first_reaching(val: list, target: float) -> tuple[int | None, float | None]:
    """(step, seconds) of the first point of an `rl_curves` validation curve at or above `target`."""
    return next(((s, round(t, 1)) for s, t, acc in val if acc >= target), (None, None))


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


def finish_curves(fig, axes, titles: Sequence[str], xlabels: Sequence[str], path: str | Path) -> None:
    """The tail every experiment report's curves figure shares: each of `axes` gets its title, x label and a
    grid, the first the legend; then `fig` is laid out, written to `path` at 110 dpi and closed."""
    import matplotlib.pyplot as plt

    for ax, title, xlabel in zip(axes, titles, xlabels):
        ax.set(title=title, xlabel=xlabel)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
