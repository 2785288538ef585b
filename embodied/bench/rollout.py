"""`embodied bench rollout`: one GRPO group sampled by each rollout engine, side by side in one process.

A group is G = `bench.rollout_group` completions of at most C = `bench.rollout_tokens` tokens of one prompt:
an arrow-of-time question on a clip of `bench.rollout_frames` noise frames of `bench.rollout_size` px at
`video.fps` (at least 1,000 visual tokens by default; sampling costs depend on shapes, not pixels). Each
engine samples it through the training path itself, `embodied.rl.rollout.sample_groups` (GRPO's rollout:
encode once, repeat G times, sample at `grpo.temperature`, each row from its own seed), under the `policy`
section's model and precision (`policy.path=random:qwen3.5-0.8b policy.dtype=bfloat16` is real size).

`bench.warmup` untimed groups per engine come first (first-call costs), then `bench.rounds` rounds that
sample one group with every engine, the order alternated, so the ratio is measured under the same load.
Before each vLLM group the policy's weights are synced into it (`time/sync`, as after every optimizer
step), and its sampled tokens are scored by the trainer (`rollout/logprob_diff`, mean and max |engine -
trainer| nats). The engines' start-up (vLLM's compilation and warm-up) is timed apart. The JSON gives each
engine's seconds per group (median over rounds), tokens sampled, `vllm_over_hf` (the issue's target: at most
0.5), the sync seconds, the log-prob gap, torch's thread count in each block (vLLM's CPU backend sets it to
one at start-up, and colocated, the Hugging Face engine then runs on one thread too) and the peak RSS.

Needs vLLM, so it runs in `.venv-vllm` (scripts/setup_vllm.sh): `.venv-vllm/bin/embodied bench rollout`.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

from embodied.bench.prefix import clip_example, clip_video
from embodied.bench.step import peak_memory, reset_peak, timing_reward
from embodied.policy.engines import check_engine
from embodied.policy.model import encode_prompts, load, vision_token_ids
from embodied.rl.rollout import Sampling, rollout_logprobs, sample_groups


def check(cfg) -> list[str]:
    """The engines to time, refused in one line when unknown, repeated, or vLLM is not installed."""
    engines = list(cfg.bench.rollout_engines)
    for name in engines:
        check_engine(name)
    if not engines or len(set(engines)) != len(engines):
        raise ValueError(f"bench.rollout_engines={engines}: name each engine once, e.g. [hf, vllm]")
    if "vllm" in engines:
        try:
            import vllm  # noqa: F401
        except ImportError as err:
            raise ValueError(
                f"bench rollout times the vllm engine, which is not installed here ({err}): "
                "scripts/setup_vllm.sh, then .venv-vllm/bin/embodied bench rollout "
                "(or bench.rollout_engines=[hf])"
            ) from err
    return engines


class Contenders:
    """The engines on one policy and one prompt: `group(name)` samples one group with that engine and
    returns what was measured."""

    def __init__(self, cfg, model, processor, engines: list[str]):
        b = cfg.bench
        self.model, self.processor, self.seed = model, processor, cfg.seed
        self.example = clip_example(b.rollout_frames, b.rollout_size, cfg.video.fps, cfg.seed)
        self.video = clip_video(cfg.video, b.rollout_frames, b.rollout_size)
        self.sampling = Sampling(b.rollout_group, b.rollout_tokens, cfg.grpo.temperature)
        self.engines, self.startup = {"hf": None}, {}
        if "vllm" in engines:
            from embodied.policy.vllm_engine import VLLMEngine

            t0 = time.perf_counter()
            self.engines["vllm"] = VLLMEngine(
                model, processor, cfg.rollout.max_model_len, cfg.rollout.kv_cache_gb
            )
            self.startup["vllm"] = round(time.perf_counter() - t0, 2)
        self.calls = 0

    def group(self, name: str) -> dict:
        engine, out = self.engines[name], {"threads": torch.get_num_threads()}
        if engine is not None:
            out["sync_s"] = round(engine.sync(self.model)["time/sync"], 4)
        self.calls += 1  # a new seed per group: no engine can reuse a cached answer
        reward = timing_reward(self.seed + self.calls)
        t0 = time.perf_counter()
        ro = sample_groups(
            self.model, self.processor, [self.example], self.video, reward, self.sampling,
            [self.seed * 1000 + self.calls], engine=engine,
        )  # fmt: skip
        out["s"] = round(time.perf_counter() - t0, 3)
        out["tokens"] = int(ro.mask.sum())
        out["prompt_tokens"] = int(ro.batch["attention_mask"][0].sum())
        if ro.engine_logprobs is not None:
            trainer = rollout_logprobs(self.model, ro, suppress=vision_token_ids(self.processor))
            gap = (trainer.float() - ro.engine_logprobs).abs()[ro.mask.bool()]
            out["logprob_diff"] = round(float(gap.mean()), 5)
            out["logprob_diff_max"] = round(float(gap.max()), 5)
        return out


def run(cfg, out: Path, progress: bool = True) -> dict:
    """Start-up, warm-up, then `bench.rounds` alternated rounds of one group per engine; the JSON-ready
    result (partial results in `bench_rollout_partial.json` after every group)."""
    engines = check(cfg)
    b, t_start = cfg.bench, time.perf_counter()
    say = print if progress else (lambda *a, **k: None)
    model, processor = load(cfg.policy)
    model.eval()
    device = next(model.parameters()).device
    reset_peak(device)
    contenders = Contenders(cfg, model, processor, engines)
    result = _header(cfg, model, contenders)
    for name in engines:
        for _ in range(b.warmup):
            contenders.group(name)
    say(f"bench rollout: {b.warmup} warm-up + {b.rounds} rounds of {engines}", flush=True)
    rounds = []
    for r in range(b.rounds):
        order = engines[r % len(engines) :] + engines[: r % len(engines)]
        rounds.append({name: contenders.group(name) for name in order})
        say(f"round {r + 1}: " + ", ".join(f"{n} {rounds[-1][n]['s']:.1f} s" for n in engines), flush=True)
        result["rounds"] = rounds
        (out / "bench_rollout_partial.json").write_text(json.dumps(result, indent=2))
    result |= _summary(rounds, engines)
    result["prompt_tokens"] = rounds[0][engines[0]]["prompt_tokens"]
    result["peak_memory"] = peak_memory(device)
    result["wall_s"] = round(time.perf_counter() - t_start, 1)
    return result


def _header(cfg, model, contenders: Contenders) -> dict:
    b, ex = cfg.bench, contenders.example
    batch = encode_prompts(contenders.processor, [ex.record], [ex.clip], contenders.video)
    grid = batch.get("video_grid_thw")
    merge = getattr(contenders.processor.video_processor, "merge_size", 2) ** 2
    return {
        "policy": cfg.policy.path,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "clip": {"frames": b.rollout_frames, "px": b.rollout_size, "fps": cfg.video.fps},
        "visual_tokens": int(grid.prod(-1).sum()) // merge if grid is not None else None,
        "group": b.rollout_group,
        "max_new_tokens": b.rollout_tokens,
        "temperature": cfg.grpo.temperature,
        "startup_s": contenders.startup,
        "warmup": b.warmup,
    }


def _summary(rounds: list[dict], engines: list[str]) -> dict:
    """Per engine: the median seconds per group and tokens per second; vLLM's time over Hugging Face's."""
    out: dict = {"engines": {}}
    for name in engines:
        seconds = [r[name]["s"] for r in rounds]
        tokens = [r[name]["tokens"] for r in rounds]
        row = {
            "s_per_group": round(statistics.median(seconds), 3),
            "tokens_per_group": statistics.median(tokens),
            "tokens_per_s": round(sum(tokens) / sum(seconds), 2),
            "threads": sorted({r[name]["threads"] for r in rounds}),
        }
        for key in ("sync_s", "logprob_diff", "logprob_diff_max"):
            if key in rounds[0][name]:
                values = [r[name][key] for r in rounds]
                row[key] = max(values) if key.endswith("max") else round(statistics.mean(values), 5)
        out["engines"][name] = row
    if {"hf", "vllm"} <= set(engines):
        per_round = [r["vllm"]["s"] / r["hf"]["s"] for r in rounds]
        out["vllm_over_hf"] = round(statistics.median(per_round), 3)
        out["vllm_over_hf_rounds"] = [round(x, 3) for x in per_round]
        out["target"] = {"vllm_over_hf": 0.5, "met": out["vllm_over_hf"] <= 0.5}
    return out
