"""No accidental giant on a CPU: a policy that cannot fit stops before it loads, in one line, and the
memory bench measures the quickstart on the tiny policy whatever `policy.path` says."""

from __future__ import annotations

import re
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
    # 8.29 B x 16 bytes of weights, gradients and moments in float32, plus the process and activations
    assert (
        line.startswith("embodied sft: error:") and "weights 30.89" in line and "training state 92.67" in line
    )
    # the default batch of 32 without checkpointing adds ~41 GiB of activations: bfloat16 and LoRA together
    # still leave 37 GiB, so the smallest ways out are three changes
    fix = r"it would fit with policy\.dtype=bfloat16 policy\.lora_rank=16 policy\.gradient_checkpointing=true"
    assert re.search(fix + r" \(\d+\.\d GiB\)", line)
    assert re.search(
        r"or policy\.dtype=bfloat16 policy\.lora_rank=16 sft\.micro_batch_size=1 \(\d+\.\d GiB\)", line
    )
    assert wall < 60  # the meta device: seconds, whatever the machine has


SHAPES = fits.Shapes(
    numel=1_000_000_000,
    linears=(("model.layers.0.mlp.up_proj", 4096, 1024), ("model.visual.blocks.0.mlp.up_proj", 512, 256)),
    layers=10,
    hidden=1024,
    intermediate=4096,
    kv_dim=256,
    vocab=1000,
)


def test_the_plan_item_by_item():
    """Numbers worked out by hand for 1e9 parameters and one adapted 4096 x 1024 layer (the vision layer is
    not adapted without lora_vision)."""
    gib = fits.GIB
    full = fits.Settings(dtype="float32", train=True, rows=2, prompt_tokens=90, completion_tokens=9)
    p = fits.plan(SHAPES, full).items
    assert p["process"] == 1 * gib and p["weights"] == 4e9 and p["training state"] == 12e9
    assert fits.Plan(p).total == sum(v for k, v in p.items() if k != "loading")  # activations > loading
    assert "reference" not in p and p["save"] == 0
    # activations: 2 rows x (90 + 9) = 198 tokens; a layer's working set 198 x (10 x 1024 + 3 x 4096) x 4
    # = 17,842,176 bytes, kept for 10 layers; the logits 2 x 10 x 1000 x (4 + 7 x 4) = 640,000 bytes
    assert p["activations"] == 10 * 17_842_176 + 640_000
    lora = fits.replace(full, dtype="bfloat16", lora_rank=8, lora_targets=("up_proj",), reference=True)
    p = fits.plan(SHAPES, lora).items
    a = 8 * (4096 + 1024)  # adapter parameters
    assert p["weights"] == 2e9 and p["training state"] == 16 * a and p["reference"] == 4 * a
    assert p["save"] == 4096 * 1024 * 2  # one merged weight at a time
    # checkpointing: 10 boundaries of 198 x 1024 x 2 bytes and one layer's working set, in bf16
    ckpt = fits.plan(SHAPES, fits.replace(lora, checkpointing=True)).items["activations"]
    assert ckpt == 10 * 198 * 1024 * 2 + 17_842_176 // 2 + 2 * 10 * 1000 * (2 + 28)
    gen = fits.plan(SHAPES, fits.replace(full, train=False)).items
    assert set(gen) == {"process", "weights", "loading", "activations"}
    assert gen["loading"] == 1000 * 1024 * 4  # one more embedding while building
    # forced choice over 4 options with a 100,000-row vocabulary: 2 rows x 4 x (9 + 8) tokens x 100,000 x
    # (4 + 8) bytes = 163.2 MB beats the rollout's 4.1 MB of KV cache and 3.2 MB of logits
    wide = fits.replace(SHAPES, vocab=100_000)
    choice = fits.plan(wide, fits.replace(full, train=False, options=4)).items["activations"]
    assert choice == 2 * 4 * 17 * 100_000 * 12
    assert gen["activations"] == 2 * 10 * 198 * 256 * 4 + 2 * 2 * 1000 * 4  # KV cache and a step's logits
    assert fits.plan(SHAPES, fits.replace(full, shards=4)).items["weights"] == 1e9  # FSDP over 4
    assert fits.plan(SHAPES, fits.replace(full, cpu=False)).items["process"] == 0


def test_the_vllm_engine_adds_its_weights_kv_cache_and_start_up():
    """`rollout.engine=vllm`: a second copy of the weights, the KV cache as set, and the start-up plus an
    encoder cache of `max_model_len` embeddings; a refusal offers a smaller cache and the hf engine."""
    gib = fits.GIB
    s = fits.Settings(dtype="bfloat16", train=True, lora_rank=8, lora_targets=("up_proj",), rows=2)
    hf = fits.plan(SHAPES, s).items
    vllm = fits.replace(s, engine="vllm", kv_cache_gb=4.0, max_model_len=4096)
    p = fits.plan(SHAPES, vllm).items
    assert p["engine weights"] == 4e9 and p["engine KV cache"] == 4 * gib  # on a CPU: repacked, 2 copies
    assert p["engine"] == int(0.25 * gib) + 4096 * 1024 * 2 and p["engine sync"] == 2e9
    # the sync's transient copy (2 GB) exceeds the update's activations: it is the largest transient item
    assert p["activations"] < p["engine sync"]
    extra = p["engine sync"] - max(hf["loading"], hf["activations"])
    assert fits.Plan(p).total == fits.Plan(hf).total + 4e9 + 4 * gib + p["engine"] + extra
    assert fits.plan(SHAPES, fits.replace(vllm, cpu=False)).items["engine weights"] == 2e9  # a GPU: one
    have = int(fits.Plan(hf).total + 6e9 + 1.5 * gib)  # room for the engine with a 1 GiB cache only
    out = fits.ways_out(SHAPES, vllm, have, "grpo")
    assert any(w.startswith("rollout.kv_cache_gb=1 (") for w in out), out
    assert any(w.startswith("rollout.engine=hf (") for w in out), out


def test_a_refusal_names_only_what_applies_and_fits():
    gib = fits.GIB
    eval_s = fits.Settings(dtype="float32", train=False, rows=64, prompt_tokens=100, completion_tokens=48)
    # 4 GB of float32 weights + 1 GiB process do not fit 4.5 GiB; bfloat16 does; LoRA is never offered to eval
    out = fits.ways_out(SHAPES, eval_s, int(4.5 * gib), "eval")
    assert out and out[0].startswith("policy.dtype=bfloat16 (") and not any("lora" in w for w in out)
    sft = fits.Settings(dtype="bfloat16", train=True, lora_rank=16, lora_targets=("up_proj",), rows=8)
    out = fits.ways_out(SHAPES, sft, int(2.5 * gib))  # 1 + 1.86 GiB: nothing in this config helps
    assert out == []
    full = fits.Settings(dtype="bfloat16", train=True, reference=True, rows=1)
    out = fits.ways_out(SHAPES, full, int(4.5 * gib))  # 1 + 2 + 6 + 2 GB: LoRA fits, dropping the KL does not
    assert any(w.startswith("policy.lora_rank=16 (") for w in out)
    assert not any(w.startswith("grpo.kl_coef=0 ") for w in out)
    huge = fits.replace(SHAPES, numel=40 * 10**9)  # 80 GB of bfloat16 weights: no setting helps on this CPU
    with pytest.raises(fits.TooBig, match=r"weights 74\.51.*no single change of this command's settings"):
        fits.check_plan(huge, fits.replace(sft, rows=1), "sft", "random:huge", "cpu")


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
    # LoRA GRPO of the 3B in bfloat16 on this machine: the reference is the adapters, not a 7 GiB copy
    cfg = load_config("configs/cpu_real_size.yaml", ["policy.path=random:qwen2.5-vl-3b"])
    got = fits.check_command(cfg, "grpo")
    assert got["plan_gib"]["reference"] < 0.1 and got["estimate_gib"] < 9


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
