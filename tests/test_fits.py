"""No accidental giant on a CPU: a policy that cannot fit stops before it loads, in one line, and the
memory bench measures the quickstart on the tiny policy whatever `policy.path` says."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from embodied.config import load_config
from embodied.policy import fits


def test_a_7b_sft_on_the_cpu_is_refused_in_one_line_before_loading():
    t0 = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "embodied.cli",
            "sft",
            "policy.path=random:qwen2.5-vl-7b",
            "run_dir=/nonexistent/x",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    wall = time.perf_counter() - t0
    assert proc.returncode == 1, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert line.startswith("embodied sft: error:") and "123.6 GiB" in line  # 8.29 B x 16 bytes
    for way_out in ("policy.device=cuda", "policy.lora_rank", "bench.memory_quickstart=false"):
        assert way_out in line
    assert wall < 60  # the meta device: seconds, whatever the machine has


def test_estimates_per_layout():
    n = 1_000_000_000
    assert fits.estimate(n, "float32", True, False, False) == (16 * n, "weights + gradients + AdamW state")
    assert fits.estimate(n, "bfloat16", True, False, True)[0] == 8 * n + 2 * n  # + the GRPO reference
    assert fits.estimate(n, "bfloat16", True, True, False)[0] == 2 * n  # LoRA: frozen weights
    assert fits.estimate(n, "bfloat16", False, False, False)[0] == 2 * n  # generation: weights only
    assert fits.estimate(n, "float32", True, False, False, shards=4)[0] == 4 * n  # FSDP over 4


def test_the_check_admits_what_fits_and_names_what_does_not():
    cfg = load_config(None, ["policy.path=random:qwen2.5-vl-3b"])
    with pytest.raises(fits.TooBig, match=r"3\.75 B parameters"):
        fits.check_command(cfg, "grpo")
    assert (
        fits.check_command(
            load_config(None, ["policy.path=random:qwen2.5-vl-3b", "policy.device=meta"]), "sft"
        )
        is None
    )
    assert fits.check_command(load_config(None, ["policy.path=tiny"]), "sft") is None


def test_a_folder_is_counted_from_its_safetensors_headers(tiny_path):
    from embodied.policy.model import count_parameters, load_policy

    model, _ = load_policy(tiny_path)
    assert fits.safetensors_numel(tiny_path) == count_parameters(model)
    cfg = load_config(None, [f"policy.path={tiny_path}"])
    assert fits.check_command(cfg, "eval")["parameters"] == count_parameters(model)


def test_the_memory_bench_measures_the_quickstart_on_its_own_policy(tmp_path):
    from embodied.bench.config import BenchRun
    from embodied.bench.memory import quickstart_config

    cfg = load_config(None, ["policy.path=random:qwen2.5-vl-3b", "policy.dtype=bfloat16"], schema=BenchRun)
    measured = quickstart_config(cfg, tmp_path)
    assert measured.policy == load_config(None, []).policy  # the tiny base, float32, CPU
    assert measured.data.root == str(tmp_path / "data")
    fits.check_command(measured, "quickstart")  # and the guard lets it through
    asked = load_config(None, ["bench.memory_overrides=[policy.path=tiny]"], schema=BenchRun)
    assert quickstart_config(asked, tmp_path).policy.path == "tiny"  # an explicit override still applies
