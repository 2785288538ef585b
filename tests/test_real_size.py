"""The smallest real architecture, Qwen3.5-0.8B with random weights, trained on this CPU the way a user's
first run would be: bfloat16, LoRA rank 8, gradient checkpointing (configs/cpu_real_size.yaml). Slow: each
step takes minutes on 2 cores (docs/scaling.md, "Real size on a CPU")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

REAL = "random:qwen3.5-0.8b"
REPO = Path(__file__).resolve().parents[1]


def _cli(*args: str, cwd) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "embodied.cli", *args], capture_output=True, text=True, timeout=3000, cwd=cwd
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _metrics(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_qwen3_5_0_8b_trains_one_sft_and_one_grpo_step_with_lora_on_the_cpu(tmp_path):
    from embodied.config import load_config
    from embodied.data.load import load_split
    from embodied.policy.model import (
        completion_logprobs,
        decode,
        encode_prompts,
        generate,
        load,
        save_policy,
    )
    from embodied.policy.random_weights import VOCAB_LIMIT
    from embodied.train.grpo import train_grpo
    from embodied.train.state import Run

    config = str(REPO / "configs" / "cpu_real_size.yaml")
    common = ["-c", config, f"data.root={tmp_path / 'data'}"]
    _cli("generate", *common, cwd=tmp_path)
    out = _cli("sft", *common, f"policy.path={REAL}", f"run_dir={tmp_path / 'sft'}", cwd=tmp_path)
    assert "memory plan: sft with policy.path=random:qwen3.5-0.8b" in out
    (sft,) = [m for m in _metrics(tmp_path / "sft" / "metrics.jsonl") if "optim/grad_norm" in m]
    assert sft["optim/grad_norm"] > 0 and torch.isfinite(torch.tensor(sft["loss/sft"]))

    # GRPO from the saved SFT folder (merged adapters; the decodable-vocabulary mask comes back with it), with
    # a reward that varies between answers so the group advantages are not all zero
    cfg = load_config(config, [f"policy.path={tmp_path / 'sft' / 'model'}", f"data.root={tmp_path / 'data'}"])
    model, processor = load(cfg.policy, "grpo")
    assert getattr(model.config, VOCAB_LIMIT) == len(processor.tokenizer)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    assert before and all("lora_" in n for n in before)
    train = load_split(cfg.data.root, "train", cfg.video, progress=False)

    def distinct_characters(texts, records):
        return [{"reward/total": len(set(t)) / 10.0} for t in texts]

    run = Run.of(
        cfg, model, processor, train, tmp_path / "grpo", reward_fn=distinct_characters, progress=False
    )
    train_grpo(cfg.grpo, run)
    (step,) = [m for m in _metrics(tmp_path / "grpo" / "metrics.jsonl") if "optim/grad_norm" in m]
    assert step["optim/grad_norm"] > 0
    moved = [n for n, p in model.named_parameters() if n in before and not torch.equal(p, before[n])]
    assert moved, "no adapter moved"

    save_policy(model, processor, tmp_path / "grpo" / "model")
    again, _ = load(load_config(config, [f"policy.path={tmp_path / 'grpo' / 'model'}"]).policy)
    example = train[0]
    batch = encode_prompts(processor, [example.record], [example.clip], cfg.video)
    ids, mask = generate(model.eval(), processor, batch, 8, do_sample=False)
    assert decode(processor, ids, mask)[0].strip()  # decodable, non-empty text
    with torch.no_grad():
        want = completion_logprobs(model, batch, ids, mask)
        got = completion_logprobs(again, batch, ids, mask)
    torch.testing.assert_close(got, want, atol=0.05, rtol=0)  # bf16 merge: W + BA rounded once
