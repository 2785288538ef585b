"""The command line answers at once: `--help`, `show-config`, a misspelt key's error and `--list` must not
import torch or transformers (importing torch alone takes seconds on a 2-core machine)."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = r"""
import contextlib, io, json, sys
from embodied.cli import main
import embodied.config

codes = {}
for argv in (["--help"], ["show-config"], ["show-config", "sft.lrr=1"], ["bench", "--list"],
             ["experiment", "--list"], ["eval", "--help"], ["show-config", "experiment", "cosmos"],
             ["show-config", "bench", "bench.stepz=1"], ["grpo", "cosmos.seeds=[0]"],
             ["experiment", "env-feedback", "env_feedback.armz=[]"]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            codes[" ".join(argv)] = main(argv)
        except SystemExit as e:
            codes[" ".join(argv)] = e.code
    codes[" ".join(argv) + " stderr"] = err.getvalue()
heavy = [m for m in ("torch", "transformers", "torchvision", "mujoco", "tqdm") if m in sys.modules]
print(json.dumps({"heavy": heavy, "codes": codes}))
"""


def test_cli_and_config_do_not_import_torch():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["heavy"] == [], f"the light commands imported {result['heavy']}"
    codes = result["codes"]
    assert codes["--help"] == 0 and codes["show-config"] == 0 and codes["bench --list"] == 0
    assert codes["show-config sft.lrr=1"] == 2
    assert "Did you mean: 'lr'" in codes["show-config sft.lrr=1 stderr"]
    # an experiment's or the benchmarks' section: shown, a misspelt key named, another command's refused
    assert codes["show-config experiment cosmos"] == 0
    assert "Did you mean: 'steps'" in codes["show-config bench bench.stepz=1 stderr"]
    assert "Did you mean: 'arms'" in codes["experiment env-feedback env_feedback.armz=[] stderr"]
    assert "read by `embodied experiment cosmos` only" in codes["grpo cosmos.seeds=[0] stderr"]


def test_show_config_prints_what_load_config_gives():
    """`embodied show-config` prints the merged schema directly (one schema build, not two): the same YAML
    as `to_yaml(load_config(...))` for every shipped config and for overrides."""
    from pathlib import Path

    from test_config import schema_for

    from embodied.config import config_yaml, load_config, to_yaml

    root = Path(__file__).resolve().parents[1]
    cases = [
        ([], ["sft.lr=3e-4", "data.families=[{family: spatial_puzzle, variant: patch}]", "run_dir=${seed}x"])
    ]
    cases += [([str(p)], []) for p in sorted((root / "configs").rglob("*.yaml"))]
    cases.append(
        ([str(root / "configs/quickstart.yaml"), str(root / "configs/recipes/dapo.yaml")], ["seed=3"])
    )
    for paths, overrides in cases:
        schema = schema_for(paths[0]) if paths else schema_for(root / "configs/quickstart.yaml")
        shown = config_yaml(paths, overrides, schema)
        assert shown == to_yaml(load_config(paths, overrides, schema=schema)), (paths, overrides)
