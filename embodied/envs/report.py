"""The env-feedback experiment's results table (markdown + JSON) and plots."""

from __future__ import annotations

import json
from pathlib import Path

from embodied.envs import task
from embodied.train.metrics import read_metrics

FAILURES = (
    "reward/toppled",
    "reward/dropped",
    "reward/crushed",
    "reward/too_low",
    "reward/short",
    "reward/overshoot",
)


def _ci(r: dict, key: str) -> str:
    lo, hi = r["ci95"]
    return f"{r[key]:.3f} [{lo:.2f}, {hi:.2f}]"


def summarize(results: dict) -> dict:
    """Per stage (start and each arm): MCQ accuracy (overall, per family) and env success (overall,
    per task), unparseable shares and mean failure terms; JSON-ready, without per-example predictions."""
    out = {}
    for stage, r in results.items():
        mcq, env = r["mcq"], r["env"]
        out[stage] = {
            "mcq_accuracy": mcq["accuracy"],
            "mcq_ci95": mcq["ci95"],
            "mcq_unparseable": mcq["unparseable"],
            "mcq_chance": mcq["chance"],
            "mcq_n": mcq["n"],
            "mcq_per_task": {t: v["accuracy"] for t, v in mcq["per_task"].items()},
            "env_success": env["success"],
            "env_ci95": env["ci95"],
            "env_unparseable": env["unparseable"],
            "env_n": env["n"],
            "env_per_task": {
                t: {"success": v["success"], "ci95": v["ci95"], "unparseable": v["unparseable"], "n": v["n"]}
                | {k.split("/", 1)[1]: v["terms"].get(k, 0.0) for k in FAILURES if k in task(t).WEIGHTS}
                for t, v in env["per_task"].items()
            },
        }
    return out


def markdown(summary: dict, results: dict) -> str:
    stages = list(summary)
    families = sorted({t for s in summary.values() for t in s["mcq_per_task"]})
    tasks = sorted({t for s in summary.values() for t in s["env_per_task"]})
    lines = ["# env-feedback results", ""]
    head = ["arm", "MCQ accuracy [95% CI]", *families, "env success [95% CI]", *tasks, "env unparseable"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in stages:
        v, r = summary[s], results[s]
        row = [
            s,
            _ci(r["mcq"], "accuracy"),
            *(f"{v['mcq_per_task'].get(f, float('nan')):.3f}" for f in families),
        ]
        row += [_ci(r["env"], "success"), *(f"{v['env_per_task'][t]['success']:.3f}" for t in tasks)]
        row += [f"{v['env_unparseable']:.3f}"]
        lines.append("| " + " | ".join(row) + " |")
    any_stage = summary[stages[0]]
    lines += [
        "",
        f"MCQ: n={any_stage['mcq_n']} held-out questions, chance {any_stage['mcq_chance']:.2f}. "
        f"Env: n={any_stage['env_n']} held-out episodes ("
        + ", ".join(f"{t} {any_stage['env_per_task'][t]['n']}" for t in tasks)
        + ").",
        "",
    ]
    lines += ["## Failure terms (mean per episode; -1 = every episode failed that way)", ""]
    head = ["arm", "task", "success", "unparseable", *(k.split("/", 1)[1] for k in FAILURES)]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in stages:
        for t in tasks:
            v = summary[s]["env_per_task"][t]
            cells = [f"{v[k.split('/', 1)[1]]:.3f}" if k.split("/", 1)[1] in v else "" for k in FAILURES]
            lines.append(
                "| " + " | ".join([s, t, f"{v['success']:.3f}", f"{v['unparseable']:.3f}", *cells]) + " |"
            )
    return "\n".join(lines) + "\n"


def plot_results(summary: dict, out: Path) -> None:
    """Grouped bars: MCQ accuracy per family and env success per task (with 95% intervals), per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    stages = list(summary)
    families = sorted({t for s in summary.values() for t in s["mcq_per_task"]})
    tasks = sorted({t for s in summary.values() for t in s["env_per_task"]})
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    width = 0.8 / len(stages)
    for i, s in enumerate(stages):
        v = summary[s]
        x = np.arange(len(families) + 1) + i * width
        axes[0].bar(x, [v["mcq_accuracy"], *(v["mcq_per_task"][f] for f in families)], width, label=s)
        succ = [v["env_success"], *(v["env_per_task"][t]["success"] for t in tasks)]
        cis = [v["env_ci95"], *(v["env_per_task"][t]["ci95"] for t in tasks)]
        err = np.array([[m - c[0] for m, c in zip(succ, cis)], [c[1] - m for m, c in zip(succ, cis)]])
        axes[1].bar(np.arange(len(tasks) + 1) + i * width, succ, width, yerr=err, capsize=2, label=s)
    for ax, names, title in (
        (axes[0], families, "held-out MCQ accuracy"),
        (axes[1], tasks, "held-out env success"),
    ):
        ax.set_xticks(np.arange(len(names) + 1) + 0.4 - width / 2, ["all", *names], fontsize=8)
        ax.set_ylim(0, 1)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_reward_curves(out: Path, arms: list[str]) -> None:
    """reward/total and reward/success over GRPO steps, one line per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.2))
    for arm in arms:
        rows = [r for r in read_metrics(out / arm / "metrics.jsonl") if r.get("stage") == "grpo"]
        for ax, key in zip(axes, ("reward/total", "reward/success", "reward/accuracy")):
            pts = [(r["step"], r[key]) for r in rows if key in r]
            if pts:
                ax.plot(*zip(*pts), marker=".", label=arm)
    for ax, key in zip(axes, ("reward/total", "reward/success (interactive)", "reward/accuracy (MCQ)")):
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("GRPO step", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "reward_curves.png", dpi=110)
    plt.close(fig)


def write_report(results: dict, videos: dict, out: Path, cfg) -> dict:
    """Write results.md, results.png, reward_curves.png and every stage's predictions; return the summary."""
    summary = summarize(results)
    (out / "results.md").write_text(markdown(summary, results))
    plot_results(summary, out / "results.png")
    plot_reward_curves(out, [a for a in results if a != "start"])
    for stage, r in results.items():
        (out / f"predictions_{stage}.json").write_text(json.dumps(r, indent=1, default=float))
    return {
        "stages": summary,
        "videos": videos,
        "grpo": {
            "steps": cfg.grpo.steps,
            "prompts_per_step": cfg.grpo.prompts_per_step,
            "group_size": cfg.grpo.group_size,
        },
        "env_backend": cfg.env.backend,
    }
