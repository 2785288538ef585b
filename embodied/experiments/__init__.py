"""Experiments, one module each, run by `embodied experiment NAME` (dashes in NAME are underscores here).

Each module defines `run(cfg: Config, out: Path, progress: bool) -> dict`; the dict is printed as JSON and
written to `run_dir/experiment_NAME.json`. An experiment's own section (`cosmos`, `env_feedback`, ...) is in
`config.py`: its `cfg` is the core `Config` plus that section (`config.RUNS`), which no other command reads.
"""
