"""Contact sheets: a PNG and an animated GIF per question family, so a person can see what was made.

For each family a few records (spread over tiers and answers) are drawn from the dataset's first split
that has them: one row per record with every frame, the question, the options and the right answer marked.
The GIF plays the same records' clips side by side, frame by frame.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np

from embodied.data.schema import kind
from embodied.questions import LETTERS
from embodied.video import VideoError, read_video


def pick(records: list[dict], n: int) -> list[dict]:
    """Up to `n` records, round-robin over (tier, answer) groups so every tier and letter shows."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["meta"].get("difficulty", ""), r["answer"]), []).append(r)
    keys = sorted(groups)
    chosen: list[dict] = []
    while len(chosen) < min(n, len(records)):
        for key in keys:
            if groups[key] and len(chosen) < n:
                chosen.append(groups[key].pop(0))
    return chosen


def write_sheets(root: str | Path, splits: list[str], per_family: int = 6) -> list[Path]:
    """Write `<root>/sheets/<family>.png` and `<family>.gif`; returns the paths written."""
    root = Path(root)
    by_family: dict[str, list[dict]] = {}
    for split in splits:
        path = root / f"{split}.jsonl"
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            by_family.setdefault(kind(rec), {}).setdefault(split, []).append(rec)
    written = []
    for name, per_split in sorted(by_family.items()):
        records = pick(next(iter(per_split.values())), per_family)
        clips = []
        for r in records:
            try:
                frames = read_video(root / r["video"], fps=float(r["meta"].get("fps", 2.0))).frames
                clips.append((r, frames[:1] if r["meta"].get("still") else frames))  # a still: one picture
            except VideoError:
                continue  # a sheet shows what can be shown; load_examples reports unreadable files
        if not clips:
            continue
        out = root / "sheets"
        out.mkdir(exist_ok=True)
        written += [_png(out / f"{name}.png", name, clips), _gif(out / f"{name}.gif", clips)]
    return written


def _caption(r: dict, width: int = 58) -> str:
    meta = r["meta"]
    where = meta.get("source") or meta.get("scene")
    where = where if isinstance(where, str) else ""  # the quickstart's records keep scene parameters there
    head = f"{r['id']}  [{meta.get('difficulty', '?')}]  {where}"
    lines = [head, *textwrap.wrap(r["question"], width)]
    for i, opt in enumerate(r["options"]):
        mark = "  <== answer" if LETTERS[i] == r["answer"] else ""
        lines.append(f"({LETTERS[i]}) {opt}{mark}")
    return "\n".join(lines)


def _png(path: Path, name: str, clips: list[tuple[dict, np.ndarray]]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = max(len(f) for _, f in clips)
    fig, axes = plt.subplots(
        len(clips),
        cols + 1,
        figsize=(1.5 * cols + 4.6, 1.75 * len(clips)),
        squeeze=False,
        gridspec_kw={"width_ratios": [1] * cols + [3.0]},
    )
    for row, (r, frames) in enumerate(clips):
        for c in range(cols + 1):
            ax = axes[row][c]
            ax.axis("off")
            if c < len(frames):
                ax.imshow(frames[c])
                ax.set_title(f"frame {c + 1}", fontsize=6)
        axes[row][cols].text(0.0, 0.5, _caption(r), fontsize=5.5, va="center", family="monospace")
    fig.suptitle(f"{name}: {len(clips)} records (answer marked)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _gif(path: Path, clips: list[tuple[dict, np.ndarray]], ms_per_frame: int = 500) -> Path:
    """The clips side by side (padded to the longest), at the dataset's 2 fps."""
    from PIL import Image

    h = max(f.shape[1] for _, f in clips)
    w = max(f.shape[2] for _, f in clips)
    t = max(len(f) for _, f in clips)
    canvas = np.full((t, h, (w + 4) * len(clips), 3), 255, np.uint8)
    for i, (_, frames) in enumerate(clips):
        for k in range(t):
            f = frames[min(k, len(frames) - 1)]
            canvas[k, : f.shape[0], i * (w + 4) : i * (w + 4) + f.shape[1]] = f
    images = [Image.fromarray(c) for c in canvas]
    images[0].save(path, save_all=True, append_images=images[1:], duration=ms_per_frame, loop=0)
    return path
