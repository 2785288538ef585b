"""The `bench:` section, read by `embodied bench NAME` only: its config is the core `Config` plus this
section (`BenchRun`). Kept free of heavy imports (no torch): `embodied show-config bench` and a misspelt
`bench.*` key answer without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from embodied.config import Config


@dataclass
class BenchConfig:
    """Settings of `embodied bench ...`. The GRPO settings compared (G, tokens, KL, lr, temperature,
    prompts per step) are the `grpo` section's; the video settings are the `video` section's."""

    prompts: int = 16
    """grpo-vs-trl: arrow-of-time prompts simulated for the comparison (4 frames at 112 x 112 each)."""
    rounds: int = 3
    """grpo-vs-trl, sft, prefix: interleaved rounds; each runs every contender once, in a rotated order."""
    steps: int = 4
    """grpo-vs-trl, sft: timed steps per contender per round; step: timed steps per phase (SFT, GRPO, TRL)."""
    warmup: int = 1
    """grpo-vs-trl, sft, step: untimed steps at the start of every block (first-call, allocator warm-up);
    prefix: untimed updates of each variant before the first round."""
    sft_micro_batch: int = 8
    """sft: the `sft.micro_batch_size` timed against the whole batch in one pass."""
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
    trl_policies: list[str] = field(default_factory=list)
    """grpo-vs-trl: more policies timed in the same run, their blocks interleaved with `policy.path`'s in
    every round so that the ratios are measured side by side (e.g. `[tiny-base-qwen3-vl]`)."""
    memory_quickstart: bool = True
    """memory: also measure the quickstart's peak (minutes); false prints only the plan (seconds)."""
    memory_architectures: list[str] = field(
        default_factory=lambda: ["qwen2.5-vl-3b", "qwen2.5-vl-7b", "qwen3-vl-4b", "qwen3-vl-8b", "qwen3.5-2b"]
    )
    """memory: real architectures planned on the meta device (names of `random:NAME`, or config.json
    files): parameters, FSDP2 units, per-GPU weights/grads/AdamW under DDP and FSDP2
    (embodied/bench/memory_plan.py). Empty: no plan."""
    memory_gpus: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    """memory: GPU counts of the plan."""
    profile_clips: int = 200
    """docs/results/scripts/profile_quickstart.py: clips also made in the main process (workers=0) to time
    physics, render and encoding, which the quickstart's worker processes hide (0 = none)."""
    against: str = ""
    """quickstart: the commit (any git ref) this checkout's quickstart is compared with (`--against REF`)."""
    quickstart_runs: int = 3
    """quickstart: runs of each side, alternated (REF, this, REF, this, ...); their medians are compared."""
    quickstart_swap: bool = False
    """quickstart: every second pair starts with this checkout (REF, this, this, REF, ...)."""
    quickstart_overrides: list[str] = field(default_factory=list)
    """quickstart: dotted overrides given to both sides' quickstart (e.g. fewer steps for a smoke test)."""
    step_clips: str = "sim"
    """step: the clips of the measured steps: sim (MuJoCo drop clips, needs offscreen OpenGL) or noise
    (random frames of the same shape, for a GPU machine without it: a step's cost depends on shapes only)."""
    step_phases: list[str] = field(default_factory=lambda: ["sft", "grpo", "trl"])
    """step: what to measure: sft, grpo, trl (TRL's GRPOTrainer beside ours on the same images; reported as
    not installed without TRL). scripts/device/ splits them over two calls."""
    step_reward: str = "auto"
    """step: the GRPO reward: mcq (the MCQ rules), timing (uniform random in [0, 1) per answer, seeded: a
    reward made for timing, so that the timed update has non-zero advantages) or auto (timing for a `random:`
    policy, whose random text never earns the MCQ reward, else mcq). The JSON says which ran."""
    step_peak_tflops: float = 0.0
    """step: the device's dense bf16 peak (TFLOP/s) for MFU; 0 = from the GPU's name
    (`embodied.bench.flops.GPU_BF16_TFLOPS`), or on a CPU an estimate from its clock and vector width."""
    prefix_frames: int = 32
    """prefix: frames of the one clip (at `video.fps`: 32 frames are 16 s at 2 fps)."""
    prefix_size: int = 256
    """prefix: the clip's frames are squares of this many pixels (the `video` pixel budgets are raised to hold
    them). Qwen3-VL / Qwen3.5 at 256 px: 8 x 8 merged patches of 32 px, 2 frames per temporal patch, so 32
    frames give 16 x 64 = 1,024 visual tokens (16 frames at 384 px: 8 x 144 = 1,152)."""
    prefix_group: int = 8
    """prefix: completions per prompt (G)."""
    prefix_tokens: int = 64
    """prefix: tokens per completion (C), random decodable ids ending with the end-of-turn token."""
    prefix_variants: list[str] = field(default_factory=lambda: ["shared", "plain"])
    """prefix: the updates timed side by side: shared (a group's prompt computed once) and plain (every row
    its own clip, prompt and completion)."""
    prefix_plain_micro_batch: int = 1
    """prefix: `grpo.micro_batch_size` of the plain update (0: the whole group in one pass). One row a pass
    bounds its activation memory (8 rows of 1,000+ tokens do not fit 24 GiB at 0.8B) at the same FLOPs. The
    shared update always runs the group in one pass."""
    rollout_frames: int = 20
    """rollout: frames of the one clip (at `video.fps`: 20 frames are 10 s at 2 fps)."""
    rollout_size: int = 320
    """rollout: the clip's frames are squares of this many pixels. Qwen3-VL / Qwen3.5 at 320 px: 10 x 10
    merged patches of 32 px, 2 frames per temporal patch, so 20 frames give 10 x 100 = 1,000 visual tokens
    (Qwen2.5-VL: 12 x 12 of 28 px, 1,440)."""
    rollout_group: int = 8
    """rollout: completions sampled per prompt (G)."""
    rollout_tokens: int = 64
    """rollout: the most tokens per completion (C)."""
    rollout_engines: list[str] = field(default_factory=lambda: ["hf", "vllm"])
    """rollout: the engines timed side by side (`rollout.engine` values)."""
    env_episodes: int = 64
    """`embodied bench envs`: answers per task run on the CPU backend (4 answers per episode), for its
    episodes/s and as the reference the batched backends' success labels are compared with."""
    env_backends: list[str] = field(default_factory=lambda: ["mjx", "warp"])
    """`embodied bench envs`: the batched backends timed against CPU MuJoCo (mjx, warp); one whose package is
    missing is reported as not installed."""
    env_batches: list[int] = field(default_factory=list)
    """`embodied bench envs`: batch sizes (worlds simulated at once) to time each batched backend at. Empty:
    1, 16, 256, 4096 where the backend runs on a GPU, 1, 4, 16 on a CPU. MJX pads a batch to a power of two,
    so another size is timed with its padding."""


@dataclass
class BenchRun(Config):
    """The config of `embodied bench NAME`: the core sections and `bench`."""

    bench: BenchConfig = field(default_factory=BenchConfig)
