"""Benchmarks, one module each, run by `embodied bench NAME`.

Each module defines `run(cfg: Config, out: Path, progress: bool) -> dict`; the dict is printed as JSON and
written to `run_dir/bench_NAME.json`. Ratios are measured side by side in one process, because these
machines are shared and noisy.
"""

from __future__ import annotations
