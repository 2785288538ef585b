"""The `policy` section of the config: which model, in what precision, where.

A leaf with no heavy imports, so that `embodied --help` and `embodied show-config` never load torch or
transformers (embodied/config.py imports it; embodied/policy/model.py re-exports it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

LORA_TARGETS_DEFAULT = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The language model's attention and MLP projections: where LoRA adapters go by default."""


@dataclass
class PolicyConfig:
    """Which model, in what precision, where."""

    path: str = "tiny-base"
    """A local Hugging Face folder (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5 for every command; any other
    image-text-to-text family for `embodied eval`); `tiny-base`: the built-in tiny model after perception
    pretraining (embodied/train/pretrain.py); `tiny`: the same model randomly initialised; `tiny:qwen3-vl` /
    `tiny:qwen3.5`: a tiny randomly initialised model of that family;
    `random:NAME`: a published architecture with random weights, no download (NAME: `qwen2.5-vl-3b`,
    `qwen2.5-vl-7b`, `qwen3-vl-2b`, `qwen3-vl-4b`, `qwen3-vl-8b`, `qwen3.5-0.8b`, `qwen3.5-2b`;
    `policy.device=meta` allocates nothing; embodied/policy/random_weights.py)."""
    dtype: str = "float32"
    """float32 | bfloat16 | float16."""
    device: str = "cpu"
    """cpu | cuda | cuda:N."""
    tiny_seed: int = 0
    """Initialisation seed of the tiny model (path=tiny) and of a `random:` policy."""
    processor: str = ""
    """Only for a `random:` policy: a local folder with a tokenizer and processor of the same family (no
    weights needed); empty: the tiny tokenizer with the published image/video processor settings."""
    lora_rank: int = 0
    """LoRA adapter rank (0 = off: full fine-tuning). With LoRA only the adapters train; saving merges them
    into an ordinary Hugging Face folder (see embodied/policy/lora.py)."""
    lora_alpha: float = 16.0
    """LoRA scale numerator: the update is B A * lora_alpha / lora_rank."""
    lora_dropout: float = 0.0
    lora_targets: list[str] = field(default_factory=lambda: list(LORA_TARGETS_DEFAULT))
    """Names of the linear layers that get adapters (the language model's attention and MLP by default)."""
    lora_vision: bool = False
    """Also adapt vision-tower layers with those names (else the vision tower is frozen under LoRA)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: much less activation memory, ~30% more compute."""
    expand_layers: int = 0
    """Insert this many new decoder layers into the language model after loading (LLaMA Pro's block
    expansion, `embodied/policy/expand.py`): each a copy of an existing layer with its output projections
    zeroed, so the deeper model starts computing exactly what the loaded one did. 0 = off. A saved
    checkpoint is an ordinary folder of the deeper model (load it with 0)."""


ENGINES = ("hf", "vllm")
"""`rollout.engine`'s choices (`embodied.policy.sampling`)."""


@dataclass
class RolloutConfig:
    """Which engine samples the answers that GRPO and expert iteration learn from and that `embodied eval`
    scores (`embodied/policy/sampling.py`; docs/training.md, "Rollout engines")."""

    engine: str = "hf"
    """hf: Hugging Face `generate` on the trained model itself (nothing to sync) | vllm: an offline vLLM
    engine in this process, sent the policy's weights after every optimizer step (needs `.venv-vllm`, made by
    scripts/setup_vllm.sh; `embodied/policy/vllm_engine.py`)."""
    max_model_len: int = 4096
    """vllm: the longest prompt plus completion, in tokens, that the engine holds."""
    kv_cache_gb: float = 1.0
    """vllm on a CPU: GiB of memory for the KV cache (`VLLM_CPU_KVCACHE_SPACE`, whole GiB, at least 1)."""
