"""`embodied bench step`: one SFT step and one GRPO step of a policy at its real size, measured.

The steps are the training loops' own (`train_sft`, `train_grpo`: encoding, rollout with `generate`,
scoring, update), with the config's `sft` and `grpo` settings on arrow-of-time clips of `data.width` x
`data.height` and `data.clip` frames, made in-process (`bench.step_clips`). Each phase loads a fresh policy
(`policy.*`, `random:qwen2.5-vl-3b` by default), runs `bench.warmup` untimed steps, then `bench.steps`
timed ones in a second call of the loop, with the per-phase peak memory reset in between. What ran is
observed, not predicted: the batches the loops encode and the rollouts they sample are read as they pass
(`Taps`), and the loops' own `time/step` gives the seconds; `embodied.bench.timers` splits a GRPO step into
rollout, generation and update. Model FLOPs and the peak are `embodied.bench.flops`'s (docs/scaling.md).

With TRL installed (`pip install 'embodied[bench]'`) the GRPO workload also runs through TRL's GRPOTrainer
(frames as images, since TRL takes no video) beside ours on the same images, and the JSON gives the ratio
of one run; without it, `trl` says "trl not installed".
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import importlib
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from embodied.bench.flops import device_peak, model_shape, rollout_forward, sft_step, update_forwards
from embodied.bench.grpo_vs_trl import as_images, seconds_summary, simulate_examples, trl_block, trl_dataset
from embodied.bench.timers import Timers, install
from embodied.data.load import Example
from embodied.environment import stamped
from embodied.policy.fits import check_command
from embodied.policy.model import load
from embodied.policy.random_weights import is_random
from embodied.questions import LETTERS, arrow_of_time
from embodied.train.grpo import train_grpo
from embodied.train.metrics import read_metrics
from embodied.train.sft import train_sft
from embodied.train.state import Run
from embodied.video import Clip

GIB = 2**30


class Taps:
    """Keeps what chosen functions are called with and return while installed (`calls[name]`: one
    `keep(args, result)` per call), so a loop's batches are counted as they run."""

    def __init__(self) -> None:
        self.calls: dict[str, list] = defaultdict(list)
        self._undo: list = []

    def wrap(self, module: str, path: str, name: str, keep) -> None:
        """Tap `module`'s `path` (a function, or `Class.method`)."""
        owner = importlib.import_module(module)
        *outer, attr = path.split(".")
        for part in outer:
            owner = getattr(owner, part)
        original = getattr(owner, attr)

        @functools.wraps(original)
        def tapped(*args, **kwargs):
            result = original(*args, **kwargs)
            self.calls[name].append(keep(args, result))
            return result

        setattr(owner, attr, tapped)
        self._undo.append((owner, attr, original))

    def restore(self) -> None:
        for owner, attr, original in reversed(self._undo):
            setattr(owner, attr, original)
        self._undo.clear()


def visual_items(batch) -> list[list[int]]:
    """The `(t, h, w)` patch grid of every clip and image in a processor batch."""
    return [
        row for key in ("video_grid_thw", "image_grid_thw") if key in batch for row in batch[key].tolist()
    ]


def _rollout_counts(ro) -> dict:
    """Prompt lengths (one per prompt, padding out), completion lengths per group, visual grids."""
    unique, G = ro.batch.unique, ro.group_size
    return {
        "prompt": unique["attention_mask"].sum(1).tolist(),
        "completion": ro.mask.sum(1).view(-1, G).tolist(),
        "items": visual_items(unique),
    }


SFT_TAPS = [
    (
        "embodied.train.sft",
        "encode_examples",
        "prompts",
        lambda a, r: (r["attention_mask"].sum(1), visual_items(r)),
    ),
    ("embodied.train.sft", "encode_completions", "targets", lambda a, r: r[1].sum(1).tolist()),
]
GRPO_TAPS = [
    ("embodied.train.grpo", "sample_groups", "sampled", lambda a, r: _rollout_counts(r)),
    ("embodied.train.grpo", "GRPO.learn", "learned", lambda a, r: _rollout_counts(a[1])),
    (
        "embodied.rl.advantages",
        "compute_advantages",
        "advantages",
        lambda a, r: r.detach().flatten().tolist(),
    ),
]
GRPO_TIMERS = [
    ("embodied.policy.sampling", "HFEngine.sample", "generate"),
    ("embodied.train.grpo", "sample_groups", "rollout"),
    ("embodied.train.grpo", "GRPO.learn", "update"),
]


@contextlib.contextmanager
def observing(taps: list, timer_targets: list):
    """`(Taps, Timers)` installed on `taps` and `timer_targets` for the duration."""
    tapped, timers = Taps(), Timers()
    try:
        for module, attr, name, keep in taps:
            tapped.wrap(module, attr, name, keep)
        install(timers, timer_targets)
        yield tapped, timers
    finally:
        timers.restore()
        tapped.restore()


def make_examples(cfg, n: int) -> list[Example]:
    """`n` arrow-of-time questions on clips of the config's size: simulated (`bench.step_clips=sim`) or
    uniform noise of the same shape (`noise`: for a machine with no offscreen OpenGL; a step's cost depends
    on the shapes, not on the pixels)."""
    d = cfg.data
    if cfg.bench.step_clips == "sim":
        return simulate_examples(n, cfg.seed, d.width, d.height, d.clip)
    if cfg.bench.step_clips != "noise":
        raise ValueError(f"bench.step_clips={cfg.bench.step_clips!r}; choose sim or noise")
    rng = np.random.default_rng(cfg.seed)
    out = []
    for i in range(n):
        frames = rng.integers(0, 256, (d.clip.num_frames, d.height, d.width, 3), dtype=np.uint8)
        record = {
            "id": f"noise-{i}",
            "video": f"noise-{i}.mp4",
            "family": arrow_of_time.NAME,
            "question": arrow_of_time.QUESTION,
            "options": list(arrow_of_time.OPTIONS),
            "answer": LETTERS[i % 2],
        }
        out.append(Example(record, Clip(frames, d.clip.fps)))
    return out


def timing_reward(seed: int):
    """A reward made for timing (`bench.step_reward=timing`): each answer gets a uniform random number in
    [0, 1) from a generator seeded by `seed`, whatever its text, so a group's rewards differ and its update
    has non-zero advantages (a `RewardFn`)."""
    rng = np.random.default_rng(seed)

    def reward_fn(texts: list[str], records: list[dict]) -> list[dict[str, float]]:
        return [{"reward/total": float(x)} for x in rng.random(len(texts))]

    return reward_fn


TIMING_REWARD = "timing: uniform random in [0, 1) per answer, seeded (embodied.bench.step.timing_reward)"


def step_reward(cfg) -> tuple[object | None, str]:
    """`(reward_fn, what it is)` of `bench.step_reward`: None (the loop's MCQ rules) or `timing_reward`."""
    kind = cfg.bench.step_reward
    if kind not in ("auto", "mcq", "timing"):
        raise ValueError(f"bench.step_reward={kind!r}; choose auto, mcq or timing")
    if kind == "auto":
        kind = "timing" if is_random(cfg.policy.path) else "mcq"
    if kind == "timing":
        return timing_reward(cfg.seed), TIMING_REWARD
    return None, "mcq: the MCQ rules (embodied.rl.rewards.mcq_rewards)"


def reset_peak(device: torch.device) -> None:
    """Start a phase's peak memory: the CUDA allocator's peak, or the process's peak RSS (VmHWM, reset
    through /proc/self/clear_refs on Linux)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        return
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def peak_memory(device: torch.device) -> dict:
    """The phase's peak: `torch.cuda.max_memory_allocated` (and reserved) on a GPU, peak RSS on a CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return {
            "what": "torch.cuda.max_memory_allocated",
            "gib": round(torch.cuda.max_memory_allocated(device) / GIB, 3),
            "reserved_gib": round(torch.cuda.max_memory_reserved(device) / GIB, 3),
        }
    with contextlib.suppress(OSError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return {
                    "what": "peak RSS of the process (VmHWM)",
                    "gib": round(int(line.split()[1]) / 2**20, 3),
                }
    import resource

    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"what": "peak RSS of the process since it started (ru_maxrss)", "gib": round(rss_kib / 2**20, 3)}


def _loop_times(run_dir: Path) -> list[float]:
    return [m["time/step"] for m in read_metrics(run_dir / "metrics.jsonl") if "time/step" in m]


def _rates(flops: float, seconds: float, peak: dict, **tokens: int) -> dict:
    """Tokens per second, achieved TFLOP/s and MFU over `seconds` of timed steps."""
    out = {f"{k}_tokens_per_s": round(v / seconds, 2) for k, v in tokens.items()}
    out["model_tflops_per_s"] = round(flops / seconds / 1e12, 6)
    out["mfu"] = round(flops / seconds / peak["flops"], 6) if peak["flops"] else None
    return out


def _fresh_run(run_dir: Path) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    return run_dir


def _warm_up(loop, model, processor, examples: list[Example], base, cfg, out: Path, **run) -> None:
    """`bench.warmup` untimed steps of `loop` (`train_sft` or `train_grpo`, settings `base`) in their own
    run folder: first calls and the allocator's warm-up stay out of the timed steps."""
    if cfg.bench.warmup:
        warm = dataclasses.replace(base, steps=cfg.bench.warmup)
        run_dir = _fresh_run(out / "warmup")
        loop(warm, Run(model, processor, examples, run_dir, cfg.video, seed=cfg.seed, progress=False, **run))


def measure_sft(cfg, examples: list[Example], out: Path, peak: dict) -> dict:
    """Warm-up, then `bench.steps` timed SFT steps of a fresh policy; their seconds, tokens, FLOPs, memory."""
    b = cfg.bench
    base = dataclasses.replace(
        cfg.sft, log_every=1, eval_every=0, checkpoint_every=0, stop_at=0.0, max_seconds=0.0, restart_every=0
    )
    model, processor = load(cfg.policy)
    device = next(model.parameters()).device
    reset_peak(device)
    _warm_up(train_sft, model, processor, examples, base, cfg, out)
    with observing(SFT_TAPS, []) as (taps, _):
        timed = dataclasses.replace(base, steps=b.steps)
        run_dir = _fresh_run(out / "timed")
        train_sft(
            timed, Run(model, processor, examples, run_dir, cfg.video, seed=cfg.seed + 1, progress=False)
        )
    memory, shape = peak_memory(device), model_shape(model)
    del model
    seconds = _loop_times(run_dir)
    prompts = [p.tolist() for p, _ in taps.calls["prompts"]]
    items = [it for _, it in taps.calls["prompts"]]
    targets = taps.calls["targets"]
    if not (len(prompts) == len(targets) == len(seconds) == b.steps):
        raise RuntimeError(
            f"SFT ran {len(seconds)} timed steps and encoded {len(prompts)} batches, not {b.steps}"
        )
    flops = sum(
        sft_step(shape, [p + t for p, t in zip(ps, ts)], it) for ps, ts, it in zip(prompts, targets, items)
    )
    n_prompt, n_target = sum(map(sum, prompts)), sum(map(sum, targets))
    return {
        "batch_size": cfg.sft.batch_size,
        "s_per_step": seconds_summary(seconds),
        "tokens": {"prompt": n_prompt, "completion": n_target, "visual_items": sum(map(len, items))},
        **_rates(flops, sum(seconds), peak, prompt=n_prompt, completion=n_target),
        "model_flops_per_step": flops / b.steps,
        "peak_memory": memory,
    }


def measure_grpo(cfg, examples: list[Example], out: Path, peak: dict) -> dict:
    """Warm-up, then `bench.steps` timed GRPO steps (rollout with `generate`, scoring, update) of a fresh
    policy; their seconds (split into rollout, generation and update), tokens, FLOPs and memory."""
    b, g = cfg.bench, cfg.grpo
    base = dataclasses.replace(g, log_every=1, eval_every=0, checkpoint_every=0)
    model, processor = load(cfg.policy)
    device = next(model.parameters()).device
    reset_peak(device)
    reward_fn, reward = step_reward(cfg)
    _warm_up(train_grpo, model, processor, examples, base, cfg, out, reward_fn=reward_fn)
    with observing(GRPO_TAPS, GRPO_TIMERS) as (taps, timers):
        run_dir = _fresh_run(out / "timed")
        timed = dataclasses.replace(base, steps=b.steps)
        run = Run(model, processor, examples, run_dir, cfg.video, seed=cfg.seed + 1, progress=False)
        run.reward_fn = reward_fn
        train_grpo(timed, run)
    memory, shape = peak_memory(device), model_shape(model)
    del model
    seconds = _loop_times(run_dir)
    sampled, learned = taps.calls["sampled"], taps.calls["learned"]
    gen = sum(rollout_forward(shape, s["prompt"], s["completion"], s["items"]) for s in sampled)
    passes = update_forwards(g.kl_coef > 0, g.updates_per_rollout)
    upd = passes * sum(rollout_forward(shape, r["prompt"], r["completion"], r["items"]) for r in learned)
    n_prompt = sum(sum(s["prompt"]) for s in sampled)
    n_completion = sum(sum(map(sum, s["completion"])) for s in sampled)
    split = {k.split(">")[-1]: round(v, 4) for k, v in timers.seconds.items()}
    return {
        "prompts_x_group": [g.prompts_per_step, g.group_size],
        "max_new_tokens": g.max_new_tokens,
        "s_per_step": seconds_summary(seconds),
        "seconds_in": split,
        "tokens": {"prompt": n_prompt, "completion": n_completion, "rollouts": len(sampled)},
        "generated_tokens_per_s": round(n_completion / split["generate"], 2),
        "reward": reward,
        "advantages": _advantage_summary(taps.calls["advantages"]),
        **_rates(gen + upd, sum(seconds), peak, prompt=n_prompt, completion=n_completion),
        "model_flops_per_step": (gen + upd) / b.steps,
        "peak_memory": memory,
    }


def _advantage_summary(steps: list[list[float]]) -> dict:
    """What the timed updates learned from: the share of non-zero advantages and their mean magnitude (a
    step whose rewards are all equal has every advantage 0, and its update carries no signal)."""
    flat = [a for step in steps for a in step]
    if not flat:
        return {"n": 0}
    return {
        "n": len(flat),
        "nonzero_fraction": round(sum(a != 0 for a in flat) / len(flat), 4),
        "abs_mean": round(statistics.fmean(abs(a) for a in flat), 4),
    }


def measure_trl(cfg, examples: list[Example], out: Path, peak: dict) -> dict:
    """The GRPO workload through TRL's GRPOTrainer and through ours, both with the frames as images;
    `{"status": "trl not installed"}` without TRL."""
    try:
        import trl
    except ImportError:
        return {"status": "trl not installed", "install": "pip install 'embodied[bench]'"}
    images = as_images(examples)
    ours = measure_grpo(cfg, images, out / "ours_images", peak)
    model, processor = load(cfg.policy)
    device = next(model.parameters()).device
    reset_peak(device)
    n = cfg.bench.warmup + cfg.bench.steps
    reward_fn, reward = step_reward(cfg)  # the same reward as ours (a fresh generator of the same seed)
    rows = trl_block(model, processor, trl_dataset(examples), cfg.grpo, n, out / "trl", cfg.seed, reward_fn)
    memory = peak_memory(device)
    del model
    timed = [r["s"] for r in rows[cfg.bench.warmup :]]
    lens = [r["len"] for r in rows[cfg.bench.warmup :] if "len" in r]
    inner = [r["inner"] for r in rows[cfg.bench.warmup :] if "inner" in r]
    trl_s = seconds_summary(timed)
    return {
        "status": "ran",
        "trl": trl.__version__,
        "trl_images": {
            "s_per_step": trl_s,
            **({"training_step_s": seconds_summary(inner)} if inner else {}),
            "completion_len_mean": round(statistics.fmean(lens), 2) if lens else None,
            "peak_memory": memory,
        },
        "ours_images": ours,
        "reward": reward,
        "ours_over_trl_median": round(ours["s_per_step"]["median"] / trl_s["median"], 3),
    }


def run(cfg, out: Path, progress: bool = True) -> dict:
    """SFT, GRPO and (with TRL) the TRL comparison, each on a fresh policy; the JSON-ready result."""
    import transformers

    check_command(cfg, "bench step")
    if cfg.bench.steps < 1:
        raise ValueError(f"bench.steps={cfg.bench.steps}: bench step needs at least one timed step")
    t0 = time.perf_counter()
    device = torch.device(cfg.policy.device)
    peak = device_peak(device, cfg.bench.step_peak_tflops)
    examples = make_examples(cfg, 2 * max(cfg.sft.batch_size, cfg.grpo.prompts_per_step))
    result: dict = {
        "benchmark": "step",
        "device": {
            "type": device.type,
            "name": peak["name"],
            "peak_flops": peak["flops"],
            "peak": peak["source"],
        },
        "settings": _settings(cfg),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    phases = {"sft": measure_sft, "grpo": measure_grpo, "trl": measure_trl}
    if unknown := set(cfg.bench.step_phases) - set(phases):
        raise ValueError(f"bench.step_phases: unknown {sorted(unknown)}; choose among {list(phases)}")
    for name, fn in phases.items():
        if name not in cfg.bench.step_phases:
            continue
        t = time.perf_counter()
        result[name] = fn(cfg, examples, out / name, peak)
        if progress:
            print(f"bench step: {name} done in {time.perf_counter() - t:.1f} s", flush=True)
        (out / "bench_step_partial.json").write_text(
            json.dumps(stamped(result), indent=2)
        )  # a cut-off run keeps it
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    return result


def _settings(cfg) -> dict:
    p = cfg.policy
    return {
        "policy": p.path,
        "dtype": p.dtype,
        "lora_rank": p.lora_rank,
        "gradient_checkpointing": p.gradient_checkpointing,
        "clips": cfg.bench.step_clips,
        "frames": cfg.data.clip.num_frames,
        "size": [cfg.data.width, cfg.data.height],
        "warmup_steps": cfg.bench.warmup,
        "timed_steps": cfg.bench.steps,
        "threads": torch.get_num_threads(),
        "seed": cfg.seed,
    }
