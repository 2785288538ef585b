"""Does a second look use what it sees? (issue 22) The same policies evaluated twice on the same episodes
by `docs/results/scripts/env_multiturn.py --stages start`: once with `env.turn_clip=outcome` (a failed
answer's turn 2 shows its simulation) and once with `env.turn_clip=frozen` (the same scene, size and
length, held at the reset). Turn 1 is the same in both; only what turn 2 sees differs.

    PYTHONPATH=. python docs/results/scripts/second_look_control.py OUTCOME_DIR FROZEN_DIR --root EPISODES \\
        [--out F]

Each DIR holds `seed<S>/start/predictions.json`. Per seed, with 95% t intervals over episodes (paired):

- greedy and sampled success within two turns, outcome minus frozen;
- the direction of the greedy correction (`eval.env_stats.correction_summary`): after a first strike that
  fell short (overshot), the share of second answers with a larger (smaller) impulse; `balanced` is the mean
  of the two shares: a policy that ignores the outcome and always moves one way scores 0.5.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from embodied.data.load import load_records
from embodied.envs import answer_form, is_interactive
from embodied.eval.env_stats import correction_summary
from embodied.eval.stats import seed_interval


def _within_two(row: dict) -> float:
    return float(any(t["terms"]["reward/success"] > 0 for t in row["turns"][:2]))


def _sampled_within_two(row: dict) -> float:
    return float(np.mean([any(t["success"] > 0 for t in traj[:2]) for traj in row["sampled_turns"]]))


def paired(a: list[float], b: list[float]) -> list[float]:
    return [round(float(x), 4) for x in seed_interval([x - y for x, y in zip(a, b)])]


def compare(outcome: Path, frozen: Path, by_id: dict[str, dict]) -> dict:
    result = {}
    for seed_dir in sorted(outcome.glob("seed*")):
        pa, pb = seed_dir / "start/predictions.json", frozen / seed_dir.name / "start/predictions.json"
        if not pb.exists():
            continue
        ra, rb = (json.loads(p.read_text())["predictions"] for p in (pa, pb))
        rb_by_id = {r["id"]: r for r in rb}
        ra = [r for r in ra if r["id"] in rb_by_id]
        rb = [rb_by_id[r["id"]] for r in ra]
        assert all(x["turns"][0]["response"] == y["turns"][0]["response"] for x, y in zip(ra, rb)), (
            "turn 1 differs between the two evaluations: not the same policy and episodes"
        )
        row = {"n": len(ra)}
        sampled = all("sampled_turns" in r for r in ra + rb)  # greedy-only evaluations have none
        for name, rows in (("outcome", ra), ("frozen", rb)):
            greedy = [_within_two(r) for r in rows]
            row[name] = {
                "greedy_success@1": float(
                    np.mean([r["turns"][0]["terms"]["reward/success"] > 0 for r in rows])
                ),
                "greedy_success@2": float(np.mean(greedy)),
                "corrections": correction_summary(rows, by_id),
            }
            if sampled:
                row[name]["sampled_success@2"] = float(np.mean([_sampled_within_two(r) for r in rows]))
        row["outcome_minus_frozen"] = {
            "greedy_success@2": paired([_within_two(r) for r in ra], [_within_two(r) for r in rb]),
            "balanced_correction": {
                t: round(c["balanced"] - row["frozen"]["corrections"][t]["balanced"], 4)
                for t, c in row["outcome"]["corrections"].items()
            },
        }
        if sampled:
            row["outcome_minus_frozen"]["sampled_success@2"] = paired(
                [_sampled_within_two(r) for r in ra], [_sampled_within_two(r) for r in rb]
            )
        result[seed_dir.name] = row
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outcome", type=Path)
    ap.add_argument("frozen", type=Path)
    ap.add_argument("--root", required=True, help="the evaluated episodes (env.root), for their records")
    ap.add_argument("--answer", default="grid", help="env.answer the policies were evaluated with")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    records = [answer_form(r, a.answer) for r in load_records(a.root, "test") if is_interactive(r)]
    result = compare(a.outcome, a.frozen, {r["id"]: r for r in records})
    text = json.dumps(result, indent=1)
    if a.out:
        a.out.write_text(text + "\n")
    for seed, row in result.items():
        o, f, d = row["outcome"], row["frozen"], row["outcome_minus_frozen"]
        sampled = (
            f", sampled@2 {o['sampled_success@2']:.3f} vs {f['sampled_success@2']:.3f} "
            f"(diff {d['sampled_success@2']})"
            if "sampled_success@2" in d
            else ""
        )
        print(
            f"{seed}: greedy@2 {o['greedy_success@2']:.3f} vs {f['greedy_success@2']:.3f} "
            f"(diff {d['greedy_success@2']}){sampled}, balanced correction "
            f"{ {t: round(c['balanced'], 3) for t, c in o['corrections'].items()} } vs "
            f"{ {t: round(c['balanced'], 3) for t, c in f['corrections'].items()} }"
        )


if __name__ == "__main__":
    main()
