"""scripts/device/: the two-call device plan of issue 53, rehearsed on the CPU at tiny size (`-m slow`),
and its fail-fast checks (default suite)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "scripts" / "device" / "plan.sh"


def _run(args: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_plan_refuses_an_unknown_call_and_a_device_run_without_out():
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    bad = _run(["bash", str(PLAN), "call3"], env, 30)
    assert bad.returncode == 2 and "unknown call call3" in bad.stderr
    no_out = _run(["bash", str(PLAN), "call1"], env, 30)
    assert no_out.returncode != 0 and "OUT is not set" in no_out.stderr


def test_the_preflight_reads_wheel_tags():
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("preflight", ROOT / "scripts" / "device" / "preflight.py")
    pre = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pre)
    here = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert pre.loadable(Path("trl-1.16.0-py3-none-any.whl"))
    assert not pre.loadable(Path("pandas-3.1.1-cp39-cp39-manylinux_2_28_x86_64.whl")) or here == "cp39"
    assert pre.dist_of(Path("mujoco_core-4.0.0-cp312-cp312-manylinux_2_28_x86_64.whl")) == "mujoco_core"
    assert pre.version_tuple("5.17.0") < pre.MIN_TRANSFORMERS <= pre.version_tuple("5.24.0+local")


@pytest.mark.slow
def test_the_plan_rehearsed_on_the_cpu(tmp_path):
    """Fetch the wheels (each call's carry within 64 MiB), then both calls with `--cpu` into a fresh site
    folder: the JSON of each, with TRL installed from its carried wheel for call 2, inside 9 minutes."""
    t0 = time.perf_counter()
    env = dict(os.environ, OUT=str(tmp_path / "out"), DEVICE_SITE=str(tmp_path / "site"))
    fetched = _run(["bash", str(ROOT / "scripts" / "device" / "fetch_wheels.sh")], env, 300)
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    assert fetched.stdout.count("of 64 MiB") == 3  # call1, call2, extra
    for call in ("call1", "call2"):
        done = _run(["bash", str(PLAN), call, "--cpu"], env, 300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = tmp_path / "out"
    one = json.loads((out / "bench_step_call1.json").read_text())
    for phase in ("sft", "grpo"):
        assert 0 < one[phase]["mfu"] < 1 and one[phase]["peak_memory"]["gib"] > 0
    two = json.loads((out / "bench_step_call2.json").read_text())
    assert "sft" not in two and two["trl"]["status"] == "ran", two["trl"]
    assert two["trl"]["ours_over_trl_median"] > 0
    pre = json.loads((out / "preflight_call2.json").read_text())
    assert not pre["missing"] and "trl" in pre["versions"]
    assert time.perf_counter() - t0 < 540
