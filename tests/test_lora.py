"""LoRA adapters and gradient checkpointing on the real tiny model: what trains, what is saved, same grads."""

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from embodied.policy.lora import has_lora, lora_target_regex
from embodied.policy.model import (
    PolicyConfig,
    completion_logprobs,
    encode_completions,
    encode_prompts,
    load,
    load_policy,
    save_policy,
)
from embodied.video import Clip, VideoConfig


def _inputs(processor):
    rng = np.random.default_rng(0)
    clips = [Clip(rng.integers(0, 256, (4, 112, 112, 3), dtype=np.uint8), 2.0) for _ in range(2)]
    records = [
        {"question": "Is this video playing forward or reversed in time?", "options": ["forward", "reversed"]}
    ] * 2
    records = [{**records[0], "video": "a.mp4"}, {**records[1], "images": ["0", "1", "2", "3"]}]
    batch = encode_prompts(processor, records, clips, VideoConfig())
    ids, mask = encode_completions(processor, ["<think></think><answer>A</answer>", "<answer>B</answer>"])
    return batch, ids, mask


def _nll(model, batch, ids, mask):
    logp = completion_logprobs(model, batch, ids, mask)
    return -(logp * mask).sum() / mask.sum()


def test_target_regex_keeps_the_vision_tower_out():
    import re

    pat = lora_target_regex(["q_proj", "gate_proj"])
    assert re.fullmatch(pat, "model.language_model.layers.0.self_attn.q_proj")
    assert re.fullmatch(pat, "model.language_model.layers.1.mlp.gate_proj")
    assert not re.fullmatch(pat, "model.visual.blocks.0.mlp.gate_proj")
    assert not re.fullmatch(pat, "model.language_model.layers.0.self_attn.o_proj")
    assert re.fullmatch(lora_target_regex(["gate_proj"], vision=True), "model.visual.blocks.0.mlp.gate_proj")


def test_lora_trains_only_adapters_and_saves_a_merged_loadable_folder(tiny_path, tmp_path):
    torch.manual_seed(0)
    base, _ = load_policy(tiny_path)
    model, processor = load(PolicyConfig(path=str(tiny_path), lora_rank=4, lora_alpha=8.0))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert not any("visual" in n for n in trainable)
    # 2 text layers x 7 linear layers x (A, B)
    assert len(trainable) == 2 * 7 * 2
    frozen_before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    lora_before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    batch, ids, mask = _inputs(processor)
    model.train()
    with torch.no_grad():  # B starts at zero: the adapted model is the base model
        assert torch.allclose(_nll(model, batch, ids, mask), _nll(base, batch, ids, mask), atol=1e-6)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        _nll(model, batch, ids, mask).backward()
        opt.step()
    model.eval()
    for n, p in model.named_parameters():
        if n in frozen_before:
            assert torch.equal(p, frozen_before[n]), n
    assert all(not torch.equal(p, lora_before[n]) for n, p in model.named_parameters() if n in lora_before)
    with torch.no_grad():
        lp_lora = completion_logprobs(model, batch, ids, mask)
        lp_base = completion_logprobs(base, batch, ids, mask)
    assert (lp_lora - lp_base).abs().max() > 1e-3  # the step changed the output

    save_policy(model, processor, tmp_path / "merged")
    assert has_lora(model)  # saving merged a copy; the live model keeps its adapters
    saved = load_file(tmp_path / "merged" / "model.safetensors")
    assert not any("lora_" in k or "base_layer" in k for k in saved)
    assert set(saved) == set(load_file(tiny_path / "model.safetensors"))
    reloaded, _ = load_policy(tmp_path / "merged")
    with torch.no_grad():
        lp_reloaded = completion_logprobs(reloaded, batch, ids, mask)
    torch.testing.assert_close(lp_reloaded, lp_lora, atol=1e-5, rtol=0)


def _count_calls(module):
    """Calls of `module.forward` (patched on the instance: module hooks do not fire in a recompute)."""
    calls, forward = [], module.forward

    def counted(*args, **kwargs):
        calls.append(1)
        return forward(*args, **kwargs)

    module.forward = counted
    return calls


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_gradient_checkpointing_gives_the_same_loss_and_grads(tiny_path, lora_rank):
    torch.manual_seed(0)
    plain, processor = load(PolicyConfig(path=str(tiny_path), lora_rank=lora_rank))
    torch.manual_seed(0)  # same LoRA init in both
    ckpt, _ = load(PolicyConfig(path=str(tiny_path), lora_rank=lora_rank, gradient_checkpointing=True))
    batch, ids, mask = _inputs(processor)
    calls = {}
    grads = {}
    for name, model in (("plain", plain), ("ckpt", ckpt)):
        calls[name] = _count_calls(model.model.language_model.layers[0].mlp)  # inside the checkpoint
        model.train()
        loss = _nll(model, batch, ids, mask)
        loss.backward()
        grads[name] = (loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    assert len(calls["plain"]) == 1 and len(calls["ckpt"]) == 2  # recomputed in the backward pass
    (loss_a, ga), (loss_b, gb) = grads["plain"], grads["ckpt"]
    torch.testing.assert_close(loss_b, loss_a, atol=1e-5, rtol=0)
    assert ga.keys() == gb.keys() and len(ga) > 0
    for n in ga:
        torch.testing.assert_close(gb[n], ga[n], atol=1e-5, rtol=0, msg=n)
