"""Experiments, one module each, run by `embodied experiment NAME` (dashes in NAME are underscores here).

Each module defines `run(cfg: Config, out: Path, progress: bool) -> dict`; the dict is printed as JSON and
written to `run_dir/experiment_NAME.json`.
"""
