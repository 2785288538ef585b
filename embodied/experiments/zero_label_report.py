"""The zero-label experiment's figures over seeds (`summarise`), its table (`zero_label_table`) and its
figure (`plot`): what `embodied.experiments.zero_label.run` writes as `zero_label.md`, `zero_label.json` and
`zero_label.png`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from embodied.train.metrics import finish_curves


def summarise(rows: list[dict], starts: list[str]) -> dict:
    """Per start: mean and min/max over seeds of the start's and the final test accuracy."""
    out = {}
    for start in starts:
        mine = [r for r in rows if r["start"] == start]
        if not mine:
            continue
        before = np.array([r["start_test"] for r in mine])
        after = np.array([r["grpo_test"] for r in mine])
        out[start] = {
            "start_mean": round(float(before.mean()), 4),
            "grpo_mean": round(float(after.mean()), 4),
            "grpo_min": round(float(after.min()), 4),
            "grpo_max": round(float(after.max()), 4),
            "gain_mean": round(float((after - before).mean()), 4),
            "intervals_disjoint": all(r["grpo_ci95"][0] > r["start_ci95"][1] for r in mine),
        }
    return out


def zero_label_table(result: dict) -> str:
    """`zero_label.md`: one row per run (start, seed), then the summary per start over seeds."""
    t = result["target"]
    lines = [
        f"{result['grpo_steps']} GRPO steps from `{result['policy']}`; n_val = {result['n_val']}, "
        f"n_test = {result['n_test']}; wall {result['wall_s']} s in all.",
        "",
        f"| start | seed | test before [95% CI] | test after GRPO [95% CI] | steps to {t} | s to {t} "
        "| GRPO s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["runs"]:
        b, a = r["start_ci95"], r["grpo_ci95"]
        lines.append(
            f"| {r['start']} | {r['seed']} | {r['start_test']:.3f} [{b[0]:.3f}, {b[1]:.3f}] | "
            f"{r['grpo_test']:.3f} [{a[0]:.3f}, {a[1]:.3f}] | {r['steps_to_target'] or 'not reached'} | "
            f"{r['seconds_to_target'] or '-'} | {r['grpo_wall_s']} |"
        )
    lines += ["", "| start | before (mean) | after GRPO: mean [min, max] over seeds | intervals disjoint |"]
    lines.append("|---|---|---|---|")
    for start, s in result["summary"].items():
        lines.append(
            f"| {start} | {s['start_mean']:.3f} | {s['grpo_mean']:.3f} [{s['grpo_min']:.3f}, "
            f"{s['grpo_max']:.3f}] | {'yes' if s['intervals_disjoint'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path, target: float) -> None:
    """`zero_label.png`: validation accuracy against steps and seconds, reward, group spread, entropy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 5, figsize=(20, 3.4))
    colours = {"format": "tab:blue", "half": "tab:orange"}
    for r in rows:
        c, label = colours.get(r["start"]), f"{r['start']} s{r['seed']}"
        steps, secs, acc = zip(*r["curves"]["val"])
        axes[0].plot(steps, acc, color=c, alpha=0.8, label=label)
        axes[1].plot(secs, acc, color=c, alpha=0.8)
        for ax, key in zip(axes[2:], ("reward", "group_spread", "entropy")):
            if r["curves"][key]:
                ax.plot(*zip(*r["curves"][key]), color=c, alpha=0.6)
    for ax in axes[:2]:
        ax.axhline(target, color="grey", ls="--", lw=0.8)
        ax.set_ylim(0, 1.02)
    titles = ("val accuracy", "val accuracy", "reward/accuracy", "groups with spread", "entropy (nats)")
    finish_curves(fig, axes, titles, ("GRPO step", "GRPO seconds", "step", "step", "step"), path)
