"""Many evaluations, one page: `embodied compare RUN_DIR...`.

Every `eval_<name>.json` a run folder holds is one result: a policy's or a served model's evaluation of a
split (`eval_test.json`), a quickstart stage (`eval_grpo.json`), or a shortcut baseline of one
(`eval_test_blind.json`, `settings.baseline` says which). A baseline is shown beside the result of the same
split and run, never as a model of its own, so a model is read against what the question set gives away.

Like with like: results are ranked only within one group, the same questions (the split's content hash from
the result's input signature, `embodied.eval.signature`) and one metric (accuracy on MCQs, success on
episodes); each group is its own table. Within a group, a result whose signature (media, frames, frame
size, pixel budget, prompt format) differs from another's is flagged with the difference and the results it
differs from, and every
result has its paired difference to the group's best on the questions both answered, with a 95% interval,
beside its own interval. A result with nothing answered (n = 0) shows as "none answered" and ranks last.

Rows are the results' keys: overall, per family, per family x difficulty tier (MCQ splits), or overall and
per interactive task (episodes). A cell is the figure with its 95% Wilson interval and the questions it
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

from embodied.eval.signature import describe_signature, differences
from embodied.eval.stats import by_family, seed_interval, wilson_interval

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
    signature: dict | None = None
    """What the model was shown (`embodied.eval.signature`); None for results written before it."""
    scores: dict[str, float] = field(default_factory=dict)
    """Per answered question id, its score (right or not, success or not; the mean over its views)."""
    group: str = ""
    """The ranking group: the split's content hash (or where it was read) and the metric."""
    flags: list[str] = field(default_factory=list)
    """How its signature differs from the others' in its group, naming them (empty: it does not)."""
    paired: dict | None = None
    """Its paired difference to the group's best: `vs`, `diff`, `ci95`, `n` (questions both answered)."""

    @property
    def value(self) -> float | None:
        return self.cells.get(("all", "all"), {}).get("value")


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


def scores_of(result: dict) -> dict[str, float]:
    """Per answered question id, its score: right (MCQ) or success (episode), the mean over its views."""
    seen: dict[str, list[float]] = {}
    for row in result.get("predictions", []):
        if row.get("failed"):
            continue
        if "terms" in row:
            score = float(row["terms"].get("reward/success", 0.0))
        elif "answer" in row and "predicted" in row:
            score = float(row["predicted"] == row["answer"])
        else:
            continue
        seen.setdefault(row["id"], []).append(score)
    return {k: sum(v) / len(v) for k, v in seen.items()}


def group_of(metric: str, signature: dict | None) -> str:
    """A result's ranking group: its split's content hash (else the data root it read) and its metric."""
    sig = signature or {}
    split = sig.get("content_hash") or (f"root {sig['data_root']}" if sig.get("data_root") else "unrecorded")
    return f"{metric} on {split}"


def _load(run: Path, p: Path, r: dict, runs: list[Path]) -> Result:
    metric, cells = cells_of(r)
    served = r.get("endpoint", {})
    who = ""
    if served:
        who = f"{served.get('model')} at {served.get('url')}"
        if "sent" in served:
            who += (
                f"; {served.get('requests', 0)} requests: {served['sent']} received by the server, "
                f"{served.get('cached', 0)} cached, {served.get('failed', 0)} failed"
            )
    sig = r.get("signature")
    label = _label(run, p.stem.removeprefix("eval_"), runs)
    return Result(
        label, p, metric, cells, served=who, signature=sig, scores=scores_of(r), group=group_of(metric, sig)
    )


def read_results(run_dirs: list[str | Path]) -> list[Result]:
    """Every evaluation in `run_dirs`, baselines attached to the result of their split, ranked within their
    group (`rank`); raises `FileNotFoundError` naming a folder that is missing or holds no `eval_*.json`."""
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
        results += [_load(run, p, r, runs) for p, r in mains.items()]
        for p, r in loaded.items():
            baseline = r.get("settings", {}).get("baseline", "none")
            if baseline == "none":
                continue
            split = p.stem.removeprefix("eval_").removesuffix(f"_{baseline}")
            owner = next((x for x in results if x.path == run / f"eval_{split}.json"), None)
            if owner is not None:
                owner.baselines[baseline] = cells_of(r)[1]
            else:  # a baseline run alone (e.g. `eval --baseline majority` in its own folder)
                results.append(_load(run, p, r, runs))
    return rank(results)


def rank(results: list[Result]) -> list[Result]:
    """`results` ranked within each group (best first, none answered last), groups in order of their best
    figure; each result's `flags` and `paired` filled in."""
    groups: dict[str, list[Result]] = {}
    for r in results:
        groups.setdefault(r.group, []).append(r)
    for members in groups.values():
        members.sort(key=lambda x: (x.value is None, -(x.value or 0.0)))
        for i, r in enumerate(members):
            r.flags = flags(r, members)
            r.paired = paired_difference(r, members[0]) if i else None
    order = sorted(groups.values(), key=lambda m: (m[0].value is None, -(m[0].value or 0.0), m[0].group))
    return [r for members in order for r in members]


def flags(r: Result, members: list[Result]) -> list[str]:
    """How `r`'s input signature differs from the others' in its group: one line per distinct difference,
    naming the results it differs from (`differs from A, B: media: video vs images`)."""
    by_difference: dict[tuple[str, ...], list[str]] = {}
    for other in members:
        d = tuple(differences(r.signature, other.signature)) if other is not r else ()
        if d:
            by_difference.setdefault(d, []).append(other.label)
    return [f"differs from {', '.join(labels)}: " + "; ".join(d) for d, labels in by_difference.items()]


def paired_difference(a: Result, b: Result) -> dict | None:
    """`a` minus `b` on the questions both answered: the mean difference of their per-question scores with
    its 95% Student-t interval over questions (`seed_interval`); None without a common question."""
    common = sorted(set(a.scores) & set(b.scores))
    if not common:
        return None
    mean, lo, hi = seed_interval([a.scores[q] - b.scores[q] for q in common])
    return {"vs": b.label, "diff": mean, "ci95": [lo, hi], "n": len(common)}


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
        if key == ("all", "all"):
            out.append(_paired_row(cols))
    return "\n".join([out[0], _input_row(cols), *out[1:]]) + "</table>"


def _input_row(cols: list[tuple[Result, str | None]]) -> str:
    """The row under the header: what each result's model was shown, and its flags."""
    cells = ["input", "", ""]
    for r, b in cols:
        if b is not None:
            cells.append("")
            continue
        flags = "".join(f"<br><span class='flag'>&#9888; {html.escape(f)}</span>" for f in r.flags)
        who = "served: " + r.served.split(";")[0] if r.served else "local"
        text = f"{who}; {describe_signature(r.signature)}"
        cells.append(f"<span class='muted'>{html.escape(text)}</span>{flags}")
    return "<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def _paired_row(cols: list[tuple[Result, str | None]]) -> str:
    """The row under the overall figures: each result minus the group's best on the same questions."""
    cells = ["paired difference", "vs best", ""]
    for r, b in cols:
        p = r.paired if b is None else None
        if p is None:
            cells.append("")
            continue
        lo, hi = p["ci95"]
        cells.append(f"{p['diff']:+.3f} [{lo:+.3f}, {hi:+.3f}] n={p['n']} vs {html.escape(p['vs'])}")
    return "<tr>" + "".join(f"<td{' class=num' * (i > 1)}>{c}</td>" for i, c in enumerate(cells)) + "</tr>"


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


def groups_of(results: list[Result]) -> dict[str, list[Result]]:
    """The ranked results by group, in ranking order."""
    out: dict[str, list[Result]] = {}
    for r in results:
        out.setdefault(r.group, []).append(r)
    return out


def group_html(group: str, members: list[Result]) -> str:
    """One group's section: what it ranks, the table, the figure."""
    esc = html.escape
    roots = sorted({(r.signature or {}).get("data_root", "not recorded") for r in members})
    png = base64.b64encode(figure_png(members)).decode()
    return (
        f"<h2>{esc(group)}</h2>\n<p class='muted'>{len(members)} results on the same questions, ranked by "
        f"the overall figure (best first), 95% Wilson intervals; data read from {esc(', '.join(roots))}. "
        "Paired difference: minus the best on the questions both answered, 95% t interval.</p>\n"
        f"{table_html(members)}\n"
        f"<img src='data:image/png;base64,{png}' alt='comparison figure: {esc(group)}'>\n"
    )


def comparison_html(results: list[Result], style: str = "") -> str:
    """The whole page: one section per group (same questions, one metric), then the result files."""
    esc = html.escape
    groups = groups_of(results)
    files = "".join(
        f"<li>{esc(r.label)} [{esc(r.group)}]: <code>{esc(str(r.path))}</code>"
        + (f" ({esc(r.served)})" if r.served else "")
        for r in results
    )
    apart = (
        f"<p><b>{len(groups)} groups of different questions or metrics: they are ranked apart, never "
        "against each other.</b></p>\n"
        if len(groups) > 1
        else ""
    )
    style += ".flag { color: #b00; }"
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>embodied compare</title>"
        f"<style>{style}</style></head><body>\n<h1>Comparison of {len(results)} evaluations</h1>\n"
        f"{apart}<p class='muted'>Each result's shortcut baselines follow it; dashed line: chance; "
        "&#9888;: its input differs from another result's in its group (named).</p>\n"
        + "".join(group_html(g, m) for g, m in groups.items())
        + f"<h2>Results</h2><ul>{files}</ul>\n</body></html>\n"
    )


def ranking(results: list[Result]) -> list[dict]:
    """The ranked overall figures (JSON): group and rank in it, label, metric, value, 95% interval, n, its
    baselines' overall values, its input signature, flags and paired difference to the group's best."""
    out, ranks = [], {}
    for r in results:
        ranks[r.group] = ranks.get(r.group, 0) + 1
        c = r.cells.get(("all", "all"), {})
        base = {
            b: cells[("all", "all")]["value"] for b, cells in r.baselines.items() if ("all", "all") in cells
        }
        head = {
            "group": r.group,
            "rank": ranks[r.group],
            "label": r.label,
            "path": str(r.path),
            "metric": r.metric,
        }
        tail = {"baselines": base, "signature": r.signature, "flags": r.flags, "paired": r.paired}
        out.append(head | c | tail)
    return out
