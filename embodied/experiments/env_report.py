"""The env-feedback experiment's tables (markdown + JSON) and plots, over seeds.

Every figure is given as the mean over seeds with the lowest and highest seed in parentheses; each seed's
own 95% Wilson interval (over held-out episodes or questions) is in `results.json`. A stage "beats the
best constant" on a task in a seed when its interval lies wholly above the best constant's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from embodied.envs import task
from embodied.eval.stats import by_family, seed_interval
from embodied.train.metrics import read_metrics


def _spread(values: list[float]) -> str:
    values = [v for v in values if v == v]  # NaN (undefined) left out
    if not values:
        return "n/a"
    return f"{np.mean(values):.3f} ({min(values):.2f}-{max(values):.2f})"


def stage_figures(rows: list[dict], constant: dict) -> dict:
    """Per stage: env success per task (per seed, with intervals), answer spread, MCQ and benchmark
    accuracy per family, and the number of seeds whose interval lies above the best constant's."""
    stages = list(rows[0]["stages"])
    tasks = sorted(rows[0]["stages"][stages[0]]["env"]["per_task"])
    out = {}
    for s in stages:
        per_seed = [r["stages"][s] for r in rows]
        env = {
            t: {
                "success": [p["env"]["per_task"][t]["success"] for p in per_seed],
                "ci95": [p["env"]["per_task"][t]["ci95"] for p in per_seed],
                "unparseable": [p["env"]["per_task"][t]["unparseable"] for p in per_seed],
                "distinct": [p["env"]["per_task"][t]["spread"]["distinct"] for p in per_seed],
                "entropy_bits": [p["env"]["per_task"][t]["spread"]["entropy_bits"] for p in per_seed],
                "corr_decisive": [p["env"]["per_task"][t]["spread"]["corr_decisive"] for p in per_seed],
                "seeds_above_constant": sum(
                    p["env"]["per_task"][t]["ci95"][0] > constant[t]["ci95"][1] for p in per_seed
                ),
            }
            | {
                k.split("/", 1)[1]: [p["env"]["per_task"][t]["terms"].get(k, 0.0) for p in per_seed]
                for k in task(t).FAILURES
            }
            for t in tasks
        }
        mcq = {
            "accuracy": [p["mcq"]["accuracy"] for p in per_seed],
            "ci95": [p["mcq"]["ci95"] for p in per_seed],
            "chance": per_seed[0]["mcq"]["chance"],
        }
        if "bench" in per_seed[0]:
            fams = sorted(by_family(per_seed[0]["bench"])[0])
            mcq["bench"] = [p["bench"]["accuracy"] for p in per_seed]
            mcq["bench_chance"] = per_seed[0]["bench"]["chance"]
            mcq["bench_per_family"] = {
                f: [by_family(p["bench"])[0][f]["accuracy"] for p in per_seed] for f in fams
            }
        out[s] = {"env": env, "mcq": mcq, "seeds": [r["seed"] for r in rows]}
    return out


def _metrics(fig: dict) -> dict[str, list[float]]:
    """One stage's per-seed figures by name: each task's success, the MCQ test accuracy and, where it ran,
    the benchmark's mean and each of its families."""
    out = {f"{t}: success": fig["env"][t]["success"] for t in sorted(fig["env"])}
    out["MCQ: arrow of time (test)"] = fig["mcq"]["accuracy"]
    if "bench" in fig["mcq"]:
        out["MCQ: benchmark, all"] = fig["mcq"]["bench"]
        out |= {f"MCQ: benchmark, {f}": v for f, v in sorted(fig["mcq"]["bench_per_family"].items())}
    return out


def paired_figures(figures: dict) -> dict:
    """The comparisons the experiment exists for, paired by seed (every arm of a seed starts from that seed's
    start): each trained arm minus the start, and expert iteration minus GRPO with simulator reward (`expert`
    minus `sim`, equal answers scored) when both ran. Per comparison and figure, the per-seed differences
    and their mean with its 95% t interval over seeds (`seed_interval`)."""
    pairs = [(a, "start") for a in figures if a != "start" and "start" in figures]
    if "expert" in figures and "sim" in figures:
        pairs.append(("expert", "sim"))
    out = {}
    for a, b in pairs:
        ma, mb = _metrics(figures[a]), _metrics(figures[b])
        rows = {}
        for name in ma:
            diff = [float(x) - float(y) for x, y in zip(ma[name], mb[name], strict=True)]
            rows[name] = {"per_seed": diff, "mean_t95": list(seed_interval(diff))}
        out[f"{a} - {b}"] = rows
    return out


def paired_markdown(paired: dict, n_seeds: int) -> list[str]:
    if not paired:
        return []
    names = list(next(iter(paired.values())))
    head = ["figure", *paired]

    def cell(d: dict) -> str:
        m, lo, hi = d["mean_t95"]
        mark = "**" if (lo > 0 or hi < 0) and n_seeds > 1 else ""
        return f"{mark}{m:+.3f} [{lo:+.2f}, {hi:+.2f}]{mark}"

    body = [[n, *(cell(paired[c][n]) for c in paired)] for n in names]
    return [
        "",
        "## Paired by seed: what each arm changed",
        "",
        *_table(head, body),
        "",
        f"Mean difference over {n_seeds} seed(s) with its 95% t interval over seeds; in bold where the "
        "interval excludes 0. Every arm of a seed starts from that seed's start, so `arm - start` is what "
        "the arm's training changed. On the MCQ rows of the `sim` arm it is the transfer from simulator "
        "reward to questions; on the interactive rows of the `mcq` arm, the transfer the other way.",
    ]


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def markdown(figures: dict, constant: dict, rows: list[dict], paired: dict) -> str:
    """The whole results page: success against the best constant, answer spread, MCQs, test-time compute."""
    stages = list(figures)
    tasks = sorted(figures[stages[0]]["env"])
    first = rows[0]["stages"][stages[0]]
    lines = [
        "# env-feedback results",
        "",
        f"Mean over {len(rows)} seed(s) ({', '.join(str(r['seed']) for r in rows)}), lowest and highest seed "
        "in parentheses. Held-out episodes per task: "
        + ", ".join(f"{t} {first['env']['per_task'][t]['n']}" for t in tasks)
        + f"; MCQ test questions: {first['mcq']['n']}.",
    ]
    lines += success_markdown(figures, constant, len(rows)) + spread_markdown(figures) + mcq_markdown(figures)
    lines += paired_markdown(paired, len(rows))
    return "\n".join(lines + compute_markdown(rows) + test_time_markdown(rows) + turns_markdown(rows)) + "\n"


def compute_markdown(rows: list[dict]) -> list[str]:
    """Per trained arm: answers sampled and scored in training (simulator calls, before the outcome cache)
    and training seconds, mean over seeds with the range: the budget each arm's row was bought with."""
    arms = [a for a in rows[0].get("answers_scored", {})]
    if not arms:
        return []
    body = [
        [
            a,
            f"{np.mean([r['answers_scored'][a] for r in rows]):,.0f}",
            _spread([r["timings_s"][a] for r in rows]),
        ]
        for a in arms
    ]
    return [
        "",
        "## Training compute per arm",
        "",
        *_table(["arm", "answers sampled and scored", "training seconds"], body),
        "",
        "GRPO arms score steps x prompts x group size answers; the expert arm (expert iteration) rounds x "
        "prompts x samples. Seconds are loading the start and training, evaluation left out.",
    ]


def turns_markdown(rows: list[dict]) -> list[str]:
    """Multi-turn episodes (`env.turns` > 1): per seed, stage and task, the success after each greedy turn
    and, where sampled, after each sampled turn beside single-turn best-of-k
    (`eval.env_stats.turn_summary`)."""
    lines = []
    cell = lambda c: f"{c['rate']:.3f} [{c['ci95'][0]:.2f}, {c['ci95'][1]:.2f}]"  # noqa: E731
    for r in rows:
        stages = {s: v["env"]["turns"] for s, v in r["stages"].items() if "turns" in v["env"]}
        if not stages:
            continue
        first = next(iter(stages.values()))
        ks = [k.split("@")[1] for k in first["greedy"] if k.startswith("success@")]
        head = ["stage", "task", *(f"greedy, after turn {k}" for k in ks), "calls", "right-way retries"]
        sampled = "sampled" in first
        if sampled:
            head += [*(f"sampled, after turn {k}" for k in ks), "calls", *(f"best-of-{k}" for k in ks)]
        body = []
        for s, t in stages.items():
            for name, c in [*t["per_task"].items(), ("all", t)]:
                row = [
                    s,
                    name,
                    *(cell(c["greedy"][f"success@{k}"]) for k in ks),
                    f"{c['greedy']['calls']:.2f}",
                    _balanced(t.get("corrections", {}).get(name)),
                ]
                if sampled:
                    row += [*(cell(c["sampled"][f"success@{k}"]) for k in ks), f"{c['sampled']['calls']:.2f}"]
                    row += [cell(c["best_of"][f"best_of@{k}"]) for k in ks]
                body.append(row)
        lines += ["", f"## Multi-turn episodes (seed {r['seed']}): success after each turn", ""]
        lines += _table(head, body)
        lines += [
            "",
            "Greedy: 95% Wilson interval over episodes. Sampled trajectories and single-turn best-of-k "
            "(k simulator calls per episode): 95% t interval over episodes. Calls: simulator calls per "
            "episode (an episode ends at a success or an unparseable answer). Right-way retries: after a "
            "greedy first answer that failed, the share of second answers that moved the way the failure "
            "asks, averaged over the task's failure kinds (`eval.env_stats.correction_summary`; 0.5 for a "
            "policy that always moves one way, 0 for one that repeats itself; - where the task declares no "
            "CORRECTIONS).",
        ]
    return lines


def _balanced(c: dict | None) -> str:
    """A `correction_summary` task block as a cell: balanced share and the failures it was counted on."""
    if not c or c["balanced"] is None:
        return "-"
    return f"{c['balanced']:.2f} (n = {sum(v['n'] for v in c['terms'].values())})"


def success_markdown(figures: dict, constant: dict, n_seeds: int) -> list[str]:
    stages, tasks = list(figures), sorted(next(iter(figures.values()))["env"])
    head = ["stage", *tasks, *(f"{t}: seeds above constant" for t in tasks)]
    const = [
        f"{c['success']:.3f} [{c['ci95'][0]:.2f}, {c['ci95'][1]:.2f}] ({c['answer']})"
        for c in (constant[t] for t in tasks)
    ]
    body = [["best constant answer", *const, *([""] * len(tasks))]]
    for s in stages:
        env = figures[s]["env"]
        body.append(
            [s, *(_spread(env[t]["success"]) for t in tasks)]
            + [f"{env[t]['seeds_above_constant']}/{n_seeds}" for t in tasks]
        )
    return [
        "",
        "## Interactive tasks: success",
        "",
        *_table(head, body),
        "",
        "The best constant is the one answer (of every option, or a grid over the stated ranges) that "
        "succeeds on most of these same held-out episodes, with its 95% interval: no policy that ignores "
        'the clip can beat it. "Seeds above constant": seeds whose 95% interval lies wholly above the '
        "constant's.",
    ]


def spread_markdown(figures: dict) -> list[str]:
    tasks = sorted(next(iter(figures.values()))["env"])
    keys = ("distinct", "entropy_bits", "corr_decisive", "unparseable")
    head = ["stage", "task", "distinct answers", "entropy (bits)", "corr. with the deciding parameter"]
    body = [
        [s, t, *(_spread(figures[s]["env"][t][k]) for k in keys)]
        for s in figures
        for t in sorted(figures[s]["env"])
    ]
    return [
        "",
        "## Do the answers depend on the clip?",
        "",
        *_table([*head, "unparseable"], body),
        "",
        "Greedy answers over the held-out episodes. The deciding parameter: "
        + ", ".join(f"for {t} {task(t).DECIDED_BY}" for t in tasks)
        + ". A policy answering one constant has one distinct answer, 0 bits and no correlation (n/a).",
    ]


def mcq_markdown(figures: dict) -> list[str]:
    first = next(iter(figures.values()))["mcq"]
    has_bench = "bench" in first
    fams = sorted(first.get("bench_per_family", {}))
    head = ["stage", "arrow of time (drop), test", *(["benchmark, all", *fams] if has_bench else [])]
    body = []
    for s, f in figures.items():
        m = f["mcq"]
        body.append([s, _spread(m["accuracy"])])
        if has_bench:
            body[-1] += [_spread(m["bench"]), *(_spread(m["bench_per_family"][x]) for x in fams)]
    chance = f"Chance: {first['chance']:.3f} on the test split"
    if has_bench:
        chance += f", {first['bench_chance']:.3f} on the benchmark (mean over its questions)"
    return ["", "## Multiple-choice questions", "", *_table(head, body), "", chance + "."]


def test_time_markdown(rows: list[dict]) -> list[str]:
    """Best-of-N (simulator as the verifier) and majority vote per stage and task, for seeds that ran it."""
    lines = []
    for r in rows:
        stages = {s: v for s, v in r["stages"].items() if "test_time" in v["env"]}
        if not stages:
            continue
        first = next(iter(stages.values()))
        ks = first["env"]["settings"]["k"]
        tasks = sorted(first["env"]["test_time"]["per_task"])
        settings = first["env"]["settings"]
        on = settings.get("sampled_episodes", first["env"]["n"])  # results before it sampled every episode
        where = f", on {on} of the {first['env']['n']} held-out episodes" if on < first["env"]["n"] else ""
        lines += ["", f"## Test-time compute (seed {r['seed']}, {settings['samples']} samples{where})", ""]
        head = ["stage", "task", *(f"best-of-{n}" for n in ks), *(f"vote-{n}" for n in ks)]
        body = []
        for s, v in stages.items():
            tt = v["env"]["test_time"]
            for t in [*tasks, "all"]:
                c = tt if t == "all" else tt["per_task"][t]
                body.append(
                    [s, t, *(f"{c[f'best_of@{n}']:.3f}" for n in ks), *(f"{c[f'vote@{n}']:.3f}" for n in ks)]
                )
            mcq = v["mcq"]
            body.append(
                [s, "MCQ (majority vote)", *([""] * len(ks)), *(f"{mcq[f'cons@{n}']:.3f}" for n in ks)]
            )
        lines += _table(head, body)
        sec = first["env"]["seconds_per_episode"]
        lines += [
            "",
            "Seconds per episode (start policy; measured per sample, times N): "
            + ", ".join(f"best-of-{n} {sec[f'best_of@{n}']:.3f} s" for n in ks)
            + "; majority vote executes one answer: "
            + ", ".join(f"vote-{n} {sec[f'vote@{n}']:.3f} s" for n in ks)
            + f". MCQ majority vote: {first['mcq']['seconds_per_sample']:.4f} s per sample and question, "
            "times N.",
        ]
    return lines


def plot_results(figures: dict, constant: dict, out: Path) -> None:
    """Env success per task per stage (mean over seeds, bars from lowest to highest seed) against the best
    constant, and MCQ accuracy on the test split and the benchmark."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = list(figures)
    tasks = sorted(figures[stages[0]]["env"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    width = 0.8 / len(stages)
    for i, s in enumerate(stages):
        for ax, vals in (
            (axes[0], [figures[s]["env"][t]["success"] for t in tasks]),
            (
                axes[1],
                [
                    figures[s]["mcq"]["accuracy"],
                    *([figures[s]["mcq"]["bench"]] if "bench" in figures[s]["mcq"] else []),
                ],
            ),
        ):
            mean = np.array([np.mean(v) for v in vals])
            err = np.array([mean - [min(v) for v in vals], [max(v) for v in vals] - mean])
            err = np.clip(err, 0.0, None)  # equal seeds: the mean can round a hair past min or max
            ax.bar(np.arange(len(vals)) + i * width, mean, width, yerr=err, capsize=2, label=s)
    for j, t in enumerate(tasks):
        axes[0].hlines(
            constant[t]["success"],
            j - width / 2,
            j + 0.8 - width / 2,
            colors="k",
            linestyles="--",
            label="best constant" if j == 0 else None,
        )
    labels = ["AoT test", *(["benchmark"] if "bench" in figures[stages[0]]["mcq"] else [])]
    for ax, names, title in (
        (axes[0], tasks, "held-out env success"),
        (axes[1], labels, "held-out MCQ accuracy"),
    ):
        ax.set_xticks(np.arange(len(names)) + 0.4 - width / 2, names, fontsize=8)
        ax.set_ylim(0, 1)
        ax.set_title(title + " (mean, seed range)", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def training_curve(rows: list[dict], key: str, per_step: int) -> dict[int, float]:
    """`{answers sampled so far: value of key}` from one arm's metrics: a GRPO step's row at step x
    `per_step` (prompts x group size), an expert-iteration round's at its `expert/answers_scored`, so that
    arms trained by different rules share one axis: the simulator calls spent."""
    curve = {}
    for r in rows:
        if key in r and r.get("stage") == "grpo":
            curve[r["step"] * per_step] = r[key]
        elif key in r and r.get("stage") == "expert":
            curve[int(r["expert/answers_scored"])] = r[key]
    return curve


def plot_reward_curves(out: Path, arms: list[str], seeds: list[int], per_step: int) -> None:
    """reward/total, reward/success and reward/accuracy of every arm's sampled training answers against
    the answers sampled so far (`training_curve`; mean over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = ("reward/total", "reward/success", "reward/accuracy")
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.2))
    for i, arm in enumerate(arms):
        logs = [read_metrics(out / f"seed{seed}" / arm / "metrics.jsonl") for seed in seeds]
        for ax, key in zip(axes, keys):
            runs = [training_curve(rows, key, per_step) for rows in logs]
            steps = sorted(set.intersection(*(set(r) for r in runs))) if runs else []
            if steps:  # C0 is the start's colour in the other plots
                mean = [np.mean([r[s] for r in runs]) for s in steps]
                ax.plot(steps, mean, marker=".", color=f"C{i + 1}", label=arm)
    for ax, key in zip(axes, ("reward/total", "reward/success (interactive)", "reward/accuracy (MCQ)")):
        ax.set_title(key + " (mean over seeds)", fontsize=9)
        ax.set_xlabel("answers sampled in training (GRPO: steps x prompts x group size)", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "reward_curves.png", dpi=110)
    plt.close(fig)


def plot_test_time(rows: list[dict], out: Path) -> bool:
    """Success against N and against seconds per episode, best-of-N and majority vote, one line per stage."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    row = next((r for r in rows if any("test_time" in v["env"] for v in r["stages"].values())), None)
    if row is None:
        return False
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.4))
    for i, (s, v) in enumerate(row["stages"].items()):
        env, colour = v["env"], f"C{i}"
        ks, sec = env["settings"]["k"], env["seconds_per_episode"]
        for kind, marker, ls, name in (("best_of", "o", "-", "best-of-N"), ("vote", "x", "--", "vote")):
            success = [env["test_time"][f"{kind}@{n}"] for n in ks]
            style = {"marker": marker, "ls": ls, "color": colour, "label": f"{s} {name}"}
            axes[0].plot(ks, success, **style)
            axes[1].plot([sec[f"{kind}@{n}"] for n in ks], success, **style)
        axes[2].plot(ks, [v["mcq"][f"cons@{n}"] for n in ks], marker="x", ls="--", color=colour, label=s)
    for ax, (x, y, title) in zip(
        axes,
        (
            ("N", "env success (all tasks)", "interactive: best-of-N (simulator verifier) and vote"),
            ("seconds per episode", "env success (all tasks)", "interactive: against seconds"),
            ("N", "MCQ accuracy", "MCQ: majority vote"),
        ),
    ):
        ax.set_xscale("log", base=2)
        ax.set_xlabel(x, fontsize=8)
        ax.set_ylabel(y, fontsize=8)
        ax.set_title(title + f" (seed {row['seed']})", fontsize=9)
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out / "test_time.png", dpi=110)
    plt.close(fig)
    return True


def write_env_report(rows: list[dict], constant: dict, out: Path, cfg) -> dict:
    """Write results.md, results.png, reward_curves.png and test_time.png; return the JSON summary."""
    figures = stage_figures(rows, constant)
    paired = paired_figures(figures)
    (out / "results.md").write_text(markdown(figures, constant, rows, paired))
    plot_results(figures, constant, out / "results.png")
    g = cfg.grpo
    arms = [s for s in figures if s != "start"]
    plot_reward_curves(out, arms, [r["seed"] for r in rows], g.prompts_per_step * g.group_size)
    plot_test_time(rows, out)
    return {
        "stages": figures,
        "paired": paired,
        "best_constant": constant,
        "seeds": rows,
        "videos": rows[0]["videos"],
        "grpo": {
            "steps": cfg.grpo.steps,
            "prompts_per_step": cfg.grpo.prompts_per_step,
            "group_size": cfg.grpo.group_size,
        },
        "env_backend": cfg.env.backend,
    }
