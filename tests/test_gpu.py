"""The GPU path (`pytest -m gpu`; skipped where torch sees no CUDA device): what a user with a real
checkpoint changes in the config (`policy.device=cuda`, `policy.dtype=bfloat16`) runs SFT, GRPO and
evaluation on the device, and MuJoCo renders headless there."""

import numpy as np
import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_rendering_runs_headless_and_draws_the_scene(examples):
    frames = np.asarray(examples[0].clip.frames)
    assert frames.ndim == 4 and frames.shape[-1] == 3
    assert frames.std() > 5  # not a blank image: the scene was drawn


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_sft_grpo_and_eval_on_cuda(examples, tiny_path, tmp_path, dtype):
    from embodied.config import GRPOConfig, SFTConfig
    from embodied.eval.loop import MCQEval, evaluate
    from embodied.policy.model import load_policy
    from embodied.train.grpo import train_grpo
    from embodied.train.metrics import read_metrics
    from embodied.train.sft import train_sft
    from embodied.train.state import Run
    from embodied.video import VideoConfig

    torch.manual_seed(0)
    model, processor = load_policy(tiny_path, dtype=dtype, device="cuda")
    p = next(model.parameters())
    assert p.is_cuda and p.dtype == getattr(torch, dtype)
    sft = SFTConfig(steps=30, batch_size=8, lr=3e-3, warmup_steps=5, log_every=5, eval_every=0)
    train_sft(sft, Run(model, processor, examples, tmp_path, progress=False))
    losses = [r["loss/sft"] for r in read_metrics(tmp_path / "metrics.jsonl") if "loss/sft" in r]
    assert all(np.isfinite(losses)) and losses[-1] < 0.5 * losses[0]
    grpo = GRPOConfig(steps=2, prompts_per_step=4, group_size=4, max_new_tokens=16, log_every=1)
    train_grpo(grpo, Run(model, processor, examples, tmp_path, progress=False))
    rows = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["stage"] == "grpo"]
    assert len(rows) == 2 and all(np.isfinite(r["loss/policy"]) for r in rows)
    assert next(model.parameters()).is_cuda
    result = evaluate(model, processor, examples, VideoConfig(), MCQEval(8, 16, progress=False))
    assert result["n"] == len(examples) and result["unparseable"] < 1.0


def test_bfloat16_log_probs_track_float32(examples, tiny_path):
    """The same completions scored in bf16 and fp32 on the GPU: the log-probs GRPO's ratio is built from
    agree to within bf16's precision."""
    from embodied.policy.model import completion_logprobs, encode_completions, encode_prompts, load_policy
    from embodied.video import VideoConfig

    texts = ["<answer>A</answer>", "<answer>B</answer>"]
    out = {}
    for dtype in ("float32", "bfloat16"):
        model, processor = load_policy(tiny_path, dtype=dtype, device="cuda")
        batch = encode_prompts(processor, [e.record for e in examples[:2]], [e.clip for e in examples[:2]],
                               VideoConfig(), device="cuda")  # fmt: skip
        ids, mask = encode_completions(processor, texts, device="cuda")
        with torch.no_grad():
            out[dtype] = completion_logprobs(model, batch, ids, mask).float().cpu()
    diff = (out["float32"] - out["bfloat16"]).abs().max().item()
    assert diff < 0.1, diff


def test_pretrain_runs_on_cuda(tmp_path):
    """`embodied pretrain ... policy.device=cuda`: both stages on the device, a wider from-scratch tower with
    colour bits (how the colour base of docs/results/cosmos_levers.md was built), saved to a folder that
    loads on the CPU."""
    from embodied.config import load_config
    from embodied.policy.model import load_policy
    from embodied.run import pretrain

    cfg = load_config(
        "configs/pretrain_colour.yaml",
        overrides=[
            f"run_dir={tmp_path}",
            "policy.device=cuda",
            "pretrain.n_clips=32",
            "pretrain.n_val=4",
            "pretrain.vision_steps=3",
            "pretrain.steps=3",
            "pretrain.batch_size=8",
            "pretrain.warmup_steps=1",
            "pretrain.workers=0",
        ],
    )
    run = pretrain(cfg, progress=False)
    assert run["device"] == "cuda" and run["parameters"] > 1_500_000
    model, _ = load_policy(run["model"])
    assert not next(model.parameters()).is_cuda
