"""A picture of what the model saw and said: a few test clips with the answer of every stage."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

from embodied.data.load import Example


def pick_examples(examples: Sequence[Example], n: int) -> list[Example]:
    """Up to `n` examples spread over the answer letters (so both directions of time show)."""
    by_answer: dict[str, list[Example]] = {}
    for e in examples:
        by_answer.setdefault(e.record["answer"], []).append(e)
    picked: list[Example] = []
    while len(picked) < min(n, len(examples)):
        for group in by_answer.values():
            if group and len(picked) < n:
                picked.append(group.pop(0))
    return picked


def write_examples(
    out: str | Path, examples: Sequence[Example], results: dict[str, dict], root: str | Path, n: int = 4
) -> Path:
    """Copy `n` test clips to `out`; write `examples.json` and `examples.png` with each stage's answer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    chosen = pick_examples(examples, n)
    preds = {stage: {p["id"]: p for p in res["predictions"]} for stage, res in results.items()}
    rows = []
    for e in chosen:
        rid = e.record["id"]
        shutil.copyfile(Path(root) / e.record["video"], out / f"{rid}.mp4")
        rows.append(
            {
                "id": rid,
                "answer": e.record["answer"],
                "truth": e.record["meta"].get("direction"),
                **{stage: preds[stage][rid]["response"] for stage in preds},
            }
        )
    (out / "examples.json").write_text(json.dumps(rows, indent=2))
    t = max(len(e.clip.frames) for e in chosen)
    fig, axes = plt.subplots(len(chosen), t, figsize=(1.6 * t + 4.5, 1.9 * len(chosen)), squeeze=False)
    for r, (e, row) in enumerate(zip(chosen, rows)):
        for c in range(t):
            ax = axes[r][c]
            ax.axis("off")
            if c < len(e.clip.frames):
                ax.imshow(e.clip.frames[c])
                ax.set_title(f"t={c / e.clip.fps:.1f}s", fontsize=7)
        lines = [f"{row['id']}  truth: {row['answer']} ({row['truth']})"]
        lines += [f"{stage}: {_short(row[stage])}" for stage in preds]
        axes[r][-1].text(
            1.08,
            0.5,
            "\n".join(lines),
            transform=axes[r][-1].transAxes,
            fontsize=7,
            va="center",
            family="monospace",
        )
    fig.tight_layout()
    path = out / "examples.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _short(text: str, width: int = 60) -> str:
    text = text.replace("\n", " ")
    return text if len(text) <= width else "..." + text[-width:]
