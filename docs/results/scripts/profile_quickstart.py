"""Where a quickstart's seconds go: one quickstart in this process under the timers of
embodied/bench/timers.py, then `bench.profile_clips` clips made in this process (physics, render, encode).

    .venv/bin/python docs/results/scripts/profile_quickstart.py OUT.json [dotted overrides, e.g. threads=1]

Data go to a fresh folder beside OUT.json, so generation is timed too. The tables in
docs/results/quickstart.md ("Where the seconds go") are read from OUT.json.
"""

import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

from embodied import run as commands
from embodied.bench.config import BenchRun
from embodied.bench.timers import GENERATION_TARGETS, TARGETS, timing
from embodied.config import as_schema, load_config
from embodied.data.build import source_of
from embodied.data.engine import write_dataset


def main(out: Path, overrides: list[str]) -> dict:
    cfg = load_config([], overrides, schema=BenchRun)  # bench.profile_clips
    work = out.with_suffix("")
    data = dataclasses.replace(cfg.data, root=str(work / "data"))
    qcfg = dataclasses.replace(as_schema(cfg), data=data, run_dir=str(work / "quickstart"))
    with timing(TARGETS) as timers:
        summary = commands.quickstart(qcfg, progress=False)
    result = {"overrides": overrides, "summary": summary, "quickstart": timers.table()}
    if n := cfg.bench.profile_clips:
        with tempfile.TemporaryDirectory() as tmp:
            gen = dataclasses.replace(cfg.data, root=tmp, workers=0, n_train=n, n_val=0, n_test=0)
            with timing(GENERATION_TARGETS) as g:
                t0 = time.perf_counter()
                write_dataset(source_of(gen), progress=False)
                wall = time.perf_counter() - t0
        result["generation_in_process"] = {"clips": n, "wall_s": round(wall, 2), "timers": g.table()}
    out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
