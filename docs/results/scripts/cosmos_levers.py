"""One SFT lever on one question family, measured cheaply: SFT from `policy.path` on `data.root`'s train
split for `sft.steps`, then greedy accuracy on its test split (Wilson 95% interval), in one process.

    python docs/results/scripts/cosmos_levers.py -c configs/levers_temporal_topple.yaml --targets trace \\
        --seed 0 \\
        --out runs/levers/trace_s0.json threads=1

`--targets` picks what goes inside `<think>` of every SFT target (the letter follows):
none (empty, the default recipe) | template (the family's fixed sentence, `tasks.reasoning_for`) |
trace (the simulator-derived trace, `tasks.trace_for`: for a puzzle, each shown piece's place in the
original, then the order) | order (only the right order, the option's text). For traces the report
also splits the errors: how often the generated trace names the right order (seeing), and how often the
letter is the option that lists the generated order (matching). docs/results/cosmos_levers.md reports the
runs;
`--collect RUN.json ... --out docs/results/cosmos_levers.json --machine ... --code COMMIT [--keep OLD.json]`
gathers them (each with its machine, code and data's family VERSIONs) and prints their table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import time
from pathlib import Path

TARGETS = ("none", "template", "trace", "order")


def target_text(record: dict, targets: str, answer_as: str = "letter") -> str:
    from embodied.questions import answer_text, format_response, sft_target

    if targets == "order":
        return format_response(answer_text(record), record["answer"])
    return sft_target(record, rationale=targets, answer_as=answer_as)


ORDER = re.compile(r"(\d+(?:\s*,\s*\d+)+)\s*$")


def trace_split(rows: list[dict], records: dict) -> dict:
    """How the responses' traces relate to their letters. `order_right`: the share of traces that end in the
    right order (seeing); `first_right`: the share whose order starts with the right piece (on topple's
    temporal puzzle that alone decides the answer); `order_in_options`: the share whose order is one of the
    four options;
    `letter_matches_order`: of those, the share whose letter is that option (matching; chance 0.25);
    `letter_matches_order_all`: the same count over every response with an order (the first runs' figure);
    `letter_right_when_order_right`: accuracy where the trace's order is right."""
    from embodied.questions import LETTERS, answer_text

    seen = first = matched = with_order = in_options = right_given_seen = 0
    for row in rows:
        rec = records[row["id"]]
        think = re.search(r"<think>(.*?)</think>", row["response"], re.S)
        m = ORDER.search(think.group(1)) if think else None
        if m is None:
            continue
        order = ", ".join(x.strip() for x in m.group(1).split(","))
        with_order += 1
        truth = answer_text(rec)
        saw = order == truth
        first += order.split(",")[0] == truth.split(",")[0]
        seen += saw
        right_given_seen += saw and row["predicted"] == rec["answer"]
        if order in rec["options"]:
            in_options += 1
            matched += row["predicted"] == LETTERS[rec["options"].index(order)]
    return {
        "with_order": with_order / len(rows),
        "order_right": seen / max(1, with_order),
        "first_right": first / max(1, with_order),
        "order_in_options": in_options / max(1, with_order),
        "letter_matches_order": matched / max(1, in_options),
        "letter_matches_order_all": matched / max(1, with_order),
        "letter_right_when_order_right": right_given_seen / max(1, seen),
    }


def collect(paths: list[str], out: Path, machine: str, keep: str = "", code: str = "") -> None:
    """Gather finished runs' JSON (without per-question predictions) into one file and print a table. Each
    run records `code` (what produced it, e.g. a commit) and its data's `generator_version` (the families'
    VERSIONs, from the dataset's manifest); `keep`: an earlier collected file whose runs go first, as they
    are (runs of this collection with the same name replace none of them: name them apart)."""
    kept = json.loads(Path(keep).read_text()) if keep else {"runs": []}
    runs = [{"machine": kept.get("machine", "")} | r for r in kept["runs"]]
    for p in sorted(paths):
        r = json.loads(Path(p).read_text())
        rows = r.pop("predictions", None)
        if rows and r["targets"] in ("trace", "order"):  # recomputed: the split's definition may be newer
            test = Path(r["data"]) / "test.jsonl"
            records = {(x := json.loads(line))["id"]: x for line in test.read_text().splitlines()}
            r["trace"] = trace_split(rows, records)
        elif r["trace"] and "order_in_options" not in r["trace"]:  # a first run: its figure was over all
            r["trace"]["letter_matches_order_all"] = r["trace"].pop("letter_matches_order")
        r["loss_curve"] = r["loss_curve"][::5]  # every 50th step (logged every 10)
        manifest = json.loads((Path(r["data"]) / "manifest.json").read_text())
        made = {"machine": machine, "code": code, "generator_version": manifest.get("generator_version")}
        runs.append({"run": Path(p).stem, **made, "answer_weight": 1.0, **r})  # before the option: 1
    if len({r["run"] for r in runs}) < len(runs):
        raise ValueError("two runs share a name: rename one")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"runs": runs}, indent=1))
    head = (
        "| run | data | targets (answer) | answer weight | seed | steps | SFT s | accuracy [95% CI]"
        " | order right | order is an option"
    )
    tail = " | letter = that option | letter = order, of all | shuffled frames [95% CI] | blind [95% CI] |"
    print(head + tail)
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        t = r.get("trace") or {}
        keys = ("order_right", "order_in_options", "letter_matches_order", "letter_matches_order_all")
        cells = [f"{t[k]:.3f}" if k in t else "-" for k in keys]
        for name in ("shuffled-frames", "blind"):
            b = (r.get("baselines") or {}).get(name)
            cells.append(f"{b['accuracy']:.3f} [{b['ci95'][0]:.2f}, {b['ci95'][1]:.2f}]" if b else "-")
        lo, hi = r["ci95"]
        print(
            f"| {r['run']} | {Path(r['data']).name} | {r['targets']} ({r.get('answer_as', 'letter')}) | "
            f"{r.get('answer_weight', 1.0):g} | "
            f"{r['seed']} | {r['steps']} | "
            f"{r['sft_s']:.0f} | {r['accuracy']:.3f} [{lo:.2f}, {hi:.2f}] | " + " | ".join(cells) + " |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--collect", nargs="+", help="instead of a run: gather these result JSONs into --out")
    ap.add_argument("--machine", default="", help="with --collect: where the runs ran, in words")
    ap.add_argument("--keep", default="", help="with --collect: an earlier JSON whose runs go first")
    ap.add_argument("--code", default="", help="with --collect: what produced these runs (e.g. a commit)")
    ap.add_argument("-c", "--config", action="append", default=[], help="config YAML (repeatable)")
    ap.add_argument("--targets", choices=TARGETS, default="none")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="JSON result")
    from embodied.eval.baselines import VIDEO_BASELINES

    ap.add_argument(
        "--baselines",
        nargs="*",
        default=["blind"],
        choices=VIDEO_BASELINES,
        help="video baselines the trained policy is also scored on (put overrides before this option: "
        "what follows it is read as baselines)",
    )
    ap.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    args = ap.parse_args()
    if args.collect:
        collect(args.collect, Path(args.out), args.machine, args.keep, args.code)
        return

    import torch

    from embodied.config import load_config
    from embodied.data.load import load_split
    from embodied.eval.loop import MCQEval, evaluate, evaluate_free
    from embodied.policy.model import load
    from embodied.train.sft import train_sft
    from embodied.train.state import Run

    cfg = load_config(args.config or None, overrides=args.overrides)
    torch.set_num_threads(max(1, cfg.threads) if cfg.threads else torch.get_num_threads())
    torch.manual_seed(args.seed)
    train = load_split(cfg.data.root, "train", cfg.video)
    test = load_split(cfg.data.root, "test", cfg.video)
    model, processor = load(cfg.policy)
    out = Path(args.out)
    run_dir = out.with_suffix("")
    sft = dataclasses.replace(cfg.sft, eval_every=0, checkpoint_every=0)
    run = Run(model, processor, train, run_dir, cfg.video, seed=args.seed)
    done = train_sft(sft, run, target_fn=lambda r: target_text(r, args.targets, cfg.sft.answer_as))
    t0 = time.perf_counter()
    how = MCQEval(cfg.eval.batch_size, cfg.eval.max_new_tokens, choice=True, progress=False)
    res = evaluate(model, processor, test, cfg.video, how)
    eval_s = time.perf_counter() - t0
    baselines = {}  # the same policy on modified clips: what it answers without the video's evidence
    seeded = dataclasses.replace(cfg, seed=args.seed)
    for name in args.baselines:
        b = evaluate_free(model, processor, test, seeded, baseline=name)
        baselines[name] = {k: b[k] for k in ("accuracy", "ci95", "n", "unparseable")}
        if args.targets in ("trace", "order"):
            baselines[name]["trace"] = trace_split(b["predictions"], {e.record["id"]: e.record for e in test})
    losses = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [m["loss/sft"] for m in losses if "loss/sft" in m]
    records = {e.record["id"]: e.record for e in test}
    keep = ("accuracy", "ci95", "n", "chance", "unparseable", "choice_accuracy", "choice_ci95")
    result = {
        "data": cfg.data.root,
        "policy": cfg.policy.path,
        "targets": args.targets,
        "seed": args.seed,
        "steps": done["steps"],
        "batch_size": cfg.sft.batch_size,
        "lr": cfg.sft.lr,
        "answer_weight": cfg.sft.answer_weight,
        "answer_as": cfg.sft.answer_as,
        "sft_s": round(done["wall_s"], 1),
        "eval_s": round(eval_s, 1),
        "loss_first_last": [losses[0], losses[-1]] if losses else None,
        "loss_curve": losses,
        **{k: res[k] for k in keep if k in res},
        "per_family_tier": {
            t: {tier: {k: v[k] for k in ("accuracy", "ci95", "n") if k in v} for tier, v in tiers.items()}
            for t, tiers in res["per_family_tier"].items()
        },
        "trace": trace_split(res["predictions"], records) if args.targets in ("trace", "order") else None,
        "baselines": baselines,
        "predictions": [
            {k: p[k] for k in ("id", "answer", "predicted", "response")} for p in res["predictions"]
        ],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k not in ("loss_curve", "predictions")}, indent=1))


if __name__ == "__main__":
    main()
