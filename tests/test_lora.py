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


@pytest.mark.parametrize("path", ["tiny-base", "tiny:qwen3-vl", "tiny:qwen3.5"])
def test_streamed_merged_save_writes_what_save_pretrained_writes(path, tmp_path):
    """The LoRA save streams one merged weight at a time; its folder is `save_pretrained`'s with the
    adapters merged by hand (same files, keys, tensors), and it reloads to the adapted model's outputs."""
    from embodied.policy.lora import lora_layers
    from embodied.policy.saving import save_merged

    torch.manual_seed(0)
    model, processor = load(PolicyConfig(path=path, lora_rank=4, lora_alpha=8.0))
    merged = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)  # non-zero adapters, so a merge that forgot one shows
        adapted = set(lora_layers(model))
        for layer_name, layer in ((n, m) for n, m in model.named_modules() if m in adapted):
            delta = layer.get_delta_weight("default")
            merged[f"{layer_name}.weight"] = layer.get_base_layer().weight + delta.to(torch.float32)
    # the reference: transformers' own save of a state dict merged by hand
    state = {}
    for key, value in model.state_dict().items():
        if "lora_" in key:
            continue
        key = key.replace(".base_layer.", ".")
        state[key] = merged.get(key, value)
    model.save_pretrained(tmp_path / "ref", safe_serialization=True, state_dict=state)
    save_merged(model, tmp_path / "streamed")
    ref, got = (
        load_file(tmp_path / "ref" / "model.safetensors"),
        load_file(tmp_path / "streamed" / "model.safetensors"),
    )
    assert list(ref) and set(ref) == set(got)
    for key in ref:
        assert torch.equal(ref[key], got[key]), key
    for name in ("config.json", "generation_config.json"):
        assert (tmp_path / "ref" / name).read_text() == (tmp_path / "streamed" / name).read_text()
    assert sorted(p.name for p in (tmp_path / "streamed").iterdir()) == sorted(
        p.name for p in (tmp_path / "ref").iterdir()
    )


def test_reference_under_lora_equals_a_deep_copy(tiny_path):
    """Under LoRA the KL reference is the live model with its adapters off (fresh adapters) or with frozen
    snapshots of them (adapters trained before): its log-probs equal those of a deep copy made at the same
    moment, after the policy has moved on, in float32 to 1e-6, and it holds no copy of the base weights."""
    import copy

    from embodied.train.distributed import Processes
    from embodied.train.reference import Reference

    for trained_before in (False, True):
        torch.manual_seed(0)
        model, processor = load(PolicyConfig(path=str(tiny_path), lora_rank=4, lora_alpha=8.0))
        batch, ids, mask = _inputs(processor)
        if trained_before:
            with torch.no_grad():
                for n, p in model.named_parameters():
                    if "lora_B" in n:
                        p.normal_(0, 0.1)
        copied = copy.deepcopy(model).eval().requires_grad_(False)
        ref = Reference(model, Processes())
        assert ref.shares_weights and ref.copy is None
        assert (ref.adapters.snapshots is None) is (not trained_before)
        model.train()
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        for _ in range(2):
            opt.zero_grad()
            loss = _nll(model, batch, ids, mask)
            with torch.no_grad(), ref.active() as frozen:  # inside the step, as the GRPO loss calls it
                got = completion_logprobs(frozen, batch, ids, mask)
            loss.backward()  # the policy's saved tensors were not touched by the reference pass
            opt.step()
        assert model.training  # restored
        with torch.no_grad():
            want = completion_logprobs(copied, batch, ids, mask)
            moved = completion_logprobs(model.eval(), batch, ids, mask)
        assert (moved - want).abs().max() > 1e-3  # the policy did move away from the reference
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_keep_best_under_lora_keeps_the_adapters_only(tiny_path):
    from embodied.train.runner import BestWeights

    model, _ = load(PolicyConfig(path=str(tiny_path), lora_rank=4))
    best = BestWeights()
    best.see(1, 0.5, model)
    assert best.weights and all("lora_" in k for k in best.weights)
    lora = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert set(best.weights) == set(lora)
    kept = {n: p.detach().clone() for n, p in lora.items()}
    with torch.no_grad():
        for p in lora.values():
            p.add_(1.0)
    best.restore(model)
    assert all(torch.equal(p, kept[n]) for n, p in lora.items())


def test_is_checkpointing_reads_either_name_transformers_gave_it(tiny_path):
    """Off on a fresh model, on after `enable_gradient_checkpointing`, under the installed transformers
    (`is_activation_checkpointing` in 5.2x, `is_gradient_checkpointing` in 5.19, which `.venv-vllm` runs:
    read as off there, the update took the shared-prefix path and transformers dropped its cache)."""
    from embodied.policy.lora import enable_gradient_checkpointing, is_checkpointing
    from embodied.policy.model import load_policy

    model, _ = load_policy(tiny_path)
    assert not is_checkpointing(model)
    enable_gradient_checkpointing(model)
    assert is_checkpointing(model)
