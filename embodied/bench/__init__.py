"""Benchmarks, one module each, run by `embodied bench NAME`.

Each module defines `run(cfg: Config, out: Path, progress: bool) -> dict`; the dict is printed as JSON and
written to `run_dir/bench_NAME.json`. Ratios are measured side by side in one process, because these
machines are shared and noisy.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class BenchConfig:
    """Settings of `embodied bench ...`. The GRPO settings compared (G, tokens, KL, lr, temperature,
    prompts per step) are the `grpo` section's; the video settings are the `video` section's."""

    prompts: int = 16
    """grpo-vs-trl: arrow-of-time prompts simulated for the comparison (4 frames at 112 x 112 each)."""
    rounds: int = 3
    """grpo-vs-trl: interleaved rounds; each round runs every contender once, in a rotated order."""
    steps: int = 4
    """grpo-vs-trl: timed steps per contender per round."""
    warmup: int = 1
    """grpo-vs-trl: untimed steps at the start of every block (first-call and allocator warm-up)."""
    video_files: list[str] = field(default_factory=lambda: ["tests/assets/videos/*.mp4"])
    """video: glob patterns of real files to read besides the generated ones (missing ones are skipped)."""
    video_repeats: int = 5
    """video: reads per file and reader; the median time counts."""
    memory_overrides: list[str] = field(
        default_factory=lambda: [
            "data.n_train=96",
            "data.n_val=16",
            "data.n_test=64",
            "sft.steps=20",
            "sft.eval_every=0",
            "grpo.steps=4",
        ]
    )
    """memory: dotted overrides of the quickstart run whose peak memory is measured (batch sizes stay the
    defaults, so the per-step peak is the real quickstart's; fewer clips and steps keep it short)."""
    memory_quickstart: bool = True
    """memory: also measure the quickstart's peak (minutes); false prints only the plan (seconds)."""
    memory_architectures: list[str] = field(default_factory=lambda: ["qwen2.5-vl-3b", "qwen2.5-vl-7b"])
    """memory: real architectures planned on the meta device (names of `random:NAME`, or config.json
    files): parameters, FSDP2 units, per-GPU weights/grads/AdamW under DDP and FSDP2
    (embodied/bench/memory_plan.py). Empty: no plan."""
    memory_gpus: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    """memory: GPU counts of the plan."""
