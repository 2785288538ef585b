"""The built-in tiny models, made locally with no download.

`build_tiny_policy` makes a real `Qwen2_5_VLForConditionalGeneration` of about 0.84 M parameters (or, with
`architecture`, a tiny Qwen3-VL or Qwen3.5 of the same sizes) with a byte-level BPE tokenizer trained locally
(plus Qwen's special tokens and chat template), saved as an ordinary Hugging Face folder that
`embodied.policy.model.load_policy` loads like any real checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

SHIPPED = Path(__file__).parents[1] / "assets" / "tiny_base"
"""The perception-pretrained tiny base shipped with the package (`policy.path=tiny-base`; `embodied pretrain`
rebuilds it)."""
SHIPPED_WORLDS = Path(__file__).parents[1] / "assets" / "tiny_worlds"
"""`tiny-base` continued on captions of every simulated world (`policy.path=tiny-worlds`;
`embodied pretrain -c configs/pretrain_worlds.yaml` rebuilds it)."""

SHIPPED_QWEN3_VL = Path(__file__).parents[1] / "assets" / "tiny_base_qwen3_vl"
"""The same perception pretraining on a tiny Qwen3-VL (`policy.path=tiny-base-qwen3-vl`;
`embodied pretrain pretrain.architecture=qwen3-vl` rebuilds it)."""

TINY_VERSION = 2
"""2: the tokenizer corpus holds the perception captions' words (embodied.questions.caption)."""

# Qwen2.5-VL's special tokens, in Qwen's order, so ids line up with the real vocabulary's tail layout.
QWEN_SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
# Reasoning tags stay whole in the tiny vocabulary so that generation and parsing never see them split.
TAG_TOKENS = ["<think>", "</think>", "<answer>", "</answer>"]

# Qwen2-VL chat format: system turn by default, media placeholders expanded later by the processor.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class TinySpec:
    """Sizes of the locally built model (defaults: 0.84 M parameters, trains on 2 CPU cores)."""

    seed: int = 0
    vocab_size: int = 4000
    vision_depth: int = 2
    vision_hidden: int = 64
    vision_heads: int = 4
    text_layers: int = 2
    text_hidden: int = 128
    text_heads: int = 4
    text_kv_heads: int = 2
    text_intermediate: int = 512
    tokens_per_second: int = 2

    def key(self) -> str:
        blob = json.dumps({"v": TINY_VERSION, **asdict(self)}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]


def family_phrases() -> Iterator[str]:
    """Every fixed phrase the question families write that the tiny tokenizer is trained on.

    Only the default family's phrases (arrow of time): adding the other families' phrases would change the
    tiny model's tokenizer (and its cache key); byte-level BPE encodes their text anyway.
    """
    from embodied.questions import FAMILIES, INSTRUCTION, family, hook

    yield INSTRUCTION
    yield from hook(family(FAMILIES[0]), "phrases")()


_WORDS = """
the a an is are was be to of and or in on at by for with from as it this that these those what which
who where when why how not no yes one two three four first second third last left right top bottom
up down before after behind front object objects ball block box cup frame frames clip video image
picture order real shuffled piece patch time forward backward reversed moving falls drops bounces
rolls slides stops rest stands topples hidden appears vanishes physics gravity energy friction
collision answer question think reason option options
"""
"""Plain English words the tiny BPE is trained on, besides the prompts (`_tokenizer_corpus`), one string."""


def _tokenizer_corpus() -> list[str]:
    """Text the tiny BPE is trained on: every prompt this framework writes, plus plain English words.

    The question families contribute their own phrasing, so prompts tokenize into few tokens.
    """
    from embodied.questions.caption import caption_words

    words = _WORDS.split()
    corpus = list(family_phrases()) + caption_words() * 4
    corpus += ["system\nYou are a helpful assistant.", "user\n", "assistant\n"] * 4
    corpus += [" ".join(words[i : i + 12]) for i in range(0, len(words), 12)]
    corpus += [f"({chr(65 + i)}) {w}" for i, w in enumerate(words[:26])]
    corpus += ["0123456789 0.5 1.0 2.0 10 20 100 -1 +1 = % : ; , . ! ? ' \" ( ) [ ] { } < > / \\"]
    return corpus


def _train_tokenizer(spec: TinySpec):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=QWEN_SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tokenizer_corpus(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=QWEN_SPECIAL_TOKENS[1:],
        clean_up_tokenization_spaces=False,
    )
    fast.add_tokens(TAG_TOKENS)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def vision_token_config(tokenizer) -> dict:
    """The config's ids of Qwen's visual placeholder tokens, as `tokenizer` numbers them."""
    ids = tokenizer.convert_tokens_to_ids
    names = {"image": "<|image_pad|>", "video": "<|video_pad|>"}
    names |= {"vision_start": "<|vision_start|>", "vision_end": "<|vision_end|>"}
    return {f"{k}_token_id": ids(v) for k, v in names.items()}


def _tiny_config(spec: TinySpec, tokenizer):
    from transformers import Qwen2_5_VLConfig

    ids = tokenizer.convert_tokens_to_ids
    vocab = 64 * ((len(tokenizer) + 63) // 64)  # padded for matmul efficiency, as Qwen does
    head_dim = spec.text_hidden // spec.text_heads
    # mrope splits head_dim/2 rotary frequencies over (time, height, width) like Qwen's [16, 24, 24] / 64.
    t_sec = head_dim // 8
    mrope = [t_sec, (head_dim // 2 - t_sec) // 2, head_dim // 2 - t_sec - (head_dim // 2 - t_sec) // 2]
    return Qwen2_5_VLConfig(
        text_config={
            "vocab_size": vocab,
            "hidden_size": spec.text_hidden,
            "intermediate_size": spec.text_intermediate,
            "num_hidden_layers": spec.text_layers,
            "num_attention_heads": spec.text_heads,
            "num_key_value_heads": spec.text_kv_heads,
            "max_position_embeddings": 4096,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": mrope},
            "bos_token_id": ids("<|endoftext|>"),
            "eos_token_id": ids("<|im_end|>"),
            "pad_token_id": ids("<|endoftext|>"),
            "tie_word_embeddings": True,
        },
        vision_config={
            "depth": spec.vision_depth,
            "hidden_size": spec.vision_hidden,
            "intermediate_size": 2 * spec.vision_hidden,
            "num_heads": spec.vision_heads,
            "out_hidden_size": spec.text_hidden,
            "fullatt_block_indexes": [spec.vision_depth - 1],
            "tokens_per_second": spec.tokens_per_second,
            "window_size": 112,
        },
        **vision_token_config(tokenizer),
        tie_word_embeddings=True,
    )


def _tiny_processor(tokenizer):
    from transformers import Qwen2_5_VLProcessor, Qwen2VLImageProcessor, Qwen2VLVideoProcessor

    # Small budgets: a 112x112 frame is 8 merged tokens. Explicit min/max so frames are never upscaled.
    pixels = {"min_pixels": 28 * 28, "max_pixels": 224 * 224}
    return Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(**pixels),
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(**pixels, cap_pixels_per_frame=True, do_sample_frames=False),
        chat_template=CHAT_TEMPLATE,
    )


TINY_ARCHITECTURES = ("qwen2.5-vl", "qwen3-vl", "qwen3.5")
"""The architectures `policy.path=tiny:NAME` builds (`tiny` alone: qwen2.5-vl)."""


def _mrope(head_dim: int) -> list[int]:
    """M-RoPE sections (time, height, width) over `head_dim / 2` frequencies, in Qwen's proportions."""
    t = head_dim // 8
    return [t, (head_dim // 2 - t) // 2, head_dim // 2 - t - (head_dim // 2 - t) // 2]


def _qwen3_text(spec: TinySpec, tokenizer) -> dict:
    """The text config shared by the tiny Qwen3-VL and Qwen3.5 (sizes of `spec`)."""
    ids = tokenizer.convert_tokens_to_ids
    return {
        "vocab_size": 64 * ((len(tokenizer) + 63) // 64),
        "hidden_size": spec.text_hidden,
        "intermediate_size": spec.text_intermediate,
        "num_hidden_layers": spec.text_layers,
        "num_attention_heads": spec.text_heads,
        "num_key_value_heads": spec.text_kv_heads,
        "head_dim": spec.text_hidden // spec.text_heads,
        "max_position_embeddings": 4096,
        "bos_token_id": ids("<|endoftext|>"),
        "eos_token_id": ids("<|im_end|>"),
        "pad_token_id": ids("<|endoftext|>"),
        "tie_word_embeddings": True,
    }


def _qwen3_vision(spec: TinySpec) -> dict:
    """A tiny Qwen3-VL-style vision tower: 16 px patches, 2 x 2 merge, learned positions on an 8 x 8 grid."""
    return {
        "depth": spec.vision_depth,
        "hidden_size": spec.vision_hidden,
        "intermediate_size": 2 * spec.vision_hidden,
        "num_heads": spec.vision_heads,
        "out_hidden_size": spec.text_hidden,
        "patch_size": 16,
        "num_position_embeddings": 64,
    }


def _tiny_qwen3_config(spec: TinySpec, tokenizer, architecture: str):
    """A tiny Qwen3-VL (deepstack from the first vision block) or Qwen3.5 (a linear-attention layer, then a
    full-attention one) built from transformers' own config classes."""
    from transformers import Qwen3_5Config, Qwen3VLConfig

    text, vision = _qwen3_text(spec, tokenizer), _qwen3_vision(spec)
    head_dim = text["head_dim"]
    if architecture == "qwen3-vl":
        text["rope_parameters"] = {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": _mrope(head_dim),
            "mrope_interleaved": True,
        }
        vision["deepstack_visual_indexes"] = [0]
        cls = Qwen3VLConfig
    else:  # qwen3.5: half the head's dimensions rotate, as partial_rotary_factor says
        text["rope_parameters"] = {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
            "mrope_section": _mrope(head_dim // 2),
            "mrope_interleaved": True,
        }
        text["layer_types"] = ["linear_attention", "full_attention"] * (spec.text_layers // 2) + [
            "full_attention"
        ] * (spec.text_layers % 2)
        text |= {
            "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": head_dim // 2,
            "linear_value_head_dim": head_dim // 2,
            "linear_num_key_heads": spec.text_kv_heads,
            "linear_num_value_heads": spec.text_heads,
        }
        cls = Qwen3_5Config
    return cls(
        text_config=text,
        vision_config=vision,
        **vision_token_config(tokenizer),
        tie_word_embeddings=True,
    )


def _tiny_qwen3_processor(tokenizer):
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    # Frames are sized before the processor (embodied.policy.architectures.qwen3_vl); these bounds only keep a
    # processor used by hand from upscaling small frames.
    pixels = {"shortest_edge": 32 * 32, "longest_edge": 256 * 256}
    return Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(patch_size=16, size=pixels),
        tokenizer=tokenizer,
        video_processor=Qwen3VLVideoProcessor(
            size={"shortest_edge": 32 * 32, "longest_edge": 32 * 256 * 256},
            do_sample_frames=False,
            cap_pixels_per_frame=False,
        ),
        chat_template=CHAT_TEMPLATE,
    )


def _tiny_parts(spec: TinySpec, architecture: str):
    """`(model class, config, processor)` of the tiny model of `architecture`."""
    from transformers import (
        Qwen2_5_VLForConditionalGeneration,
        Qwen3_5ForConditionalGeneration,
        Qwen3VLForConditionalGeneration,
    )

    tokenizer = _train_tokenizer(spec)
    if architecture == "qwen2.5-vl":
        return Qwen2_5_VLForConditionalGeneration, _tiny_config(spec, tokenizer), _tiny_processor(tokenizer)
    if architecture not in TINY_ARCHITECTURES:
        raise ValueError(
            f"policy.path=tiny:{architecture}: no such tiny architecture; choose one of {TINY_ARCHITECTURES}"
        )
    cls = Qwen3VLForConditionalGeneration if architecture == "qwen3-vl" else Qwen3_5ForConditionalGeneration
    return cls, _tiny_qwen3_config(spec, tokenizer, architecture), _tiny_qwen3_processor(tokenizer)


def cache_dir() -> Path:
    """Where built artefacts are kept: `$EMBODIED_CACHE`, else `~/.cache/embodied`."""
    return Path(os.environ.get("EMBODIED_CACHE", Path.home() / ".cache" / "embodied"))


def build_tiny_policy(
    out: str | Path | None = None, spec: TinySpec | None = None, architecture: str = "qwen2.5-vl"
) -> Path:
    """Build (or reuse) the tiny folder of `architecture` (`TINY_ARCHITECTURES`) for `spec`; deterministic for
    `spec.seed`.

    Written to a temporary folder and renamed, so an interrupted build never leaves a half folder.
    """
    spec = spec or TinySpec()
    out = Path(out) if out else cache_dir() / f"tiny-{architecture}-{spec.key()}"
    if (out / "config.json").exists():
        return out
    cls, config, processor = _tiny_parts(spec, architecture)
    with torch.random.fork_rng():
        torch.manual_seed(spec.seed)
        model = cls(config)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        processor.save_pretrained(tmp)
        (tmp / "embodied_tiny.json").write_text(json.dumps(asdict(spec), indent=2))
        tmp.rename(out)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (out / "config.json").exists():  # another process may have won the race
            raise
    return out
