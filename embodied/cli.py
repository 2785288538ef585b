"""`embodied`: the command line.

Every command takes `--config FILE.yaml` (differences from the defaults; repeat it to stack files) and
dotted `key=value` overrides, e.g. `embodied sft -c configs/quickstart.yaml sft.lr=1e-3 run_dir=runs/try2`
or `embodied grpo -c configs/quickstart.yaml -c configs/recipes/dapo.yaml --resume auto`.
`embodied show-config` prints the merged config with every default: the core sections, which the commands
that generate, train and evaluate read; `embodied show-config experiment NAME` (or `bench`) adds that
command's own section (`cosmos.*`, `env_feedback.*`, `bench.*`, ...), which no other command takes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from embodied.registry import registry_of

COMMANDS = {
    "generate": "write a dataset or benchmark of video questions (JSONL + mp4) under data.root",
    "pretrain": "caption-pretrain the tiny model on simulator ground truth (the base that `tiny-base` ships)",
    "sft": "supervised fine-tuning of policy.path on data.root's train split; saves run_dir/sft/model",
    "grpo": "GRPO from policy.path on data.root's train split; saves run_dir/grpo/model",
    "expert": "expert iteration from policy.path on data.root's train split (keep the verified best of N "
    "answers, fine-tune, repeat); saves run_dir/model (default runs/expert/model)",
    "eval": "evaluate policy.path (or the model at eval.endpoint) on data.root's eval.split: accuracy, 95% "
    "interval, chance, unparseable",
    "quickstart": "generate -> evaluate -> SFT -> evaluate -> GRPO -> evaluate, on the tiny model",
    "bench": "run a benchmark (`embodied bench --list` names them); prints and writes JSON",
    "experiment": "run a named experiment (`embodied experiment --list`), e.g. env-feedback",
    "show-config": "print the merged config (defaults <- --config file <- overrides) as YAML; "
    "`show-config experiment NAME` (or `bench`): with that command's own section",
    "compare": "rank several runs' evaluations (eval_*.json) in one table and figure: RUN_DIR... [out=DIR]",
    "report": "rebuild RUN_DIR/report.html (summary, evaluations, curves, examples) from a run folder",
    "export": "write data.root as parquet for verl or EasyR1, or as an lmms-eval task folder (--format)",
}


NAMED = {"bench": "embodied.bench", "experiment": "embodied.experiments"}


def _named(package: str) -> list[str]:
    """The benchmarks' or experiments' names (`embodied.registry`: read from the sources, so that listing
    them loads no torch)."""
    return list(registry_of(package).names())


def _baseline(name: str) -> str:
    """`--baseline NAME`, checked when given (eval/baselines.py loads numpy: not for every `--help`)."""
    from embodied.eval.baselines import BASELINES

    if name not in BASELINES:
        raise argparse.ArgumentTypeError(f"invalid choice: {name!r} (choose from {', '.join(BASELINES)})")
    return name


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="embodied", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_ in COMMANDS.items():
        # argparse %-formats help strings (not descriptions): "95% interval" must reach it as "95%% interval"
        s = sub.add_parser(name, help=help_.replace("%", "%%"), description=help_)
        if name in NAMED:
            s.add_argument("--list", action="store_true", help=f"list the available {name} names")
        if name == "eval":
            s.add_argument(
                "--baseline",
                type=_baseline,
                metavar="NAME",
                help="run a shortcut-audit baseline (same as eval.baseline=NAME; see docs/evaluation.md)",
            )
        if name == "export":
            from embodied.integrations.export import FORMATS

            s.add_argument("--format", choices=FORMATS, help="same as export.format=NAME (default verl)")
        if name == "bench":  # `bench quickstart --against REF` (embodied/bench/quickstart.py)
            s.add_argument("--against", metavar="REF", help="bench quickstart: the commit to compare with")
        if name == "generate":
            s.add_argument(
                "--from-videos",
                metavar="DIR",
                help="make questions from the videos in DIR (data.from_videos)",
            )
            s.add_argument(
                "--episodes",
                action="store_true",
                help="write interactive episodes (train and test) of the env section under env.root instead",
            )
        s.add_argument(
            "--config",
            "-c",
            action="append",
            help="YAML file with the differences from the defaults; repeat to stack files (later wins)",
        )
        if name in ("sft", "grpo", "expert"):
            s.add_argument(
                "--resume",
                metavar="auto|DIR",
                help="continue from the newest complete checkpoint in run_dir (auto) or from DIR",
            )
        s.add_argument("--quiet", "-q", action="store_true", help="no progress bars")
        what = f"NAME of the {name} to run, then " if name in NAMED else ""
        help_ = f"{what}dotted overrides, e.g. sft.lr=1e-3"
        if name == "report":
            help_ = "RUN_DIR: the run or experiment folder (as the run's run_dir)"
        if name == "compare":
            help_ = "RUN_DIR...: run folders holding eval_*.json; out=DIR for the page (default runs/compare)"
        if name == "show-config":
            help_ = "[COMMAND [NAME]]: the config it reads (e.g. experiment cosmos), then dotted overrides"
        s.add_argument("overrides", nargs="*", metavar="key=value", help=help_)
    return p


def _schema(command: str | None, name: str | None):
    """The config class `embodied COMMAND [NAME]` reads (the core `Config`, or an experiment's or a
    benchmark's with its own section), and `load_config`'s `refused`: why each other command's section is
    refused here."""
    from embodied.bench.config import BenchRun
    from embodied.config import Config
    from embodied.experiments.config import RUNS, schema_of

    owners = {("bench", "NAME"): BenchRun} | {("experiment", n): run for n, run in RUNS.items()}
    schema = schema_of(f"{command}/{name}" if name else command or "")
    core = {f.name for f in dataclasses.fields(Config)}
    refused = {}
    for (kind, who), run in owners.items():
        reader = f"`embodied {kind} {who}`"
        if command is None:  # plain `embodied show-config`: say how to show that section
            shown = f"embodied show-config {kind}" + ("" if kind == "bench" else f" {who}")
            why = f"read by {reader} only (`{shown}` shows it)"
        else:
            said = f"embodied {command}" + (f" {name}" if name else "")
            why = f"read by {reader} only; `{said}` would ignore it: drop it from the command line or the "
            why += "config file"
        refused |= {f.name: why for f in dataclasses.fields(run) if f.name not in core and run is not schema}
    return schema, refused


def _shown(words: list[str]) -> tuple[str | None, str | None]:
    """`embodied show-config [COMMAND [NAME]]`: the command (and bench or experiment) whose config to show."""
    command, name = ([*words, None, None])[:2]
    if len(words) > 2 or (command is not None and command not in set(COMMANDS) - {"show-config"}):
        raise ValueError(
            f"{' '.join(words)!r}: give a command (and a bench or experiment NAME), then key=value "
            "overrides, e.g. `embodied show-config experiment cosmos cosmos.seeds=[0]`"
        )
    if command in NAMED and (name is not None or command == "experiment"):
        names = _named(NAMED[command])
        if name not in names:
            raise ValueError(f"unknown or missing {command} name {name!r}; choose one of {names}")
    elif name is not None:
        raise ValueError(f"`embodied {command}` takes no NAME, got {name!r}")
    return command, name


def _report(arguments: list[str]) -> int:
    """`embodied report RUN_DIR` (or `run_dir=RUN_DIR`): write RUN_DIR/report.html, print its path."""
    from embodied.report import write_report

    dirs = [a for a in arguments if "=" not in a] + [a[8:] for a in arguments if a.startswith("run_dir=")]
    if len(dirs) != 1:
        print("embodied report: give one run folder: embodied report RUN_DIR", file=sys.stderr)
        return 2
    try:
        print(write_report(dirs[0]))
    except FileNotFoundError as e:
        print(f"embodied report: error: {e}", file=sys.stderr)
        return 1
    return 0


def _compare(arguments: list[str]) -> int:
    """`embodied compare RUN_DIR... [out=DIR]`: write DIR/compare.html and compare.json, print the page."""
    dirs = [a for a in arguments if "=" not in a]
    outs = [a[4:] for a in arguments if a.startswith("out=")]
    unknown = [a for a in arguments if "=" in a and not a.startswith("out=")]
    if not dirs or unknown or len(outs) > 1:
        print(
            "embodied compare: give run folders and at most out=DIR: embodied compare RUN_DIR...",
            file=sys.stderr,
        )
        return 2
    from embodied.run import compare

    try:
        print(compare(dirs, outs[0] if outs else "runs/compare"))
    except (FileNotFoundError, ValueError) as e:
        print(f"embodied compare: error: {e}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    # overrides may come before and after options (`experiment recipes -c x.yaml k=v`): argparse hands the
    # ones after an option back as unknown
    args, extra = parser.parse_known_args(argv)
    if any(e.startswith("-") for e in extra):
        parser.error(f"unrecognized arguments: {' '.join(e for e in extra if e.startswith('-'))}")
    args.overrides += extra
    args.name = None
    if args.command in NAMED:  # the first argument without "=" names the bench or experiment
        names = _named(NAMED[args.command])
        if args.list:
            print("\n".join(names))
            return 0
        given = [o for o in args.overrides if "=" not in o]
        args.name = given[0] if given else None
        args.overrides = [o for o in args.overrides if o is not args.name]
        if args.name not in names:
            print(
                f"embodied {args.command}: unknown or missing name {args.name!r}; choose one of {names}",
                file=sys.stderr,
            )
            return 2
    if args.command == "report":
        return _report(args.overrides)
    if args.command == "compare":
        return _compare(args.overrides)
    if getattr(args, "baseline", None):
        args.overrides.append(f"eval.baseline={args.baseline}")
    if getattr(args, "format", None):
        args.overrides.append(f"export.format={args.format}")
    if getattr(args, "against", None):
        args.overrides.append(f"bench.against={args.against}")
    if getattr(args, "from_videos", None):
        args.overrides.append(f"data.from_videos={args.from_videos}")
    command, name = args.command, args.name
    if command == "show-config":  # `show-config [COMMAND [NAME]] key=value...`
        try:
            command, name = _shown([o for o in args.overrides if "=" not in o])
        except ValueError as e:
            print(f"embodied show-config: {e}", file=sys.stderr)
            return 2
        args.overrides = [o for o in args.overrides if "=" in o]
    # the schema (omegaconf, numpy) loads only once the arguments parse; torch only past the config
    from embodied.config import ConfigError, config_yaml, load_config

    schema, refused = _schema(command, name)
    try:
        if args.command == "show-config":
            print(config_yaml(args.config, args.overrides, schema, refused), end="")
            return 0
        resume = [f"resume={args.resume}"] if getattr(args, "resume", None) else []
        cfg = load_config(args.config, args.overrides + resume, schema=schema, refused=refused)
    except ConfigError as e:
        print(f"embodied: config error: {e}", file=sys.stderr)
        return 2
    from embodied import run  # heavy imports (torch, transformers) only past argument checking

    progress = not args.quiet
    try:
        if args.command in NAMED:
            result = run.named(NAMED[args.command], args.name, cfg, progress=progress)
        else:
            command = "generate_episodes" if getattr(args, "episodes", False) else args.command
            result = getattr(run, command.replace("-", "_"))(cfg, progress=progress)
    except (FileNotFoundError, ValueError) as e:
        print(f"embodied {args.command}: error: {e}", file=sys.stderr)
        return 1
    if result is not None:
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
