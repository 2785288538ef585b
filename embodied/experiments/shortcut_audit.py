"""`embodied experiment shortcut-audit`: the policy and every baseline on one split, in one table.

Runs `policy.path` on `eval.split` as it is, then with each video baseline (blind, single-frame,
shuffled-frames), then the model-free baselines (random, majority), and writes each result as
`eval_<split>_<name>.json/.md` plus `audit_<split>.md`: one row per family (and family x tier), one
column per run. A video-baseline cell whose 95% interval lies wholly above chance is marked `(!)`:
what was left of the video (or the text) still gives the answer away there.
See docs/evaluation.md for what each baseline must show.
"""

from __future__ import annotations

import json
from pathlib import Path

from embodied.config import Config
from embodied.data.load import load_examples
from embodied.environment import stamped
from embodied.eval.baselines import VIDEO_BASELINES, model_free_eval
from embodied.eval.loop import MCQEval, evaluate
from embodied.eval.stats import markdown_table, resolve_k, wilson_interval
from embodied.policy.model import load

RUNS = ("none", *VIDEO_BASELINES, "random", "majority")


def _cell(s: dict, key: str, flag: bool) -> str:
    """`key` of stats `s` (with its 95% interval for accuracy); `(!)` if flagged and wholly above chance."""
    if key not in s:
        return "-"
    lo, hi = wilson_interval(s[key] * s["n"], s["n"])
    text = f"{s[key]:.3f}" + (f" [{lo:.2f}, {hi:.2f}]" if key == "accuracy" else "")
    return text + (" (!)" if flag and lo > s["chance"] else "")


def audit_table(results: dict[str, dict], key: str = "accuracy") -> str:
    """Markdown: rows overall / family / family x tier, columns the runs of `results`, cells `key`."""
    names = list(results)
    head = ["family", "tier", "n", "chance", *("policy" if n == "none" else n for n in names)]
    first = results[names[0]]

    def row(family: str, tier: str, pick) -> str:
        stats = {n: pick(results[n]) for n in names}
        base = stats[names[0]]
        cells = [family, tier, str(base["n"]), f"{base['chance']:.3f}"]
        cells += [_cell(stats[n], key, n in VIDEO_BASELINES) for n in names]
        return "| " + " | ".join(cells) + " |"

    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), row("**all**", "all", lambda r: r)]
    for family in first["per_family"]:
        lines.append(row(family, "all", lambda r, f=family: r["per_family"][f]))
        for tier in first["per_family_tier"][family]:
            lines.append(row(family, tier, lambda r, f=family, x=tier: r["per_family_tier"][f][x]))
    return "\n".join(lines) + "\n"


def run(cfg: Config, out: Path, progress: bool = True) -> dict:
    e = cfg.eval
    ks = resolve_k(e.samples, e.k)
    model, processor = load(cfg.policy)
    examples, skipped = load_examples(
        cfg.data.root, e.split, cfg.video.fps, cfg.video.max_frames, limit=e.limit, progress=progress
    )
    if not examples:
        raise ValueError(f"{cfg.data.root}/{e.split}.jsonl has no readable examples ({len(skipped)} skipped)")
    results: dict[str, dict] = {}
    for name in RUNS:
        if name in ("random", "majority"):
            res = model_free_eval(cfg.data.root, e.split, name, cfg.seed, e.samples, ks, e.limit)
        else:
            # media auto, not eval.media, as the audit has always run
            how = MCQEval.of(cfg, progress=progress, desc=name, baseline=name, k=ks, media="auto")
            res = evaluate(model, processor, examples, cfg.video, how)
        res["skipped_videos"] = skipped
        tag = e.split if name == "none" else f"{e.split}_{name}"
        (out / f"eval_{tag}.json").write_text(json.dumps(stamped(res), indent=2))
        (out / f"eval_{tag}.md").write_text(markdown_table(res, f"{cfg.policy.path} {name} on {e.split}"))
        results[name] = res
    title = f"Shortcut audit: {cfg.policy.path} on {cfg.data.root}/{e.split}"
    text = f"### {title}\n\nStrict accuracy [95% CI]\n\n{audit_table(results)}"
    if e.choice:
        video_runs = {n: results[n] for n in ("none", *VIDEO_BASELINES)}
        text += f"\nForced-choice accuracy\n\n{audit_table(video_runs, 'choice_accuracy')}"
    (out / f"audit_{e.split}.md").write_text(text)
    print(text)
    keys = ("n", "accuracy", "ci95", "chance", "unparseable", "choice_accuracy")
    return {n: {k: r[k] for k in keys if k in r} for n, r in results.items()}
