"""The cosmos experiment's tables (markdown + JSON) and figure, over seeds.

Per row (base, SFT, SFT + GRPO, more SFT, GRPO alone, the blind and single-frame baselines) and family: the
mean accuracy over seeds with its 95% Student-t interval and the min-max (`summarise`), the issue's targets
checked from them, the transfer rows on held-out scenes, the linear probe and the stage timings; written as
`cosmos.json`, `cosmos.md` and `cosmos.png` (`write_outputs`, which `embodied.experiments.cosmos.run` ends
with), as env-feedback keeps its report in `env_report.py`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from embodied.environment import stamped
from embodied.questions import asks_orders

ROWS = ("base", "sft", "sft_grpo", "sft_grpo_credit", "more_sft", "grpo_only", "blind", "single_frame")
TRANSFER_ROWS = ("sft", "sft_grpo", "more_sft")
ROW_NAMES = {
    "chance": "chance",
    "base": "base",
    "sft": "SFT",
    "sft_grpo": "SFT + GRPO",
    "sft_grpo_credit": "SFT + GRPO, partial order credit",
    "more_sft": "SFT + more SFT (GRPO's wall time)",
    "grpo_only": "GRPO alone (format-only start)",
    "blind": "SFT + GRPO, blind",
    "single_frame": "SFT + GRPO, single frame",
}


def write_outputs(cfg, out: Path, base: dict, probe: dict, per_seed: dict, wall_s: float | None) -> dict:
    """The table from the jobs' rows (a row that a seed lacks is left out): `cosmos.json`, `.md`, `.png`."""
    result = summarise(base, per_seed, cfg) | {"probe": probe, "wall_s": wall_s}
    (out / "cosmos.json").write_text(json.dumps(stamped(result | {"per_seed": per_seed}), indent=1))
    (out / "cosmos.md").write_text(markdown(result))
    plot(result, out / "cosmos.png")
    print(markdown(result))
    return result


def seed_stat(values: list[float]) -> dict:
    """A figure over seeds: the mean with its 95% Student-t interval, and the lowest and highest seed."""
    from embodied.eval.stats import seed_interval

    mean, lo, hi = seed_interval(values)
    return {
        "mean": round(mean, 4),
        "ci95": [round(lo, 4), round(hi, 4)],
        "min": min(values),
        "max": max(values),
    }


def per_family(ev: dict) -> dict:
    """An evaluation's `per_family` (`per_task` in rows saved before issue 23)."""
    from embodied.eval.stats import by_family

    return by_family(ev)[0]


def per_tier(ev: dict) -> dict:
    """An evaluation's accuracy per difficulty tier."""
    from embodied.eval.stats import by_family

    return by_family(ev)[1]


def family_mean(ev: dict) -> float:
    """Unweighted mean accuracy over families (Cosmos-Reason1's "average" column)."""
    return float(np.mean([v["accuracy"] for v in per_family(ev).values()]))


def _rows(base: dict, per_seed: dict) -> dict[str, list[dict]]:
    """Each table row's evaluation per seed (base: the same one for every seed)."""
    seeds = list(per_seed)
    job_of = {"grpo_only": "zero"}  # every other row but the base comes from the main job

    def get(row: str, s) -> dict | None:
        return base if row == "base" else per_seed[s].get(job_of.get(row, "main"), {}).get(row)

    rows = {row: [get(row, s) for s in seeds] for row in ROWS}  # a row some seed lacks is left out
    return {row: evs for row, evs in rows.items() if all(e is not None for e in evs)}


def summarise(base: dict, per_seed: dict, cfg) -> dict:
    """Per row and family: mean over seeds with its t-interval; the issue's three targets checked."""
    rows = _rows(base, per_seed)
    families = sorted(per_family(base))
    table = {
        row: {f: seed_stat([per_family(e)[f]["accuracy"] for e in evs]) for f in families}
        | {"average": seed_stat([family_mean(e) for e in evs])}
        for row, evs in rows.items()
    }
    tiers = {
        row: {
            f: {t: seed_stat([per_tier(e)[f][t]["accuracy"] for e in evs]) for t in per_tier(base)[f]}
            for f in families
        }
        for row, evs in rows.items()
    }
    chance = {f: per_family(base)[f]["chance"] for f in families}
    chance["average"] = float(np.mean(list(chance.values())))
    targets = {  # cosmos.sft_only: no GRPO row
        f"{row}_above_chance": {f: table[row][f]["ci95"][0] > chance[f] for f in families}
        for row in ("sft", "sft_grpo")
        if row in rows
    }
    if "sft_grpo" in rows and "more_sft" in rows:
        diff = [family_mean(a) - family_mean(b) for a, b in zip(rows["sft_grpo"], rows["more_sft"])]
        targets["grpo_minus_more_sft"] = seed_stat(diff)
        targets["grpo_beats_more_sft"] = targets["grpo_minus_more_sft"]["ci95"][0] > 0
    if "blind" in rows and "single_frame" in rows:
        targets["baselines_contain_chance"] = {
            b: {f: table[b][f]["ci95"][0] <= chance[f] <= table[b][f]["ci95"][1] for f in families}
            for b in ("blind", "single_frame")
        }
    if "sft_grpo_credit" in rows:  # partial order credit minus exact match, paired by seed
        pairs = list(zip(rows["sft_grpo_credit"], rows["sft_grpo"]))
        targets["credit_minus_exact"] = {
            f: seed_stat([per_family(a)[f]["accuracy"] - per_family(b)[f]["accuracy"] for a, b in pairs])
            for f in families
            if asks_orders(f)  # the families `grpo.order_credit` pays partial credit on
        }
    return {
        "families": families,
        "chance": chance,
        "table": table,
        "tiers": tiers,
        "targets": targets,
        "transfer": _transfer_table(per_seed),
        "timings_s": _timings(per_seed),
        "n_bench": base["n"],
        "seeds": list(per_seed),
        "policy": cfg.policy.path,
        "sft_steps": cfg.sft.steps,
        "curriculum": [dataclasses.asdict(st) for st in cfg.cosmos.curriculum],
        "grpo_steps": cfg.grpo.steps,
    }


def _transfer_table(per_seed: dict) -> dict:
    runs = [r["transfer"] for r in per_seed.values() if "transfer" in r]
    if not runs:
        return {}
    families = sorted(per_family(runs[0]["sft"]))
    rows = [row for row in TRANSFER_ROWS if all(row in r for r in runs)]  # more_sft: since 2026-11-26
    out = {
        row: {f: seed_stat([per_family(r[row])[f]["accuracy"] for r in runs]) for f in families}
        | {"all": seed_stat([r[row]["accuracy"] for r in runs])}
        for row in rows
    }
    if "more_sft" in rows:  # on the held-out scenes, paired by seed
        out["grpo_minus_more_sft"] = seed_stat(
            [r["sft_grpo"]["accuracy"] - r["more_sft"]["accuracy"] for r in runs]
        )
    return out | {"scenes": runs[0]["scenes"], "n": runs[0]["sft"]["n"]}


def _timings(per_seed: dict) -> dict:
    keys = {
        "main": ("sft_s", "grpo_s", "credit_s", "more_sft_s", "more_sft_steps"),
        "zero": ("grpo_s",),
        "transfer": ("grpo_s", "more_sft_s", "more_sft_steps"),
    }
    return {
        f"{job}/{k}": [r[job][k] for r in per_seed.values() if job in r]
        for job, ks in keys.items()
        for k in ks
        if any(k in r.get(job, {}) for r in per_seed.values())
    }


def _cell(s: dict) -> str:
    return f"{s['mean']:.3f} [{s['ci95'][0]:.2f}, {s['ci95'][1]:.2f}]"


def markdown(result: dict) -> str:
    fams = result["families"] + ["average"]
    head = "| row | " + " | ".join(f.replace("_", " ") for f in fams) + " |"
    stages = "".join(  # a stage's families were its `tasks` before issue 23
        f"{c['steps']} on {' + '.join(c.get('families', c.get('tasks', [])))}, then "
        for c in result.get("curriculum", [])
    )
    lines = [
        f"`{result['policy']}`: SFT {stages}{result['sft_steps']} steps on every family; "
        f"{result['grpo_steps']} GRPO steps; "
        "benchmark "
        f"n = {result['n_bench']}; seeds {result['seeds']}; wall {result.get('wall_s') or '-'} s. "
        "Cells: mean over seeds [95% t-interval].",
        "",
        head,
        "|---" * (len(fams) + 1) + "|",
        "| chance | " + " | ".join(f"{result['chance'][f]:.3f}" for f in fams) + " |",
    ]
    for row, cells in result["table"].items():
        lines.append(f"| {ROW_NAMES[row]} | " + " | ".join(_cell(cells[f]) for f in fams) + " |")
    t = result["targets"]
    lines.append("")
    for row in ("sft", "sft_grpo"):
        if f"{row}_above_chance" in t:
            above = [f for f, ok in t[f"{row}_above_chance"].items() if ok]
            lines.append(
                f"- Families whose {ROW_NAMES[row]} interval lies above chance: {len(above)} of "
                f"{len(result['families'])} ({', '.join(above) or 'none'})."
            )
    if "grpo_minus_more_sft" in t:
        d = t["grpo_minus_more_sft"]
        lines.append(
            f"- SFT + GRPO minus continued SFT, family average, paired by seed: {d['mean']:+.3f} "
            f"[{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]: GRPO "
            f"{'beats' if t['grpo_beats_more_sft'] else 'does not beat'} more SFT."
        )
    for b, fams_ok in t.get("baselines_contain_chance", {}).items():
        missing = [f for f, ok in fams_ok.items() if not ok]
        ok = len(fams_ok) - len(missing)
        but = f" (not: {', '.join(missing)})" if missing else ""
        lines.append(f"- {ROW_NAMES[b]}: interval contains chance on {ok} of {len(fams_ok)} families{but}.")
    for f, c in t.get("credit_minus_exact", {}).items():
        lines.append(
            f"- Partial order credit minus exact match on {f}, paired by seed: {c['mean']:+.3f} "
            f"[{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}]."
        )
    lines += _tier_lines(result) + _transfer_lines(result["transfer"]) + _probe_lines(result["probe"])
    tm = result["timings_s"]
    lines += ["", "Seconds per seed: " + "; ".join(f"{k} {v}" for k, v in tm.items()) + "."]
    return "\n".join(lines) + "\n"


def _tier_lines(result: dict) -> list[str]:
    shown = [r for r in ("sft", "sft_grpo", "more_sft") if r in result["tiers"]]
    lines = ["", "| family | tier | " + " | ".join(ROW_NAMES[r] for r in shown) + " |"]
    lines.append("|---" * (len(shown) + 2) + "|")
    for f in result["families"]:
        for tier in result["tiers"]["sft"][f]:
            cells = [_cell(result["tiers"][r][f][tier]) for r in shown]
            lines.append(f"| {f} | {tier} | " + " | ".join(cells) + " |")
    return lines


def _transfer_lines(tr: dict) -> list[str]:
    if not tr:
        return []
    fams = [f for f in tr["sft"] if f != "all"] + ["all"]
    lines = [
        "",
        f"Transfer: trained on the other scenes, tested on {', '.join(tr['scenes'])} (n = {tr['n']}).",
        "",
        "| row | " + " | ".join(fams) + " |",
        "|---" * (len(fams) + 1) + "|",
    ]
    for row in TRANSFER_ROWS:
        if row in tr:
            lines.append(f"| {ROW_NAMES[row]} | " + " | ".join(_cell(tr[row][f]) for f in fams) + " |")
    if "grpo_minus_more_sft" in tr:
        d = tr["grpo_minus_more_sft"]
        lines += [
            "",
            f"- Transfer: SFT + GRPO minus continued SFT, paired by seed: {d['mean']:+.3f} "
            f"[{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}].",
        ]
    return lines


def _probe_lines(probe: dict) -> list[str]:
    if not probe:
        return []
    lines = [
        "",
        "Linear probe of the base's visual tokens (answer text from the clip's tokens; fitted on training "
        "clips, scored on the benchmark):",
        "",
        "| family / scene | classes | n test | probe accuracy [95% CI] | majority class |",
        "|---|---|---|---|---|",
    ]
    for group, p in probe.items():
        lo, hi = p["ci95"]
        lines.append(
            f"| {group} | {p['classes']} | {p['n_test']} | {p['accuracy']:.3f} [{lo:.3f}, {hi:.3f}] | "
            f"{p['majority']:.3f} |"
        )
    return lines


def plot(result: dict, path: Path) -> None:
    """Grouped bars: per family, each row's mean over seeds with its interval, and chance as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fams = result["families"] + ["average"]
    rows = list(result["table"])
    fig, ax = plt.subplots(figsize=(2.2 * len(fams) + 2, 4))
    width = 0.8 / len(rows)
    for i, row in enumerate(rows):
        cells = [result["table"][row][f] for f in fams]
        x = np.arange(len(fams)) + (i - (len(rows) - 1) / 2) * width
        means = [c["mean"] for c in cells]
        err = [
            [m - c["ci95"][0] for m, c in zip(means, cells)],
            [c["ci95"][1] - m for m, c in zip(means, cells)],
        ]
        ax.bar(x, means, width, yerr=err, capsize=2, label=ROW_NAMES[row], color=f"C{i}")
    for j, f in enumerate(fams):
        ax.hlines(result["chance"][f], j - 0.45, j + 0.45, color="black", ls="--", lw=1)
    ax.set_xticks(range(len(fams)), [f.replace("_", "\n") for f in fams])
    ax.set(
        ylabel="benchmark accuracy",
        ylim=(0, 1.05),
        title="per family: mean over seeds, 95% interval; -- chance",
    )
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
