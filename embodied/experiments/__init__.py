"""Experiments, one module each, run by `embodied experiment NAME` (dashes in NAME are underscores here).

Each module defines `run(cfg: Config, out: Path, progress: bool) -> dict`; the dict is printed as JSON and
written to `run_dir/experiment_NAME.json`. An experiment's own section (`cosmos`, `env_feedback`, ...) is in
`config.py`: its `cfg` is the core `Config` plus that section (`config.RUNS`), which no other command reads.
"""

from __future__ import annotations

from embodied.registry import Registry

EXPERIMENTS = Registry("experiment", __name__, lambda module: "run" in module.functions, dashes=True)
"""What `embodied experiment NAME` runs: the modules here that define `run` (helpers do not), named with
dashes for `_` and found without importing them (listing them loads no torch), then any registered with
`EXPERIMENTS.register(module)`."""
