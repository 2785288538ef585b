"""Linear probes of several policies' visual tokens, per question family: what the vision tower carries.

Rebuilds the probe table of docs/results/cosmos.md (before and after a pretraining) from the cosmos
experiment's data (generated if missing) and writes it as JSON and Markdown::

    python docs/results/scripts/probe_table.py -c configs/experiment_cosmos.yaml --policies tiny-base \\
        tiny-worlds \\
        --out docs/results/probe.json

The probe itself is `embodied.eval.probe.probe_families` (fitted on `cosmos.probe_train` training clips,
scored on the benchmark).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-c", "--config", action="append", default=[], help="config YAML (repeatable)")
    ap.add_argument(
        "--policies", nargs="+", default=["tiny-base"], help="policy paths (tiny-base, a folder...)"
    )
    ap.add_argument("--out", default="runs/probe_table.json", help="JSON output; the .md goes beside it")
    ap.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    args = ap.parse_args()

    import torch

    from embodied.config import load_config
    from embodied.eval.probe import probe_families
    from embodied.experiments.config import CosmosRun
    from embodied.experiments.cosmos import _load_data
    from embodied.experiments.reuse import provenance
    from embodied.policy.model import load

    cfg = load_config(args.config or None, overrides=args.overrides, schema=CosmosRun)
    torch.set_num_threads(max(1, cfg.threads) if cfg.threads else torch.get_num_threads())
    data = _load_data(cfg, progress=True)
    n = cfg.cosmos.probe_train
    table: dict = {"data": cfg.data.root, "n_train": n, "policies": {}}
    for path in args.policies:
        t0 = time.perf_counter()
        policy = dataclasses.replace(cfg.policy, path=path)
        model, processor = load(policy)
        rows = probe_families(model, processor, data["train"][:n], data["bench"], cfg.video)
        table["policies"][path] = {
            "provenance": provenance(policy),
            "probes": rows,
            "seconds": round(time.perf_counter() - t0, 1),
        }
        print(f"{path}: {len(rows)} groups in {table['policies'][path]['seconds']} s")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(table, indent=1))
    out.with_suffix(".md").write_text(markdown(table))
    print(markdown(table))


def markdown(table: dict) -> str:
    """One row per family group; per policy, the probe accuracy [95% CI]; the majority class last."""
    names = list(table["policies"])
    groups = sorted({g for p in table["policies"].values() for g in p["probes"]})
    lines = [
        "| family / scene | classes | " + " | ".join(names) + " | majority class |",
        "|---|---|" + "---|" * len(names) + "---|",
    ]
    for g in groups:
        cells, first = [], None
        for name in names:
            r = table["policies"][name]["probes"].get(g)
            first = first or r
            cells.append(f"{r['accuracy']:.3f} [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}]" if r else "-")
        lines.append(f"| {g} | {first['classes']} | " + " | ".join(cells) + f" | {first['majority']:.3f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
