"""Many evaluations, one table and one figure: `embodied compare RUN_DIR...`.

Every `eval_<name>.json` a run folder holds is one result: a policy's or a served model's evaluation of a
split (`eval_test.json`), a quickstart stage (`eval_grpo.json`), or a shortcut baseline of one
(`eval_test_blind.json`, `settings.baseline` says which). A baseline is shown beside the result of the same
split and run, never as a model of its own, so a model is read against what the question set gives away.

Rows are the results' keys: overall, per family, per family x difficulty tier (MCQ splits: accuracy), or
overall and per interactive task (episodes: success in the simulator). Columns are the results, ranked by
their overall figure, best first; a cell is the figure with its 95% Wilson interval and the questions it
counts. The figure has one panel per row key: each result's figure with its interval, its baselines as
hollow markers beside it, chance as a dashed line.
"""

from __future__ import annotations

import base64
import html
import io
import json
from dataclasses import dataclass, field
from pathlib import Path

from embodied.eval.stats import by_family, wilson_interval

MAX_PANELS = 24
"""Panels drawn at most (the table holds every row)."""


@dataclass
class Result:
    """One evaluation of one run folder, with the baselines run beside it."""

    label: str
    path: Path
    metric: str
    """`accuracy` (MCQ) or `success` (interactive episodes)."""
    cells: dict[tuple[str, str], dict]
    """(family or task, tier) -> {"value", "ci95", "n", "chance"}."""
    baselines: dict[str, dict[tuple[str, str], dict]] = field(default_factory=dict)
    served: str = ""
    """The served model and endpoint, for a result evaluated through `eval.endpoint`."""


def _cell(s: dict, metric: str) -> dict:
    """A figure with its interval; `value` None where nothing was scored (n = 0: every request failed)."""
    n = int(s.get("n", 0))
    if s.get(metric) is None or not n:
        return {"value": None, "ci95": None, "n": n, "chance": s.get("chance")}
    value = float(s[metric])
    ci = s.get("ci95") or list(wilson_interval(value * n, n))
    return {"value": value, "ci95": [float(ci[0]), float(ci[1])], "n": n, "chance": s.get("chance")}


def cells_of(result: dict) -> tuple[str, dict[tuple[str, str], dict]]:
    """`(metric, cells)` of one evaluation result (see `Result.cells`)."""
    if "success" in result and "accuracy" not in result:  # interactive episodes
        cells = {("all", "all"): _cell(result, "success")}
        cells |= {(t, "all"): _cell(s, "success") for t, s in result.get("per_task", {}).items()}
        return "success", cells
    cells = {("all", "all"): _cell(result, "accuracy")}
    per_family, per_tier = by_family(result)
    for family, s in per_family.items():
        cells[(family, "all")] = _cell(s, "accuracy")
        cells |= {(family, tier): _cell(st, "accuracy") for tier, st in per_tier.get(family, {}).items()}
    return "accuracy", cells


def _label(run: Path, name: str, runs: list[Path]) -> str:
    """A column's name: the run folder's name (its path when two folders share a name) and the result's."""
    same = [r for r in runs if r.name == run.name]
    return f"{run if len(same) > 1 else run.name}: {name}"


def read_results(run_dirs: list[str | Path]) -> list[Result]:
    """Every evaluation in `run_dirs`, baselines attached to the result of their split; raises
    `FileNotFoundError` naming a folder that is missing or holds no `eval_*.json`."""
    runs = [Path(d) for d in run_dirs]
    results: list[Result] = []
    for run in runs:
        if not run.is_dir():
            raise FileNotFoundError(f"{run}: no such run folder")
        found = sorted(run.glob("eval_*.json"))
        if not found:
            raise FileNotFoundError(f"{run}: no eval_*.json (run `embodied eval run_dir={run}` first)")
        loaded = {p: json.loads(p.read_text()) for p in found}
        mains = {p: r for p, r in loaded.items() if r.get("settings", {}).get("baseline", "none") == "none"}
        for p, r in mains.items():
            metric, cells = cells_of(r)
            served = r.get("endpoint", {})
            label = _label(run, p.stem.removeprefix("eval_"), runs)
            who = f"{served['model']} at {served['url']}" if served else ""
            results.append(Result(label, p, metric, cells, served=who))
        for p, r in loaded.items():
            baseline = r.get("settings", {}).get("baseline", "none")
            if baseline == "none":
                continue
            split = p.stem.removeprefix("eval_").removesuffix(f"_{baseline}")
            owner = next((x for x in results if x.path == run / f"eval_{split}.json"), None)
            if owner is not None:
                owner.baselines[baseline] = cells_of(r)[1]
            else:  # a baseline run alone (e.g. `eval --baseline majority` in its own folder)
                results.append(
                    Result(_label(run, p.stem.removeprefix("eval_"), runs), p, "accuracy", cells_of(r)[1])
                )
    return sorted(results, key=lambda x: -x.cells.get(("all", "all"), {"value": 0.0})["value"])


def row_keys(results: list[Result]) -> list[tuple[str, str]]:
    """Every (family or task, tier) of any result: overall first, then by name, a family's `all` first."""
    keys = {k for r in results for k in r.cells}
    rest = sorted(keys - {("all", "all")}, key=lambda k: (k[0], k[1] != "all", k[1]))
    return [("all", "all")] * (("all", "all") in keys) + rest


def format_cell(c: dict | None) -> str:
    if c is None:
        return ""
    if c["value"] is None:
        return f"none answered n={c['n']}"
    return f"{c['value']:.3f} [{c['ci95'][0]:.3f}, {c['ci95'][1]:.3f}] n={c['n']}"


def table_html(results: list[Result]) -> str:
    """The comparison table: a row per key, per result its figure and then its baselines' figures."""
    esc = html.escape
    head = ["family / task", "tier", "chance"]
    cols: list[tuple[Result, str | None]] = []
    for r in results:
        cols += [(r, None)] + [(r, b) for b in sorted(r.baselines)]
    head += [esc(r.label) if b is None else f"<span class='muted'>{esc(b)} baseline</span>" for r, b in cols]
    out = ["<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"]
    for key in row_keys(results):
        chances = sorted(
            {round(r.cells[key]["chance"], 3) for r in results if r.cells.get(key, {}).get("chance")}
        )
        cells = [esc(key[0]), esc(key[1]), " / ".join(f"{c:.3f}" for c in chances)]
        for r, b in cols:
            c = r.cells.get(key) if b is None else r.baselines[b].get(key)
            text = format_cell(c)
            cells.append(f"<b>{text}</b>" if b is None and key == ("all", "all") else text)
        out.append(
            "<tr>" + "".join(f"<td{' class=num' * (i > 1)}>{c}</td>" for i, c in enumerate(cells)) + "</tr>"
        )
    return "\n".join(out) + "</table>"


def figure_png(results: list[Result]) -> bytes:
    """One panel per row key (at most `MAX_PANELS`): each result's figure with its 95% interval, its
    baselines as hollow markers beside it, chance as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = row_keys(results)[:MAX_PANELS]
    ncols = min(3, len(keys))
    nrows = -(-len(keys) // ncols)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(4.2 * ncols, 0.5 + 0.45 * len(results) * nrows + 1.2 * nrows)
    )
    axes = [axes] if len(keys) == 1 else list(getattr(axes, "flat", axes))
    for ax, key in zip(axes, keys):
        # a panel lists the results that have a figure for its key
        shown = [r for r in results if r.cells.get(key, {}).get("value") is not None]
        for y, r in enumerate(shown):
            c = r.cells[key]
            lo, hi = c["ci95"]
            err = [[c["value"] - lo], [hi - c["value"]]]
            ax.errorbar(c["value"], y, xerr=err, fmt="o", color="C0", capsize=3)
            for j, (name, cells) in enumerate(sorted(r.baselines.items())):
                if key in cells:
                    v = cells[key]["value"]
                    ax.plot(v, y + 0.15 * (j + 1), "o", mfc="none", color=f"C{j + 1}", label=name)
            if c.get("chance") is not None:
                ax.axvline(c["chance"], color="grey", linestyle="--", linewidth=1)
        ax.set_yticks(range(len(shown)), [r.label for r in shown], fontsize=7)
        ax.set_ylim(len(shown) - 0.4, -0.6)
        ax.set_xlim(-0.02, 1.02)
        ax.set_title(f"{key[0]} / {key[1]}", fontsize=9)
        handles = dict(zip(*reversed(ax.get_legend_handles_labels())))
        if handles:
            ax.legend(handles.values(), [f"{k} baseline" for k in handles], fontsize=6, loc="lower right")
    for ax in axes[len(keys) :]:
        ax.axis("off")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def comparison_html(results: list[Result], style: str = "") -> str:
    """The whole page: what was compared, the ranked table, the figure, the result files."""
    esc = html.escape
    metric = ", ".join(sorted({r.metric for r in results}))
    png = base64.b64encode(figure_png(results)).decode()
    files = "".join(
        f"<li>{esc(r.label)}: <code>{esc(str(r.path))}</code>" + (f" ({esc(r.served)})" if r.served else "")
        for r in results
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>embodied compare</title>"
        f"<style>{style}</style></head><body>\n<h1>Comparison of {len(results)} evaluations</h1>\n"
        f"<p class='muted'>{esc(metric)} with 95% Wilson intervals, ranked by the overall figure "
        "(best first); each result's shortcut baselines follow it; dashed line: chance.</p>\n"
        f"{table_html(results)}\n<h2>Per family, tier and task</h2>\n"
        f"<img src='data:image/png;base64,{png}' alt='comparison figure'>\n"
        f"<h2>Results</h2><ul>{files}</ul>\n</body></html>\n"
    )


def ranking(results: list[Result]) -> list[dict]:
    """The ranked overall figures (JSON): label, metric, value, 95% interval, n, baselines' overall values."""
    out = []
    for r in results:
        c = r.cells.get(("all", "all"), {})
        base = {
            b: cells[("all", "all")]["value"] for b, cells in r.baselines.items() if ("all", "all") in cells
        }
        out.append({"label": r.label, "path": str(r.path), "metric": r.metric} | c | {"baselines": base})
    return out
