"""Benchmarks, one module each, run by `embodied bench NAME`.

Each module defines `run(cfg: Config, out: Path, progress: bool) -> dict`; the dict is printed as JSON and
written to `run_dir/bench_NAME.json`. Their `cfg` is the core `Config` plus the `bench` section
(`config.BenchRun`), which no other command reads. Ratios are measured side by side in one process,
because these machines are shared and noisy.
"""

from __future__ import annotations

from embodied.registry import Registry

BENCHES = Registry("benchmark", __name__, lambda module: "run" in module.functions, dashes=True)
"""What `embodied bench NAME` runs: the modules here that define `run` (helpers do not), named with
dashes for `_` and found without importing them (listing them loads no torch), then any registered with
`BENCHES.register(module)`."""
