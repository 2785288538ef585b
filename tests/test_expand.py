"""`policy.expand_layers`: LLaMA Pro block expansion starts the deeper model exactly where the loaded one was
(`embodied/policy/expand.py`)."""

from __future__ import annotations

import pytest
import torch

from embodied.policy.expand import expand_layers, expansion_sources, text_layers
from embodied.policy.model import (
    PolicyConfig,
    completion_logprobs,
    encode_completions,
    encode_examples,
    load,
    load_policy,
    save_policy,
)
from embodied.video import VideoConfig


def test_new_layers_are_spread_over_the_stack():
    # one new layer after each of 2: the copies of layers 0 and 1
    assert expansion_sources(2, 2) == [0, 1]
    # LLaMA Pro's 32 + 8 spacing, here 36 + 4: after every 9th layer (0-based 8, 17, 26, 35)
    assert expansion_sources(36, 4) == [8, 17, 26, 35]
    # more new layers than old ones: two copies follow each layer
    assert expansion_sources(2, 4) == [0, 0, 1, 1]
    assert expansion_sources(3, 1) == [2] and expansion_sources(3, 0) == []
    with pytest.raises(ValueError):
        expansion_sources(2, -1)


def test_the_expanded_model_computes_what_the_loaded_one_did(tiny_path, examples, tmp_path):
    base, processor = load(PolicyConfig(path=str(tiny_path)))
    deep, _ = load(PolicyConfig(path=str(tiny_path), expand_layers=2))
    layers = text_layers(deep)
    assert len(layers) == 4 and deep.config.text_config.num_hidden_layers == 4
    assert [layer.self_attn.layer_idx for layer in layers] == [0, 1, 2, 3]
    assert len(deep.config.text_config.layer_types) == 4
    # the copies (layers 1 and 3) add nothing: their output projections are zero, the rest is the source's
    assert torch.equal(layers[1].self_attn.q_proj.weight, layers[0].self_attn.q_proj.weight)
    assert not layers[1].self_attn.o_proj.weight.any() and not layers[3].mlp.down_proj.weight.any()
    assert layers[2].mlp.down_proj.weight.any()  # an original layer keeps its weights

    batch = encode_examples(processor, examples[:4], VideoConfig(fps=2.0, max_frames=4), torch.device("cpu"))
    ids, mask = encode_completions(processor, ["<think></think><answer>A</answer>"] * 4, torch.device("cpu"))
    with torch.no_grad():
        want = completion_logprobs(base, batch, ids, mask)
        got = completion_logprobs(deep, batch, ids, mask)
    assert torch.equal(want, got)  # bit for bit: a zero projection adds exact zeros to the residual
    prompt = processor.tokenizer("Which way was the clip played?", return_tensors="pt")["input_ids"]
    same_tokens = base.generate(input_ids=prompt, max_new_tokens=6, do_sample=False)
    assert torch.equal(same_tokens, deep.generate(input_ids=prompt, max_new_tokens=6, do_sample=False))

    # it saves as an ordinary folder of the deeper model
    save_policy(deep, processor, tmp_path / "deep")
    again, _ = load_policy(tmp_path / "deep")
    assert len(text_layers(again)) == 4
    with torch.no_grad():
        assert torch.equal(completion_logprobs(again, batch, ids, mask), got)

    # training grows the new layers: the zeroed projections get a gradient first
    loss = -(completion_logprobs(deep, batch, ids, mask) * mask).sum()
    loss.backward()
    assert layers[1].self_attn.o_proj.weight.grad.abs().sum() > 0
    assert layers[1].self_attn.q_proj.weight.grad.abs().sum() == 0  # its output is still multiplied by zero


def test_a_model_without_a_language_model_is_refused():
    with pytest.raises(ValueError, match="language_model.layers"):
        expand_layers(torch.nn.Linear(2, 2), 1)
