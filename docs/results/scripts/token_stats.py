"""How much of a policy's visual tokens varies with the clip: the table of docs/results/perception.md.

For each policy, the merged visual tokens of the same clips (`model.model.visual(...).pooler_output`, as
`embodied.eval.probe.visual_features` reads them) are stacked into a (clips, coordinates) matrix:

- size: the standard deviation of all its entries;
- clip-dependent: each coordinate's standard deviation across clips, averaged over coordinates;
- share: clip-dependent / size.

    python docs/results/scripts/token_stats.py --policies tiny tiny-base --n 800 \\
        data.root=data/generated/quickstart

The clips are the first `--n` of `--split` of `data.root` (generated with the config's `data` section when
missing: the quickstart's drop clips by default). Prints a Markdown table and writes JSON to `--out`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def token_stats(features) -> dict:
    """`features`: (clips, coordinates). Returns size, clip-dependent spread and their ratio."""
    size = float(features.std())
    clip_dependent = float(features.std(dim=0).mean())
    share = clip_dependent / size
    return {"size": round(size, 4), "clip_dependent": round(clip_dependent, 4), "share": share}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-c", "--config", action="append", default=[], help="config YAML (repeatable)")
    ap.add_argument("--policies", nargs="+", default=["tiny", "tiny-base"], help="policy paths")
    ap.add_argument("--n", type=int, default=800, help="clips")
    ap.add_argument("--split", default="train")
    ap.add_argument("--out", default="runs/token_stats.json")
    ap.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    args = ap.parse_args()

    import dataclasses

    import torch

    from embodied.config import load_config
    from embodied.data.build import ensure_dataset
    from embodied.data.load import load_split
    from embodied.eval.probe import visual_features
    from embodied.policy.model import load

    cfg = load_config(args.config or None, overrides=args.overrides)
    ensure_dataset(cfg.data, progress=True)
    examples = load_split(cfg.data.root, args.split, cfg.video, progress=True, limit=args.n)
    rows = {}
    for path in args.policies:
        model, processor = load(dataclasses.replace(cfg.policy, path=path))
        with torch.no_grad():
            features = torch.stack(visual_features(model, processor, examples, cfg.video))
        rows[path] = token_stats(features) | {"clips": len(examples), "coordinates": features.shape[1]}
    print("| policy | size | clip-dependent | share that varies with the clip |\n|---|---|---|---|")
    for path, r in rows.items():
        print(f"| {path} | {r['size']:.3f} | {r['clip_dependent']:.3f} | {r['share']:.1%} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    result = {"data": cfg.data.root, "split": args.split, "policies": rows}
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
