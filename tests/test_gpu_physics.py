"""`embodied bench envs` and the MJX backend (issue 53): the bench's CPU path and JSON in the default suite
(real MuJoCo, no JAX needed), MJX's label parity with CPU MuJoCo on JAX's CPU under `-m slow`."""

from __future__ import annotations

import importlib.util
import json

import pytest

from embodied.bench.envs import CPU_BATCHES, GPU_BATCHES, batch_sizes, measure, summary


def test_batch_sizes_parse_and_default_by_device():
    assert batch_sizes([1, 16, 256, 4096], on_gpu=False) == [4096, 256, 16, 1]  # largest first
    assert batch_sizes("4, 1,4", on_gpu=True) == [4, 1]  # a string from the shell, duplicates once
    assert batch_sizes([], on_gpu=True) == sorted(GPU_BATCHES, reverse=True) == [4096, 256, 16, 1]
    assert batch_sizes([], on_gpu=False) == sorted(CPU_BATCHES, reverse=True)
    for bad in ([0], [-4], [2.5], ["x"], "1,,a"):
        with pytest.raises(ValueError, match="not a batch size"):
            batch_sizes(bad, on_gpu=False)


def test_the_bench_without_a_batched_backend_reports_cpu_and_why():
    """The CPU figures come whatever is installed; a batched backend that is missing says what to install."""
    absent = [
        b for b, mod in (("warp", "mujoco_warp"), ("mjx", "jax")) if importlib.util.find_spec(mod) is None
    ]
    if not absent:
        pytest.skip("both mujoco-warp and jax are installed here: no backend is missing")
    with pytest.raises(ValueError, match="bench.env_backends"):
        measure(["push"], ["cpu"], [2])
    cells = []
    result = measure(
        ["push"], absent, [2], cpu_episodes=3, seed=1, on_cell=lambda r: cells.append(r["complete"])
    )
    result = json.loads(json.dumps(result))  # what run_dir/bench_envs.json holds
    for b in absent:
        r = result["backends"][b]
        assert r["status"] == "not installed" and "pip install" in r["reason"], r
    assert result["complete"] and cells == [False]  # one cell: push built and timed on the CPU
    assert result["machine"]["cpus"] >= 1 and result["versions"]["mujoco"]
    push = result["per_task"]["push"]
    assert push["steps_per_episode"] == 1500 and push["build_s_per_episode"] > 0
    cpu = push["cpu"]
    assert cpu["n"] == 3 and cpu["episodes_per_s"] > 0 and 0 <= cpu["success"] <= 1
    assert cpu["steps_per_s"] == pytest.approx(cpu["episodes_per_s"] * 1500)
    assert result["agreement"] == {} and "push   cpu      n=    3" in summary(result)


@pytest.mark.slow
def test_mjx_agrees_with_cpu_mujoco_on_every_task():
    """MJX (float32, JAX's CPU here) and CPU MuJoCo (float64) give the same success label to the same answers
    on place, carry and push, through the reward (8 answers a task: one batch, one compile each)."""
    for module in ("jax", "mujoco.mjx"):
        pytest.importorskip(module, reason="the mjx backend needs `pip install jax mujoco-mjx`")
    from embodied.envs import TASKS
    from embodied.envs.parity import parity

    result = parity(n_per_task=8, seed=0, warmup=False, backend="mjx")
    assert result["device"].startswith(("cpu", "gpu")) and set(result["per_task"]) == set(TASKS)
    for name, r in result["per_task"].items():
        assert r["agree"] == r["n"] == 8, (name, r["disagreements"])
        assert 0 < r["success_cpu"] < 1, name  # the probes cover both outcomes
