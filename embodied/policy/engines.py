"""Which engine `rollout.engine` names, built for a run (`make_engine`), and the settings each refuses.

Apart from `embodied.policy.sampling` (the seam and the Hugging Face engine) so that naming an engine needs
neither vLLM nor a cycle: the vLLM engine module imports the seam, and this one imports it only when asked.
"""

from __future__ import annotations

import os

from embodied.policy.config import ENGINES
from embodied.policy.sampling import Engine


def check_engine(name: str) -> None:
    """Refuse an unknown `rollout.engine` in one line."""
    if name not in ENGINES:
        raise ValueError(f"rollout.engine={name!r}; choose one of {list(ENGINES)} (docs/training.md)")


def make_engine(cfg, model, processor) -> Engine | None:
    """The engine `cfg.rollout` names (`cfg`: a whole `embodied.config.Config`), built on `model`'s current
    weights; None for `hf` (every call site then runs Hugging Face `generate` on the model itself). A setting
    the engine cannot honour is refused in one line (`check_vllm`)."""
    check_engine(cfg.rollout.engine)
    if cfg.rollout.engine == "hf":
        return None
    check_vllm(cfg)
    from embodied.policy.vllm_engine import VLLMEngine

    return VLLMEngine(model, processor, cfg.rollout.max_model_len, cfg.rollout.kv_cache_gb)


def check_vllm(cfg) -> None:
    """Refuse, in one line, what the vLLM engine does not do (yet): temperatures above 2 (vLLM's bound),
    several processes (one engine per process is not built), and min-p retries (vLLM applies min-p after
    the temperature, the framework before it). A LoRA policy is synced with its adapters merged."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    temps = [cfg.grpo.temperature, *cfg.grpo.temperatures, cfg.expert.temperature, cfg.env.retry_temperature]
    refused = {
        f"a sampling temperature of {max(temps)} (vLLM samples at 2 at most)": max(temps) > 2.0,
        f"{world} processes (one vllm engine per process is not built)": world > 1,
        "env.retry_min_p > 0 (vllm applies min-p after the temperature)": cfg.env.retry_min_p > 0,
    }
    for what, bad in refused.items():
        if bad:
            raise ValueError(f"rollout.engine=vllm cannot run with {what}: use rollout.engine=hf")
