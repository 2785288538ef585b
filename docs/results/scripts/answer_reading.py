"""Score saved responses under both readings of a written order: exact (an order counts only when it is an
option) and nearest (an order that is no option chooses the option it agrees with on most positions; a tie
chooses none: `tasks.nearest_order_option`). The responses are the same, so the difference is the reading
alone (docs/results/cosmos_levers.md, "Order answers read by their nearest option").

Inputs: the predictions of a lever run (`docs/results/scripts/cosmos_levers.py`'s JSON, key `predictions`)
or of a cosmos main job (`<run>/seed<k>/main/sft_predictions.jsonl`), and the JSON-lines split the
questions came from::

    python docs/results/scripts/answer_reading.py runs/cosmos/seed0/main/sft_predictions.jsonl \\
        --questions data/benchmarks/physics_v1_n400_112x112_4f/test.jsonl --out reading.json
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path

from embodied.data.schema import kind
from embodied.eval.stats import seed_interval, wilson_interval
from embodied.questions import LETTERS, chosen_option, option_orders, parse_answer, written_order


def load_predictions(path: Path) -> list[dict]:
    """Rows with `id` and `response`, from a lever JSON or a JSON-lines file."""
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    data = json.loads(text)
    if "predictions" not in data:
        raise ValueError(f"{path}: no `predictions` list; pass a lever run's JSON or a sft_predictions.jsonl")
    return data["predictions"]


def reading_table(rows: list[dict], questions: dict[str, dict]) -> dict:
    """Per family and tier (and `all`): n, exact and nearest accuracy with Wilson intervals, the share of
    answers that write an order that is no option, and the share of those that tie."""
    groups: dict[str, list[tuple[dict, str]]] = defaultdict(list)
    missing = [r["id"] for r in rows if r["id"] not in questions]
    if missing:
        raise ValueError(f"{len(missing)} predictions have no question in the split (first: {missing[0]})")
    wrong = [r["id"] for r in rows if "answer" in r and r["answer"] != questions[r["id"]]["answer"]]
    if wrong:  # ids repeat across datasets (test-000000, ...)
        raise ValueError(
            f"{len(wrong)} predictions disagree with the split on the right answer (first: {wrong[0]}): "
            "they come from another dataset; pass that dataset's test.jsonl as --questions"
        )
    for r in rows:
        q = questions[r["id"]]
        meta = q.get("meta") or {}
        names = ["all", kind(q), f"{kind(q)}/{meta.get('difficulty') or '-'}"]
        if "outcome" in meta:  # object permanence: per question form and per simulated outcome
            names.append(f"{kind(q)}/{meta.get('variant') or '-'}/{meta['outcome']}")
        for g in names:
            groups[g].append((q, r["response"]))
    table = {}
    for g, items in sorted(groups.items()):
        n = len(items)
        exact = sum(chosen_option(t, q["options"], nearest=False) == q["answer"] for q, t in items)
        nearest = sum(chosen_option(t, q["options"]) == q["answer"] for q, t in items)
        ordering = [(q, t) for q, t in items if option_orders(q) is not None]

        def names_none(q: dict, t: str, nearest: bool) -> bool:  # an answer that chooses no option
            return chosen_option(t, q["options"], nearest=nearest) not in set(LETTERS[: len(q["options"])])

        def is_order(q: dict, t: str) -> bool:  # an order of the question's length (not a word or a letter)
            written = written_order(parse_answer(t) or "")
            return written is not None and len(written) == len(option_orders(q)[0])

        off = [(q, t) for q, t in ordering if is_order(q, t) and names_none(q, t, False)]
        ties = sum(names_none(q, t, True) for q, t in off)
        chosen = Counter(chosen_option(t, q["options"]) for q, t in items)
        top, top_n = chosen.most_common(1)[0]
        table[g] = {
            "n": n,
            "exact": exact / n,
            "exact_ci95": list(wilson_interval(exact, n)),
            "nearest": nearest / n,
            "nearest_ci95": list(wilson_interval(nearest, n)),
            "ordering_n": len(ordering),
            "order_not_an_option": len(off) / len(ordering) if ordering else None,  # orders of length k
            "tie_share_of_those": ties / len(off) if off else None,
            "top_choice": top,
            "top_choice_share": top_n / n,
        }
    return table


def seed_summary(tables: list[dict]) -> dict:
    """Over several runs' tables (one per seed, same questions): per group, the mean exact and nearest
    accuracy with 95% Student-t intervals over the runs, and nearest minus exact paired by run."""
    out = {}
    for g in tables[0]:
        if not all(g in t for t in tables):
            continue
        exact, near = ([t[g][k] for t in tables] for k in ("exact", "nearest"))
        out[g] = {
            "runs": len(tables),
            "exact": seed_interval(exact),
            "nearest": seed_interval(near),
            "nearest_minus_exact": seed_interval([b - a for a, b in zip(exact, near)]),
        }
    return out


def _cell(mean_low_high) -> str:
    m, lo, hi = mean_low_high
    return f"{m:.3f} [{lo:.3f}, {hi:.3f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("predictions", type=Path, nargs="+")
    ap.add_argument(
        "--questions", type=Path, required=True, help="the JSON-lines split the questions are from"
    )
    ap.add_argument(
        "--out",
        type=Path,
        help="write the tables here as JSON (one per predictions file, and `seed_summary`)",
    )
    args = ap.parse_args()
    if not args.questions.is_file():
        raise SystemExit(f"{args.questions}: no such file; pass the split's test.jsonl")
    questions = {q["id"]: q for q in map(json.loads, args.questions.read_text().splitlines()) if q}
    out = {}
    for path in args.predictions:
        table = reading_table(load_predictions(path), questions)
        out[str(path)] = table
        print(f"\n{path}")
        print("| group | n | exact [95% CI] | nearest [95% CI] | order no option | ties | most chosen |")
        print("|---|---|---|---|---|---|---|")
        for g, r in table.items():
            share = "-" if r["order_not_an_option"] is None else f"{r['order_not_an_option']:.3f}"
            ties = "-" if r["tie_share_of_those"] is None else f"{r['tie_share_of_those']:.3f}"
            exact, near = (
                f"{r[k]:.3f} [{r[k + '_ci95'][0]:.2f}, {r[k + '_ci95'][1]:.2f}]" for k in ("exact", "nearest")
            )
            top = f"{r['top_choice']} {r['top_choice_share']:.2f}"
            print(f"| {g} | {r['n']} | {exact} | {near} | {share} | {ties} | {top} |")
    if len(out) > 1:  # several runs (seeds) on the same questions: the reading's effect with its interval
        summary = seed_summary(list(out.values()))
        out["seed_summary"] = summary
        print(f"\nover {len(args.predictions)} runs: mean [95% t-interval]")
        print("| group | exact | nearest | nearest - exact, paired |")
        print("|---|---|---|---|")
        for g, r in summary.items():
            print(
                f"| {g} | {_cell(r['exact'])} | {_cell(r['nearest'])} | {_cell(r['nearest_minus_exact'])} |"
            )
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
