"""The recipe comparison's figures over seeds (`summarise`), its table (`recipes_table`) and its figure
(`plot_recipes`), and the critic's curves that each PPO run keeps (`critic_curves`, `critic_end`): what
`embodied.experiments.recipes.run` writes as `recipes.md`, `recipes.json` and `recipes.png`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from embodied.train.metrics import finish_curves

CRITIC_CURVES = {
    "explained_variance": "critic/explained_variance",
    "explained_variance_fit": "critic/explained_variance_fit",
    "explainable_variance": "critic/explainable_variance",
    "value_loss": "loss/value",
}
"""PPO's critic, logged at every step: curve name -> metric."""


def critic_curves(metrics: list[dict]) -> dict:
    """(step, value) series of the critic's metrics (empty for an arm without a critic)."""
    return {name: [(r["step"], r[key]) for r in metrics if key in r] for name, key in CRITIC_CURVES.items()}


def critic_end(curves: dict, last: int = 10, tol: float = 1e-3) -> dict:
    """The critic at the end of a run: explained variance at the last step and its mean over the `last`
    steps, how many steps it spent below 0 (below -`tol`, as `rl.critic.CriticWatch` counts: a constant
    critic reads 0 give or take rounding), the fit's mean over the `last` steps (None without a critic)."""
    ev = [v for _, v in curves["explained_variance"]]
    fit = [v for _, v in curves["explained_variance_fit"]]
    ceiling = [v for _, v in curves.get("explainable_variance", [])]
    if not ev:
        keys = ("ev_last", "ev_last10", "ev_below0_steps", "ev_fit_last10", "ev_ceiling_last10")
        return dict.fromkeys(keys)
    return {
        "ev_last": round(ev[-1], 4),
        "ev_last10": round(float(np.mean(ev[-last:])), 4),
        "ev_below0_steps": sum(v < -tol for v in ev),
        "ev_fit_last10": round(float(np.mean(fit[-last:])), 4) if fit else None,
        "ev_ceiling_last10": round(float(np.mean(ceiling[-last:])), 4) if ceiling else None,
    }


def summarise(rows: list[dict], arms: list[str], steps: int) -> list[dict]:
    """Per arm, over its seeds: test accuracy (mean, 95% t-interval, min, max), steps and seconds to the
    target (a seed that never reached it counts as `steps` in the mean, and is counted), mean entropy and
    group spread over the run, PAPO's real and masked greedy accuracy, wall seconds, and per seed the
    critic's explained variance at the last step and over the last 10 (None without a critic)."""
    from embodied.eval.stats import seed_interval

    out = []
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm]
        test = [r["test_accuracy"] for r in mine]
        mean, lo, hi = seed_interval(test)
        out.append(
            {
                "arm": arm,
                "seeds": len(mine),
                "test_mean": round(mean, 4),
                "test_ci95": [round(lo, 4), round(hi, 4)],
                "test_min": min(test),
                "test_max": max(test),
                "reached": sum(r["steps_to_target"] is not None for r in mine),
                "steps_to_target": round(float(np.mean([r["steps_to_target"] or steps for r in mine])), 1),
                "seconds_to_target": [r["seconds_to_target"] for r in mine],
                "entropy": _run_mean(mine, "entropy"),
                "group_spread": _run_mean(mine, "group_spread"),
                "papo_real": _run_mean(mine, "papo_real"),
                "papo_masked": _run_mean(mine, "papo_masked"),
                "wall_s": round(float(np.mean([r["wall_s"] for r in mine])), 1),
                "ev_last": [r.get("ev_last") for r in mine],
                "ev_last10": [r.get("ev_last10") for r in mine],
            }
        )
    return out


def _run_mean(runs: list[dict], key: str) -> float | None:
    """The mean of a logged curve over every logged step of every run (None when never logged)."""
    vals = [v for r in runs for _, v in r["curves"][key]]
    return round(float(np.mean(vals)), 4) if vals else None


def recipes_table(result: dict) -> str:
    t = result["target"]
    starts = ", ".join(
        f"seed {s['seed']}: {s['labelled_steps']} labelled steps, val {s['val_accuracy']:.3f}, "
        f"test {s['test_accuracy']:.3f}"
        for s in result["starts"]
    )
    lines = [
        f"{result['steps']} RL steps per arm and seed from `{result['policy']}`; n_val = {result['n_val']}, "
        f"n_test = {result['n_test']}; wall {result['wall_s']} s in all ({result['workers']} workers, "
        f"{result['threads']} thread(s) each).",
        "",
        f"Starts: {starts}.",
        "",
        f"| arm | test: mean [95% CI over seeds] | min-max | reached {t} | steps to {t} (mean) | s to {t} "
        "per seed | entropy | groups with spread | wall s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in result["summary"]:
        secs = " / ".join("-" if x is None else f"{x:.0f}" for x in s["seconds_to_target"])
        lines.append(
            f"| {s['arm']} | {s['test_mean']:.3f} [{s['test_ci95'][0]:.3f}, {s['test_ci95'][1]:.3f}] | "
            f"{s['test_min']:.3f}-{s['test_max']:.3f} | {s['reached']}/{s['seeds']} | "
            f"{s['steps_to_target']} | "
            f"{secs} | {_fmt(s['entropy'])} | {_fmt(s['group_spread'])} | {s['wall_s']} |"
        )
    papo = [s for s in result["summary"] if s["papo_real"] is not None]
    if papo:
        lines += [
            "",
            "| arm | greedy accuracy on the step's prompts, real input | masked input |",
            "|---|---|---|",
        ]
        lines += [f"| {s['arm']} | {s['papo_real']:.3f} | {s['papo_masked']:.3f} |" for s in papo]
    critic = [r for r in result["runs"] if r.get("ev_last") is not None]
    if critic:
        lines += [
            "",
            "| arm | seed | critic's explained variance: last step | mean of last 10 steps | steps below 0 | "
            "fit to its own rollout, last 10 | explainable by a perfect V(s_0), last 10 |",
            "|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['arm']} | {r['seed']} | {r['ev_last']:.3f} | {r['ev_last10']:.3f} | "
            f"{r['ev_below0_steps']} / {result['steps']} | {_fmt(r['ev_fit_last10'])} | "
            f"{_fmt(r.get('ev_ceiling_last10'))} |"
            for r in critic
        ]
    lines += ["", "| arm | seed | test [95% CI] | unparseable | steps to target |", "|---|---|---|---|---|"]
    for r in result["runs"]:
        lo, hi = r["test_ci95"]
        lines.append(
            f"| {r['arm']} | {r['seed']} | {r['test_accuracy']:.3f} [{lo:.3f}, {hi:.3f}] | "
            f"{r['test_unparseable']:.3f} | {r['steps_to_target'] or 'not reached'} |"
        )
    return "\n".join(lines) + "\n"


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def plot_recipes(rows: list[dict], path: Path, target: float) -> None:
    """Per arm, mean over seeds with the min-max band: val accuracy against steps and against seconds,
    token entropy and the share of groups with reward spread against steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    critic = any(r["curves"].get("explained_variance") for r in rows)
    fig, axes = plt.subplots(1, 5 if critic else 4, figsize=(22.5 if critic else 18, 3.6))
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    for i, arm in enumerate(arms):
        mine = [r for r in rows if r["arm"] == arm]
        colour = f"C{i}"
        steps = [s for s, _, _ in mine[0]["curves"]["val"]]
        acc = np.array([[a for _, _, a in r["curves"]["val"]] for r in mine])
        secs = np.array([[t for _, t, _ in r["curves"]["val"]] for r in mine]).mean(0)
        for ax, x in ((axes[0], steps), (axes[1], secs)):
            ax.plot(x, acc.mean(0), color=colour, label=arm)
            ax.fill_between(x, acc.min(0), acc.max(0), color=colour, alpha=0.15)
        for ax, key in zip(axes[2:], ("entropy", "group_spread")):
            if mine[0]["curves"][key]:
                xs = [s for s, _ in mine[0]["curves"][key]]
                ys = np.array([[v for _, v in r["curves"][key]] for r in mine])
                ax.plot(xs, ys.mean(0), color=colour)
                ax.fill_between(xs, ys.min(0), ys.max(0), color=colour, alpha=0.15)
        if critic and mine[0]["curves"].get("explained_variance"):
            for r in mine:  # one line per seed: the critic's seeds differ more than a band shows
                xs, ys = zip(*r["curves"]["explained_variance"])
                axes[4].plot(xs, np.clip(ys, -1, 1), color=colour, lw=0.8, alpha=0.7)
    for ax in axes[:2]:
        ax.axhline(target, color="grey", ls="--", lw=0.8)
        ax.set_ylim(0, 1.02)
    titles = ("val accuracy", "val accuracy", "token entropy (nats)", "groups with reward spread")
    if critic:
        titles += ("critic's explained variance, per seed (clipped)",)
        axes[4].axhline(0, color="grey", ls="--", lw=0.8)
        axes[4].set_ylim(-1.05, 1.05)
    xlabels = ("RL step", "RL seconds (mean over seeds)", "step", "step", "step")
    finish_curves(fig, axes, titles, xlabels, path)
