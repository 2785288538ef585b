"""Can a question be answered from its option texts alone? A blind lookup, per family / scene / tier.

For each group of a dataset's training split, map each set of option texts to the answer text it most often
has; score that map on a held-out split (questions whose option set never occurred in training get no answer,
so count as wrong). A group where the map answers far above chance leaks its answer through its options (docs/
cosmos.md, "measured levers": topple's 3-segment temporal puzzle, 25 of 25 on the cosmos benchmark)::

    python docs/results/scripts/option_leak.py data/generated/physics_mix_mini \\
        --test data/benchmarks/physics_v1_n400_112x112_4f/test.jsonl
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path

from embodied.data.schema import kind
from embodied.questions import answer_text


def group(record: dict) -> str:
    meta = record["meta"]
    parts = [kind(record), meta.get("variant") or "", meta.get("scene", ""), meta.get("difficulty", "")]
    return "/".join(p for p in parts if p)


def leak_table(train: list[dict], test: list[dict]) -> dict:
    """Per group: option sets seen in training, how well the set decides the answer there (its best fit),
    and the blind lookup's accuracy on `test` with the chance of a uniform guess."""
    table: dict[str, dict] = {}
    seen: dict[str, dict] = defaultdict(lambda: defaultdict(Counter))
    for r in train:
        seen[group(r)][frozenset(r["options"])][answer_text(r)] += 1
    for g in sorted({group(r) for r in test} | set(seen)):
        sets = seen.get(g, {})
        fit = sum(c.most_common(1)[0][1] for c in sets.values()) / max(
            1, sum(sum(c.values()) for c in sets.values())
        )
        rows = [r for r in test if group(r) == g]
        right = sum(
            1
            for r in rows
            if frozenset(r["options"]) in sets
            and sets[frozenset(r["options"])].most_common(1)[0][0] == answer_text(r)
        )
        table[g] = {
            "option_sets": len(sets),
            "train_fit": round(fit, 3),
            "n_test": len(rows),
            "blind_lookup": round(right / len(rows), 3) if rows else None,
            "chance": round(sum(1 / len(r["options"]) for r in rows) / len(rows), 3) if rows else None,
        }
    return table


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", help="dataset folder with train.jsonl (and test.jsonl)")
    ap.add_argument("--test", default="", help="held-out JSONL (default: ROOT/test.jsonl)")
    args = ap.parse_args()
    train = read_jsonl(Path(args.root) / "train.jsonl")
    test = read_jsonl(Path(args.test) if args.test else Path(args.root) / "test.jsonl")
    table = leak_table(train, test)
    print(
        "| group | option sets in training | the set decides the answer (train) | n test | blind lookup",
        end="",
    )
    print(" | chance |")
    print("|---|---|---|---|---|---|")
    for g, r in table.items():
        lookup = "-" if r["blind_lookup"] is None else f"{r['blind_lookup']:.3f}"
        chance = "-" if r["chance"] is None else f"{r['chance']:.3f}"
        print(f"| {g} | {r['option_sets']} | {r['train_fit']:.3f} | {r['n_test']} | {lookup} | {chance} |")


if __name__ == "__main__":
    main()
