"""`report.html`: one self-contained page per run or experiment folder, to open in a browser.

Everything is read from what the run wrote, and every picture is inlined (base64), so the file can be
mailed or attached as it is:

- the summary table (`summary.json`: accuracy with its 95% interval per stage) and one table per
  evaluation (`eval_*.json`: overall, per family, per family and tier);
- the curves (`curves.png`, or plotted from `metrics.jsonl`);
- the example clips (`examples/`) as animated strips with the correct answer and each stage's answer;
- the last rollout samples of each stage (`samples.jsonl`: answers and reward terms);
- environment runs' rollout videos (`videos/*.mp4`): first and last frame (the outcome is drawn on it);
- any other figure (`*.png`) and markdown result table (`*.md`) in the folder.

`embodied report RUN_DIR` rebuilds it; `write_report(run_dir)` is the same from Python.
"""

from __future__ import annotations

import base64
import html
import io
import json
import tempfile
from pathlib import Path

import numpy as np

from embodied.eval.stats import by_family
from embodied.video import encode_png

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
img { max-width: 100%; } img.clip { image-rendering: pixelated; height: 112px; }
code, pre { font-size: 0.85em; white-space: pre-wrap; word-break: break-all; }
.muted { color: #777; }
"""


def _esc(x) -> str:
    return html.escape(str(x))


def _img(data: bytes, alt: str, mime: str = "image/png", cls: str = "") -> str:
    """An inline `<img>` (data URI): the page needs no other file."""
    src = f"data:{mime};base64,{base64.b64encode(data).decode()}"
    return f'<img src="{src}" alt="{_esc(alt)}"' + (f' class="{cls}"' if cls else "") + ">"


def _table(head: list[str], rows: list[list], numeric_from: int = 99) -> str:
    """An HTML table; cells from column `numeric_from` on are right-aligned numbers."""
    out = ["<table><tr>" + "".join(f"<th>{_esc(h)}</th>" for h in head) + "</tr>"]
    for row in rows:
        cells = [
            f'<td class="num">{_esc(c)}</td>' if i >= numeric_from else f"<td>{c}</td>"
            for i, c in enumerate(row)
        ]
        out.append("<tr>" + "".join(cells) + "</tr>")
    return "\n".join(out) + "</table>"


def _ci(acc: float | None, ci: list | None) -> str:
    if acc is None:
        return "none answered"
    return f"{acc:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"


def _fmt(x) -> str:
    return f"{x:.3f}" if isinstance(x, float) else "" if x is None else str(x)


def _answer(text: str) -> str:
    """A model's answer as code; an empty or whitespace-only one says so (it would look like no cell)."""
    if not str(text).strip():
        return f"<span class='muted'>(blank: {len(str(text))} whitespace characters)</span>"
    return f"<code>{_esc(text)}</code>"


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def summary_section(run: Path) -> str:
    """`summary.json`: accuracy [95% CI], forced choice and unparseable share per stage."""
    s = _json(run / "summary.json")
    if not isinstance(s, dict) or "accuracy" not in s:
        return ""
    rows = []
    for stage, acc in s["accuracy"].items():
        ci = s.get("ci95", {}).get(stage, [float("nan")] * 2)
        rows.append(
            [
                _esc(stage),
                _ci(acc, ci),
                _fmt(s.get("choice_accuracy", {}).get(stage, "")),
                _fmt(s.get("unparseable", {}).get(stage, "")),
            ]
        )
    table = _table(["stage", "accuracy [95% CI]", "forced choice", "unparseable"], rows, numeric_from=1)
    facts = {k: s[k] for k in ("chance", "n_test", "n_train", "parameters", "wall_s") if k in s}
    line = ", ".join(f"{k} {_fmt(v)}" for k, v in facts.items())
    return f"<h2>Summary</h2>\n{table}\n<p class='muted'>{_esc(line)}</p>"


def _about(r: dict) -> str:
    """What a result was, under its table: the served endpoint (no credentials) with its requests by fate,
    the input signature, notes (e.g. a video model shown images) and sampled figures reported unavailable."""
    from embodied.eval.signature import describe_signature

    lines = []
    ep = r.get("endpoint")
    if ep:
        line = f"Served: model {ep.get('model')} at {ep.get('url')}"
        if "sent" in ep:
            line += (
                f"; {ep.get('requests', 0)} requests: {ep['sent']} received by the server, "
                f"{ep.get('cached', 0)} from an earlier run's cache, {ep.get('failed', 0)} failed"
            )
        lines.append(line + (f". Cause: {ep['cause']}" if ep.get("cause") else ""))
    if r.get("signature"):
        lines.append("Input: " + describe_signature(r["signature"]))
    lines += [f"Note: {n}" for n in r.get("notes", []) if not n.startswith("served by ")]
    if r.get("settings", {}).get("sampling"):
        lines.append(f"Sampled figures {r['settings']['sampling']}")
    if r.get("failed"):
        lines.append(f"Unanswered (requests failed, not scored): {len(r['failed'])} of {r.get('requested')}")
    return "".join(f"<p class='muted'>{_esc(x)}</p>\n" for x in lines)


def env_section(path: Path, r: dict) -> str:
    """An episode evaluation (`eval_<name>.json` with `success`): per task the success with its interval,
    the episodes that failed in the simulator and those left unanswered, and the mean of every reward term."""
    tasks = [*r.get("per_task", {}).items(), ("all", r)]
    terms = sorted({k for _, s in tasks for k in s.get("terms", {})})
    unanswered: dict[str, int] = {}
    for row in r.get("failed", []):
        if isinstance(row, dict):
            unanswered[row.get("task", "?")] = unanswered.get(row.get("task", "?"), 0) + 1
    names = [k.removeprefix("reward/") for k in terms]  # mean reward terms, short enough to fit the page
    head = ["task", "n", "success [95% CI]", "failed in simulation", "unanswered", *names]
    rows = []
    for name, s in tasks:
        n, success = s.get("n", 0), s.get("success")
        lost = sum(unanswered.values()) if name == "all" else unanswered.get(name, 0)
        failed = "" if success is None else str(round(n - success * n))
        cells = [_esc(name), n, _ci(success, s.get("ci95")), failed, lost]
        rows.append(cells + [_fmt(s.get("terms", {}).get(k, "")) for k in terms])
    tt = r.get("test_time") or {}
    extra = ", ".join(f"{k} {_fmt(v)}" for k, v in tt.items() if k.startswith(("best_of@", "vote@")))
    name = path.stem.removeprefix("eval_")
    return (
        f"<h3>Episode evaluation: {_esc(name)}</h3>\n"
        + _table(head, rows, numeric_from=1)
        + "<p class='muted'>Columns after <i>unanswered</i>: the mean of each reward term "
        "(<code>reward/...</code>) over the episodes answered.</p>\n"
        + (f"<p class='muted'>Test-time compute: {_esc(extra)}</p>\n" if extra else "")
        + _about(r)
    )


def eval_section(path: Path) -> str:
    """One `eval_<name>.json`: overall, per family and per family x tier, as `markdown_table` has them (an
    episode evaluation: `env_section`), then what it was (`_about`)."""
    r = _json(path)
    if isinstance(r, dict) and "success" in r and "accuracy" not in r:
        return env_section(path, r)
    if not isinstance(r, dict) or "accuracy" not in r or "ci95" not in r:
        return ""
    sampled = [k for k in r if k.startswith(("pass@", "cons@"))]
    choice = "choice_accuracy" in r
    head = ["family", "tier", "n", "accuracy [95% CI]", "chance", "unparseable"]
    head += ["forced choice"] * choice + sampled

    def row(family: str, tier: str, s: dict) -> list:
        cells = [_esc(family), _esc(tier), s.get("n", ""), _ci(s["accuracy"], s["ci95"])]
        cells += [_fmt(s.get("chance", "")), _fmt(s.get("unparseable", ""))]
        cells += [_fmt(s.get("choice_accuracy", ""))] * choice + [_fmt(s.get(k, "")) for k in sampled]
        return cells

    rows = [row("all", "all", r)]
    per_family, per_family_tier = by_family(r)  # `per_task` in evaluations written before issue 23
    for family, s in per_family.items():
        rows.append(row(family, "all", s))
        rows += [row(family, tier, st) for tier, st in per_family_tier.get(family, {}).items()]
    name = path.stem.removeprefix("eval_")
    return f"<h3>Evaluation: {_esc(name)}</h3>\n" + _table(head, rows, numeric_from=2) + _about(r)


def _numeric_series(rows: list[dict]) -> dict[str, list[float]]:
    return {
        k: [r[k] for r in rows if isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool)]
        for k in {k for r in rows for k in r if k not in ("stage", "step")}
    }


def constant_metrics(rows: list[dict]) -> dict[str, float]:
    """Metrics logged more than once that kept one value for the whole run (e.g. `clip/fraction` 0 without
    clipping): folded into one line instead of a flat panel each."""
    return {k: v[0] for k, v in sorted(_numeric_series(rows).items()) if len(v) > 1 and min(v) == max(v)}


def key_curves_section(run: Path) -> str:
    """What a run's page leads with: the training reward per step and the held-out (validation) accuracy
    through every stage, each stage's steps after the previous stage's, with the test accuracy of each
    stage (`summary.json`) marked at its end."""
    from embodied.train.metrics import read_metrics

    rows = read_metrics(run / "metrics.jsonl")
    reward = [r for r in rows if isinstance(r.get("reward/accuracy", r.get("reward/total")), (int, float))]
    held = [r for r in rows if isinstance(r.get("eval/accuracy"), (int, float))]
    if not reward and not held:
        return ""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = list(dict.fromkeys(r["stage"] for r in rows if "stage" in r))
    offset, start = 0, {}
    for st in stages:  # each stage's steps follow the previous stage's
        start[st] = offset
        offset += max((r.get("step", 0) for r in rows if r.get("stage") == st), default=0)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
    for st in stages:
        pts = [
            (start[st] + r["step"], r.get("reward/accuracy", r.get("reward/total")))
            for r in reward
            if r["stage"] == st
        ]
        if pts:
            axes[0].plot(*zip(*pts), marker="." if len(pts) < 30 else None, label=st)
        pts = [(start[st] + r["step"], r["eval/accuracy"]) for r in held if r["stage"] == st]
        if pts:
            axes[1].plot(*zip(*pts), marker="o", label=f"{st} (validation)")
    summary = _json(run / "summary.json") or {}
    for st, acc in (summary.get("accuracy") or {}).items():
        x = (
            start[st] + max((r.get("step", 0) for r in rows if r.get("stage") == st), default=0)
            if st in start
            else 0
        )
        axes[1].plot([x], [acc], "*", markersize=10, label=f"{st} (test)")
    axes[1].set_ylim(-0.02, 1.02)
    for ax, title in zip(axes, ("training reward (reward/accuracy)", "held-out accuracy through the stages")):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step (stages in order)", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    missing = [st for st in stages if st == "grpo" and not any(r["stage"] == st for r in held)]
    note = (
        f"<p class='muted'>No held-out point during {', '.join(missing)} (set grpo.eval_every).</p>"
        if missing
        else ""
    )
    return (
        f"<h2>Reward and held-out accuracy</h2>\n{_img(buf.getvalue(), 'reward and held-out curves')}{note}"
    )


def curves_section(run: Path) -> str:
    """Every other curve, plotted from `metrics.jsonl` with the constant ones folded into one line naming
    them (`curves.png` as the run wrote it when there are no metrics rows)."""
    from embodied.train.metrics import plot_curves, read_metrics

    rows = read_metrics(run / "metrics.jsonl")
    png = run / "curves.png"
    if not rows:
        return f"<h2>Curves</h2>\n{_img(png.read_bytes(), 'training curves')}" if png.is_file() else ""
    constant = constant_metrics(rows)
    keys = sorted(k for k, v in _numeric_series(rows).items() if v and k not in constant)
    line = ", ".join(f"{k} = {_fmt(v)}" for k, v in constant.items())
    folded = (
        f"<p class='muted'>Constant for the whole run (not plotted): {_esc(line)}</p>" if constant else ""
    )
    if not keys:
        return f"<h2>Curves</h2>\n{folded}"
    with tempfile.TemporaryDirectory() as tmp:
        data = plot_curves(rows, Path(tmp) / "curves.png", keys=keys).read_bytes()
    return f"<h2>Curves</h2>\n{folded}\n{_img(data, 'training curves (from metrics.jsonl)')}"


def video_frames(path: Path, limit: int = 240, ends_only: bool = False) -> list[np.ndarray]:
    """Up to `limit` decoded RGB frames of a video file, or only its first and last (`ends_only`); empty
    if it cannot be read."""
    import av

    frames: list[np.ndarray] = []
    try:
        with av.open(str(path)) as container:
            for frame in container.decode(video=0):
                if ends_only and len(frames) == 2:
                    frames.pop()
                frames.append(frame.to_ndarray(format="rgb24"))
                if not ends_only and len(frames) >= limit:
                    break
    except (av.error.FFmpegError, OSError, ValueError):
        return []
    return frames


def animated_strip(frames: list[np.ndarray], fps: float = 2.0) -> bytes:
    """An animated GIF of `frames` at `fps`, looping; the first frame shows when animation is off."""
    from PIL import Image

    images = [Image.fromarray(f) for f in frames]
    buf = io.BytesIO()
    duration = int(1000 / max(fps, 0.1))
    images[0].save(buf, format="GIF", save_all=True, append_images=images[1:], duration=duration, loop=0)
    return buf.getvalue()


def examples_section(run: Path) -> str:
    """`examples/`: each clip animated next to a still strip, the correct answer and every stage's answer."""
    from embodied.train.tracking import frame_strip

    folder = run / "examples"
    rows = _json(folder / "examples.json")
    if not isinstance(rows, list):
        return ""
    out = ["<h2>Examples</h2>"]
    sheet = folder / "examples.png"
    stages = [k for k in (rows[0] if rows else {}) if k not in ("id", "answer", "truth")]
    table = []
    for row in rows:
        frames = video_frames(folder / f"{row['id']}.mp4")
        pictures = "(clip missing)"
        if frames:
            gif = _img(animated_strip(frames), f"{row['id']} animated", "image/gif", "clip")
            pictures = (
                gif + " " + _img(encode_png(frame_strip(np.stack(frames))), f"{row['id']} frames", cls="clip")
            )
        truth = f"{_esc(row.get('answer', ''))} ({_esc(row.get('truth', ''))})"
        answers = [_answer(row.get(s, "")) for s in stages]
        table.append([f"{_esc(row['id'])}<br>{pictures}", truth, *answers])
    out.append(_table(["clip (animated, then every frame)", "correct", *stages], table))
    if sheet.is_file():
        out.append(
            f"<details><summary>contact sheet</summary>{_img(sheet.read_bytes(), 'examples')}</details>"
        )
    return "\n".join(out)


def samples_section(run: Path) -> str:
    """The last rollout samples of each stage (`samples.jsonl`): every answer of a group with its rewards."""
    path = run / "samples.jsonl"
    if not path.is_file():
        return ""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    last = {}
    for r in rows:
        if r["step"] >= last.get(r["stage"], -1):
            last[r["stage"]] = r["step"]
    table = []
    for r in rows:
        if r["step"] != last[r["stage"]]:
            continue
        for text, terms in zip(r["answers"], r["rewards"]):
            rewards = ", ".join(f"{k} {v:.2f}" for k, v in terms.items())
            table.append(
                [
                    _esc(f"{r['stage']} {r['step']}"),
                    _esc(r["id"]),
                    _esc(r["truth"]),
                    _answer(text),
                    _esc(rewards),
                ]
            )
    head = ["stage, step", "id", "correct", "answer", "rewards"]
    return "<h2>Rollout samples (last logged step)</h2>\n" + _table(head, table)


def videos_section(run: Path) -> str:
    """Environment rollout videos (`videos/*.mp4`): the first frame (what the policy saw) and the last one
    (the simulated outcome of its answer, drawn on the video)."""
    videos = sorted((run / "videos").glob("*.mp4"))
    if not videos:
        return ""
    table = []
    for path in videos:
        frames = video_frames(path, ends_only=True)
        if not frames:
            table.append([_esc(path.name), "(unreadable)", ""])
            continue
        first, last = (
            _img(encode_png(f), f"{path.stem} {w}") for f, w in ((frames[0], "first"), (frames[-1], "last"))
        )
        table.append([_esc(path.stem), first, last])
    return "<h2>Rollout videos</h2>\n" + _table(["video", "first frame", "outcome (last frame)"], table)


def markdown_html(text: str) -> str:
    """The markdown the runs write (headings, pipe tables, paragraphs) as HTML; the rest stays text."""
    out, table = [], []

    def flush() -> None:
        if table:
            cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in table]
            body = [r for r in cells[1:] if not all(set(c) <= set("-: ") for c in r)]
            out.append(_table(cells[0], [[_esc(c) for c in r] for r in body]))
            table.clear()

    for line in text.splitlines():
        if line.lstrip().startswith("|"):
            table.append(line)
            continue
        flush()
        if line.startswith("#"):
            level = min(len(line) - len(line.lstrip("#")) + 2, 6)
            out.append(f"<h{level}>{_esc(line.lstrip('#').strip())}</h{level}>")
        elif line.strip():
            out.append(f"<p>{_esc(line)}</p>")
    flush()
    return "\n".join(out)


def other_files_section(run: Path, shown: set[str]) -> str:
    """Figures (`*.png`) and result tables (`*.md`, not the `eval_*.md` copies) not shown above."""
    parts = []
    for path in sorted(run.glob("*.md")):
        if not path.name.startswith("eval_") and path.name != "README.md":
            parts.append(f"<h3>{_esc(path.name)}</h3>\n{markdown_html(path.read_text())}")
    for path in sorted(run.glob("*.png")):
        if path.name not in shown:
            parts.append(f"<h3>{_esc(path.name)}</h3>\n{_img(path.read_bytes(), path.stem)}")
    return "<h2>Results and figures</h2>\n" + "\n".join(parts) if parts else ""


def build_report(run_dir: str | Path) -> str:
    """The whole page for `run_dir` as one HTML string."""
    run = Path(run_dir)
    evals = "\n".join(eval_section(p) for p in sorted(run.glob("eval_*.json"), key=_stage_order))
    sections = [
        summary_section(run),
        key_curves_section(run),
        f"<h2>Evaluations</h2>\n{evals}" if evals.strip() else "",
        curves_section(run),
        examples_section(run),
        samples_section(run),
        videos_section(run),
        other_files_section(run, shown={"curves.png"}),
    ]
    body = "\n".join(s for s in sections if s) or "<p>This folder holds no results yet.</p>"
    title = f"embodied report: {run.resolve().name}"
    return (
        f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>{_esc(title)}</title>"
        f"<style>{STYLE}</style></head>\n<body>\n<h1>{_esc(title)}</h1>\n"
        f"<p class='muted'>{_esc(run.resolve())}</p>\n{body}\n</body></html>\n"
    )


def _stage_order(path: Path) -> tuple:
    """eval_initial, eval_sft, eval_grpo in training order, then the rest by name."""
    order = ("initial", "sft", "grpo")
    name = path.stem.removeprefix("eval_")
    return (order.index(name) if name in order else len(order), name)


def write_report(run_dir: str | Path) -> Path:
    """Write `run_dir/report.html` (self-contained) and return its path."""
    run = Path(run_dir)
    if not run.is_dir():
        raise FileNotFoundError(f"{run}: no such run folder")
    out = run / "report.html"
    out.write_text(build_report(run), encoding="utf-8")
    return out
