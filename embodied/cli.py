"""`embodied`: the command line.

Every command takes `--config FILE.yaml` (differences from the defaults) and dotted `key=value`
overrides, e.g. `embodied sft --config configs/quickstart.yaml sft.lr=1e-3 run_dir=runs/try2`.
`embodied show-config` prints the merged config with every default.
"""

from __future__ import annotations

import argparse
import json
import sys

from embodied.config import ConfigError, load_config, to_yaml

COMMANDS = {
    "generate": "simulate scenes and write an arrow-of-time dataset (JSONL + mp4) under data.root",
    "sft": "supervised fine-tuning of policy.path on data.root's train split; saves run_dir/sft/model",
    "grpo": "GRPO from policy.path on data.root's train split; saves run_dir/grpo/model",
    "eval": "evaluate policy.path on data.root's eval.split: accuracy, 95% interval, chance, unparseable",
    "quickstart": "generate -> evaluate -> SFT -> evaluate -> GRPO -> evaluate, on the tiny model",
    "show-config": "print the merged config (defaults <- --config file <- overrides) as YAML",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="embodied", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_ in COMMANDS.items():
        s = sub.add_parser(name, help=help_, description=help_)
        s.add_argument("--config", "-c", help="YAML file with the differences from the defaults")
        s.add_argument("--quiet", "-q", action="store_true", help="no progress bars")
        s.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. sft.lr=1e-3")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        print(f"embodied: config error: {e}", file=sys.stderr)
        return 2
    if args.command == "show-config":
        print(to_yaml(cfg), end="")
        return 0
    from embodied import run  # heavy imports (torch, transformers) only past argument checking

    progress = not args.quiet
    try:
        result = getattr(run, args.command.replace("-", "_"))(cfg, progress=progress)
    except (FileNotFoundError, ValueError) as e:
        print(f"embodied {args.command}: error: {e}", file=sys.stderr)
        return 1
    if result is not None:
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
