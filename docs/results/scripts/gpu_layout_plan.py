"""The colocated vLLM engine on one 80 GB GPU, planned per term (docs/scaling.md, "The colocated engine on
one 80 GB GPU"): `embodied.policy.fits.plan` of Qwen2.5-VL-3B and Qwen3-VL-4B (shapes on the meta device,
`random:` configs) under their configs stacked with configs/vllm_colocated_80gb.yaml, full fine-tuning and
LoRA rank 16, with the KV cache a whole step needs and the bytes one weight sync moves.

    .venv/bin/python docs/results/scripts/gpu_layout_plan.py > docs/results/gpu_layout_plan.json
"""

from __future__ import annotations

import json

from embodied.config import load_config
from embodied.environment import stamped
from embodied.policy import fits
from embodied.policy.random_weights import random_config

MODELS = (("qwen2.5-vl-3b", "configs/qwen2_5_vl_3b.yaml"), ("qwen3-vl-4b", "configs/qwen3_vl_4b.yaml"))


def main() -> dict:
    out = {}
    for name, config in MODELS:
        shapes = fits.meta_shapes(random_config("random:" + name))
        for lora in (0, 16):
            cfg = load_config([config, "configs/vllm_colocated_80gb.yaml"], [f"policy.lora_rank={lora}"])
            s = fits.replace(fits.settings_of(cfg, "grpo", shapes.unit), cpu=False)
            plan = fits.plan(shapes, s)
            per_token = 2 * shapes.layers * shapes.kv_dim * fits.DTYPE_BYTES[s.dtype]
            step_rows = cfg.grpo.prompts_per_step * cfg.grpo.group_size
            out[f"{name}, lora_rank={lora}"] = {
                "parameters": shapes.numel,
                "total_gib": round(plan.total / fits.GIB, 2),
                "items_gib": {k: round(v / fits.GIB, 2) for k, v in plan.items.items()},
                "update_rows_per_pass": s.rows,
                "prompt_tokens": s.prompt_tokens,
                "completion_tokens": s.completion_tokens,
                "kv_bytes_per_token": per_token,
                "kv_gib_whole_step": round(
                    step_rows * (s.prompt_tokens + s.completion_tokens) * per_token / fits.GIB, 2
                ),
                "sync_bytes": shapes.numel * fits.DTYPE_BYTES[s.dtype],
            }
    return stamped({"what": "fits.plan per term, one 80 GB GPU, colocated vLLM engine", "plans": out})


if __name__ == "__main__":
    print(json.dumps(main(), indent=1))
