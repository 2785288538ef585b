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


def _preflight():
    import importlib.util

    spec = importlib.util.spec_from_file_location("preflight", ROOT / "scripts" / "device" / "preflight.py")
    pre = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pre)
    return pre


def test_the_preflight_reads_wheel_tags():
    import sys

    pre = _preflight()
    here = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert pre.loadable(Path("trl-1.16.0-py3-none-any.whl"))
    assert not pre.loadable(Path("pandas-3.1.1-cp39-cp39-manylinux_2_28_x86_64.whl")) or here == "cp39"
    assert pre.dist_of(Path("mujoco_core-4.0.0-cp312-cp312-manylinux_2_28_x86_64.whl")) == "mujoco_core"
    assert pre.version_tuple("5.17.0") < pre.MIN_TRANSFORMERS <= pre.version_tuple("5.24.0+local")


def test_the_preflight_tells_why_physics_cannot_run():
    """Call 2's physics part: a missing import or a JAX without a GPU is a reason (exit 4, TRL still runs)."""
    pre = _preflight()
    mods = pre.PHYSICS["call2"]
    ok = pre.physics_check({"missing": {}, "jax_devices": ["gpu: NVIDIA H100 80GB HBM3"]}, mods, cpu=False)
    assert ok["ok"] and not ok["reason"]
    no_gpu = pre.physics_check({"missing": {}, "jax_devices": ["cpu: cpu"]}, mods, cpu=False)
    assert not no_gpu["ok"] and "JAX sees no GPU" in no_gpu["reason"]
    assert pre.physics_check({"missing": {}, "jax_devices": ["cpu: cpu"]}, mods, cpu=True)["ok"]  # rehearsal
    missing = {"mujoco.mjx": "ModuleNotFoundError: No module named 'mujoco.mjx'", "torch": "absent"}
    gone = pre.physics_check({"missing": missing, "jax_devices": []}, mods, cpu=False)
    assert not gone["ok"] and "['mujoco.mjx']" in gone["reason"] and "call 1" in gone["reason"]
    assert list(gone["missing"]) == ["mujoco.mjx"]  # torch is the rest of the call's business


@pytest.mark.slow
def test_the_plan_rehearsed_on_the_cpu(tmp_path):
    """Fetch the wheels (each call's carry within 64 MiB), then both calls with `--cpu` into a fresh site
    folder: the JSON of each, with TRL installed from its carried wheel for call 2 and MJX's physics bench
    after it (push, batches 4 and 1, on JAX's CPU), inside 9 minutes."""
    for module in ("jax", "mujoco.mjx"):
        pytest.importorskip(
            module, reason="call 2 ends with MJX's physics bench: `pip install jax mujoco-mjx` to rehearse it"
        )
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
    assert pre["physics"]["ok"] and pre["physics"]["jax_devices"], pre["physics"]
    physics = json.loads((out / "bench_envs_call2.json").read_text())
    assert physics["complete"] and physics["backends"]["mjx"]["batches"] == [4, 1]
    push = physics["per_task"]["push"]
    assert set(push["mjx"]) == {"4", "1"} and push["cpu"]["n"] == 4
    assert physics["agreement"]["mjx"] == {"compared": 4, "agree": 4, "agree_rate": 1.0}
    assert all(cell["episodes_per_s"] > 0 and cell["compile_s"] > 0 for cell in push["mjx"].values())
    assert time.perf_counter() - t0 < 540
