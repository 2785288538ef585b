"""Compare one row of several `embodied experiment cosmos` runs, paired by seed: per family and tier, each
arm's accuracy per seed and its mean with a 95% t-interval over seeds, and each arm minus the first (the
control). The input is the runs' saved jobs (`<run_dir>/seed<S>/main/result.json`), so a comparison is
rebuilt from the runs themselves, with the code, weights and library versions each row was made by.

    python docs/results/scripts/cosmos_arms.py --arm "3,000 clips=runs/cosmos_sft900" \\
        --arm "15,000 clips=runs/cosmos_data15k" --row sft --out docs/results/cosmos_data.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from embodied.experiments.cosmos_report import family_mean as _family_mean
from embodied.experiments.cosmos_report import per_family as _per_family
from embodied.experiments.cosmos_report import per_tier as _per_tier
from embodied.experiments.cosmos_report import seed_stat as cosmos_stat


def _stat(values: list[float]) -> dict:
    """The cosmos table's cell (mean, t-interval, min, max) with every seed's value."""
    return cosmos_stat(values) | {"per_seed": [round(v, 4) for v in values]}


def arm_scores(run_dir: Path, row: str) -> dict:
    """One run's `row` per seed: {"seeds", "family": {f: [acc per seed]}, "tier": {f: {t: [...]}}, "chance",
    "provenance", "sft_s"}. An error names the run and the seeds that lack the row."""
    seeds = sorted(int(p.name[4:]) for p in run_dir.glob("seed*") if p.name[4:].isdigit())
    files = {s: run_dir / f"seed{s}" / "main" / "result.json" for s in seeds}
    saved = {s: json.loads(f.read_text()) for s, f in files.items() if f.is_file()}  # {"key", "row"}
    missing = [s for s in seeds if row not in saved.get(s, {}).get("row", {})]
    if not seeds or missing:
        raise SystemExit(
            f"{run_dir}: no saved main-job row {row!r} for seeds {missing or 'any'}; run it first"
        )
    evs = [saved[s]["row"][row] for s in seeds]
    families = sorted(_per_family(evs[0]))
    keys = [saved[s]["key"] for s in seeds]
    return {
        "seeds": seeds,
        "family": {f: [_per_family(e)[f]["accuracy"] for e in evs] for f in families}
        | {"average": [_family_mean(e) for e in evs]},
        "tier": {
            f: {t: [_per_tier(e)[f][t]["accuracy"] for e in evs] for t in _per_tier(evs[0])[f]}
            for f in families
        },
        "chance": {f: _per_family(evs[0])[f]["chance"] for f in families},
        "provenance": keys[0].get("provenance", {}),
        "data": {k: keys[0]["data"][k] for k in ("root", "n_train", "seed")},
        "sft_steps": keys[0]["sft"]["steps"],
        "sft_s": [saved[s]["row"].get("sft_s") for s in seeds],
    }


def compare(arms: dict[str, Path], row: str) -> dict:
    """Every arm's `row` (stats per family and tier) and each arm minus the first, paired by seed."""
    scores = {name: arm_scores(path, row) for name, path in arms.items()}
    control = next(iter(scores))
    c = scores[control]
    chance = c["chance"] | {"average": sum(c["chance"].values()) / len(c["chance"])}
    out: dict = {"row": row, "control": control, "chance": chance, "arms": {}, "minus_control": {}}
    for name, s in scores.items():
        if s["seeds"] != c["seeds"]:
            raise SystemExit(
                f"arm {name!r} has seeds {s['seeds']}, the control {c['seeds']}: cannot pair them"
            )
        fam = {f: _stat(v) for f, v in s["family"].items()}
        out["arms"][name] = {
            "run_dir": str(arms[name]),
            "family": fam,
            "tier": {f: {t: _stat(v) for t, v in ts.items()} for f, ts in s["tier"].items()},
            "above_chance": [f for f in s["chance"] if fam[f]["ci95"][0] > chance[f]],
        } | {k: s[k] for k in ("seeds", "provenance", "data", "sft_steps", "sft_s")}
        if name != control:
            out["minus_control"][name] = {
                f: _stat([a - b for a, b in zip(v, c["family"][f])]) for f, v in s["family"].items()
            } | {
                f"{f}/{t}": _stat([a - b for a, b in zip(v, c["tier"][f][t])])
                for f, ts in s["tier"].items()
                for t, v in ts.items()
            }
    return out


def _cell(s: dict) -> str:
    seeds = " ".join(f"{v:.2f}" for v in s["per_seed"])
    return f"{s['mean']:.3f} [{s['ci95'][0]:.2f}, {s['ci95'][1]:.2f}] ({seeds})"


def markdown(result: dict) -> str:
    """The family table (mean [t-interval] and per-seed values) and the paired differences."""
    arms, chance = result["arms"], result["chance"]
    fams = list(chance)
    n_families, row = len(fams) - 1, result["row"]  # "average" is not a family
    lines = ["| family (chance) | " + " | ".join(arms) + " |", "|---" * (len(arms) + 1) + "|"]
    for f in fams:
        lines.append(
            f"| {f} ({chance[f]:.3f}) | " + " | ".join(_cell(a["family"][f]) for a in arms.values()) + " |"
        )
    for name, d in result["minus_control"].items():
        lines += ["", f"{name} minus {result['control']}, paired by seed:", ""]
        lines += [
            f"- {f}: {d[f]['mean']:+.3f} [{d[f]['ci95'][0]:+.3f}, {d[f]['ci95'][1]:+.3f}]" for f in fams
        ]
    lines += [""] + [
        f"- {n}: {row} interval above chance on {len(a['above_chance'])} of {n_families}: {a['above_chance']}"
        for n, a in arms.items()
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arm", action="append", required=True, help="NAME=RUN_DIR; the first is the control")
    ap.add_argument("--row", default="sft", help="the main job's row: sft, sft_grpo, more_sft, ...")
    ap.add_argument("--out", type=Path, help="write the comparison as JSON here")
    args = ap.parse_args()
    arms = {}
    for item in args.arm:
        name, sep, path = item.partition("=")
        if not sep or not Path(path).is_dir():
            raise SystemExit(f"--arm {item!r}: expected NAME=RUN_DIR with an existing run folder")
        arms[name] = Path(path)
    result = compare(arms, args.row)
    print(markdown(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
