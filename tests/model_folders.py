"""Tiny model folders built here from transformers' own config classes, as a user's checkpoint folder would
arrive (not by `embodied.policy.tiny`): Qwen3-VL, LLaVA-OneVision (SigLIP + Qwen2), Gemma 3 (images only) and
a text-only language model. Each reuses the shipped tiny tokenizer, with the family's placeholder tokens
added, and the family's own chat-template markers."""

from __future__ import annotations

from pathlib import Path

import torch

from embodied.policy.tiny import SHIPPED

_MEDIA = {
    "video": "<|vision_start|><|video_pad|><|vision_end|>",
    "image": "<|vision_start|><|image_pad|><|vision_end|>",
}


def _template(video: str, image: str) -> str:
    return (
        "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
        "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
        "{% for part in message['content'] %}"
        f"{{% if part['type'] == 'video' %}}{video}{{% elif part['type'] == 'image' %}}{image}"
        "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )


def _tokenizer(extra: list[str] | None = None, **named):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(SHIPPED)
    if extra:
        tok.add_special_tokens({"additional_special_tokens": extra})
    for key, value in named.items():
        setattr(tok, key, value)
    return tok


def _save(model, processor, out: Path) -> Path:
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


def _vocab(tok) -> int:
    return 64 * ((len(tok) + 63) // 64)


def qwen3_vl(out: Path, moe: bool = False) -> Path:
    """Qwen3-VL: 16 px patches, deepstack from the first vision block, interleaved M-RoPE. `moe`: the
    mixture-of-experts variant (Qwen3-VL-30B-A3B's architecture): 4 experts, 2 routed per token."""
    from transformers import (
        Qwen2VLImageProcessor,
        Qwen3VLConfig,
        Qwen3VLForConditionalGeneration,
        Qwen3VLMoeConfig,
        Qwen3VLMoeForConditionalGeneration,
        Qwen3VLProcessor,
    )
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    tok = _tokenizer()
    ids = tok.convert_tokens_to_ids
    text = dict(
        vocab_size=_vocab(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        eos_token_id=ids("<|im_end|>"),
        pad_token_id=ids("<|endoftext|>"),
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [4, 6, 6],
            "mrope_interleaved": True,
        },
    )
    vision = dict(
        depth=1,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        out_hidden_size=64,
        num_position_embeddings=64,
        deepstack_visual_indexes=[0],
    )
    if moe:
        text |= dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=1)
    config = (Qwen3VLMoeConfig if moe else Qwen3VLConfig)(
        text_config=text,
        vision_config=vision,
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
    )
    torch.manual_seed(0)
    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(patch_size=16),
        tokenizer=tok,
        video_processor=Qwen3VLVideoProcessor(),
        chat_template=_template(_MEDIA["video"], _MEDIA["image"]),
    )
    model = (Qwen3VLMoeForConditionalGeneration if moe else Qwen3VLForConditionalGeneration)(config)
    return _save(model, processor, out)


def qwen3_vl_moe(out: Path) -> Path:
    """Qwen3-VL's mixture-of-experts variant (see `qwen3_vl`)."""
    return qwen3_vl(out, moe=True)


def llava_onevision(out: Path) -> Path:
    """LLaVA-OneVision: a SigLIP tower and a Qwen2 language model; `<video>` / `<image>` placeholders."""
    from transformers import (
        LlavaOnevisionConfig,
        LlavaOnevisionForConditionalGeneration,
        LlavaOnevisionProcessor,
        Qwen2Config,
        SiglipVisionConfig,
    )
    from transformers.models.llava_onevision.image_processing_llava_onevision import (
        LlavaOnevisionImageProcessor,
    )
    from transformers.models.llava_onevision.video_processing_llava_onevision import (
        LlavaOnevisionVideoProcessor,
    )

    tok = _tokenizer(["<image>", "<video>"])
    ids = tok.convert_tokens_to_ids
    vision = SiglipVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
    )
    text = Qwen2Config(
        vocab_size=_vocab(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        eos_token_id=ids("<|im_end|>"),
        pad_token_id=ids("<|endoftext|>"),
    )
    config = LlavaOnevisionConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=ids("<image>"),
        video_token_index=ids("<video>"),
        vision_feature_layer=-1,
        image_grid_pinpoints=[[32, 32]],
    )
    torch.manual_seed(0)
    processor = LlavaOnevisionProcessor(
        image_processor=LlavaOnevisionImageProcessor(
            size={"height": 32, "width": 32}, image_grid_pinpoints=[[32, 32]]
        ),
        video_processor=LlavaOnevisionVideoProcessor(size={"height": 32, "width": 32}),
        tokenizer=tok,
        chat_template=_template("<video>\n", "<image>\n"),
        num_image_tokens=16,
        vision_feature_select_strategy="full",
    )
    return _save(LlavaOnevisionForConditionalGeneration(config), processor, out)


def text_only(out: Path) -> Path:
    """A text-only language model (Qwen2), which has no vision tower."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = _tokenizer()
    config = Qwen2Config(
        vocab_size=_vocab(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def gemma3(out: Path) -> Path:
    """Gemma 3: a SigLIP tower and a Gemma 3 language model; images only (a clip's frames go in as images)."""
    from transformers import (
        AutoTokenizer,
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3Processor,
        Gemma3TextConfig,
        SiglipVisionConfig,
    )
    from transformers.models.gemma3.image_processing_gemma3 import Gemma3ImageProcessor

    named = {
        "boi_token": "<start_of_image>",
        "eoi_token": "<end_of_image>",
        "image_token": "<image_soft_token>",
    }
    tok = AutoTokenizer.from_pretrained(SHIPPED, extra_special_tokens=named)
    ids = tok.convert_tokens_to_ids
    vision = SiglipVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
    )
    text = Gemma3TextConfig(
        vocab_size=_vocab(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        sliding_window=64,
        eos_token_id=ids("<|im_end|>"),
        pad_token_id=ids("<|endoftext|>"),
    )
    config = Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=4,
        boi_token_index=ids(named["boi_token"]),
        eoi_token_index=ids(named["eoi_token"]),
        image_token_index=ids(named["image_token"]),
    )
    torch.manual_seed(0)
    processor = Gemma3Processor(
        image_processor=Gemma3ImageProcessor(size={"height": 32, "width": 32}),
        tokenizer=tok,
        chat_template=_template("", named["boi_token"]),
        image_seq_length=4,
    )
    return _save(Gemma3ForConditionalGeneration(config), processor, out)


def qwen3_5_moe(out: Path) -> Path:
    """Qwen3.5's mixture-of-experts variant (linear-attention and full-attention layers, 4 routed experts, 2
    per token, and a shared expert): `tiny:qwen3.5`'s tokenizer, processor and sizes, with the MoE
    architecture built from transformers' `Qwen3_5MoeConfig` and fresh random weights."""
    import json
    import shutil

    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

    from embodied.policy.model import resolve_policy_path

    dense = Path(resolve_policy_path("tiny:qwen3.5"))
    shutil.copytree(dense, out, ignore=shutil.ignore_patterns("model.safetensors", "embodied_tiny.json"))
    raw = json.loads((dense / "config.json").read_text())
    text = {k: v for k, v in raw["text_config"].items() if k not in ("model_type", "architectures")}
    text |= dict(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64
    )
    vision = {k: v for k, v in raw["vision_config"].items() if k != "model_type"}
    rest = {k: v for k, v in raw.items() if k.endswith("_token_id")}
    config = Qwen3_5MoeConfig(text_config=text, vision_config=vision, **rest)
    torch.manual_seed(0)
    Qwen3_5MoeForConditionalGeneration(config).save_pretrained(out)
    return out
