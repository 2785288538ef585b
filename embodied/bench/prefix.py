"""`embodied bench prefix`: GRPO's update with each group's shared video prompt computed once, against the
plain per-sample update, side by side in one process.

A group is G completions of one prompt. The shared-prefix update (`embodied.policy.groups`) runs the vision
tower and the language model over the prompt once, with gradients, repeats its KV cache G times and runs
only the completions against it; the plain update runs every row whole (the clip, the prompt and the
completion: G vision passes and G prompt passes, as a trainer without groups does). Per forward pass the
language model's tokens are `P + G C` against `G (P + C)`, so the update should take about

    (P + G C) / (G (P + C))            (~0.2 at P = 1,000, G = 8, C = 96; 0.17 at P = 1,100, C = 64)

of the plain one's time. This bench measures it with the training code itself: one prompt of a
`bench.prefix_frames`-frame clip at `video.fps` (uniform noise of `bench.prefix_size` px squares: an update's
cost depends on shapes, not pixels), G = `bench.prefix_group` completions of `bench.prefix_tokens` random
decodable tokens each (the last is the end-of-turn token), and a reward made for timing (uniform random,
seeded: random text never earns the MCQ reward, and equal rewards would give every advantage 0). Each
variant's update is `GRPO.learn` (`embodied.train.grpo`: advantages, the micro-batch loss with the reference
pass when `grpo.kl_coef > 0`, backward, clipping and AdamW) through a `GRPO` step built as `train_grpo`
builds it, with the `policy` section's precision, LoRA and checkpointing. `bench.warmup` untimed updates of
each variant come first, then `bench.rounds` rounds that run every variant once, the order alternated, so
the ratio is measured under the same load. Wall-clock timers (`embodied.bench.timers`) split each update
into vision, language-model forward, backward and optimizer, and count the shared-prefix passes that ran.
The sampler's kept prompt pass (`GRPO.step`'s `PromptPass`) is not used: `learn` is given none, so the update
recomputes the prompt and its cost is all inside the timed update.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from embodied.bench.flops import cpu_name, group_forward, model_shape, vision_forward
from embodied.bench.grpo_vs_trl import seconds_summary
from embodied.bench.step import TIMING_REWARD, peak_memory, reset_peak, timing_reward, visual_items
from embodied.bench.timers import Timers, install
from embodied.data.load import Example
from embodied.environment import stamped
from embodied.policy.model import encode_prompts, end_of_turn, load, repeat_batch
from embodied.questions import LETTERS, arrow_of_time
from embodied.rl.rollout import Rollout
from embodied.video import Clip

if TYPE_CHECKING:
    from embodied.train.grpo import GRPO

VARIANTS = ("shared", "plain")
"""shared: the grouped batch (`GroupedBatch`: prompt once per group); plain: the same rows as a plain batch
(every row its own clip, prompt and completion)."""

TIMED = [
    ("embodied.train.grpo", "GRPO.update", "update"),
    ("embodied.train.grpo", "completion_outputs", "logprobs"),  # the policy's pass (and PAPO's masked one)
    ("embodied.train.grpo", "completion_logprobs", "logprobs"),  # the reference's
    ("embodied.policy.model", "shared_prefix_logits", "shared_prefix"),
    ("embodied.policy.model", "_full_forward", "full_forward"),
    ("torch.autograd", "backward", "backward"),
    ("embodied.train.grpo", "apply_gradients", "optimizer"),
]
"""What the per-part seconds are: the update's calls, plus each family's vision tower and text model."""
MODEL_PARTS = {
    "qwen2_5_vl": ("Qwen2_5_VisionTransformerPretrainedModel", "Qwen2_5_VLTextModel"),
    "qwen3_vl": ("Qwen3VLVisionModel", "Qwen3VLTextModel"),
    "qwen3_5": ("Qwen3_5VisionModel", "Qwen3_5TextModel"),
}


def token_ratio(prompt: int, group: int, completion: int) -> float:
    """The language model's tokens per pass with the prompt shared over over those without:
    `(P + G C) / (G (P + C))`."""
    return (prompt + group * completion) / (group * (prompt + completion))


def flop_ratio(shape, prompt: int, group: int, completion: int, items) -> float:
    """The same ratio in model FLOPs (`embodied.bench.flops`: attention pairs and the vision tower over the
    clip's patch grids `items` included): one forward over the group against G forwards of one row each."""
    shared = group_forward(shape, prompt, [completion] * group) + vision_forward(shape, items)
    plain = group * (group_forward(shape, prompt, [completion]) + vision_forward(shape, items))
    return shared / plain


def clip_example(frames: int, size: int, fps: float, seed: int) -> Example:
    """One arrow-of-time question on a clip of `frames` noise frames of `size` px squares at `fps`."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (frames, size, size, 3), dtype=np.uint8)
    record = {
        "id": "prefix-0",
        "video": "prefix-0.mp4",
        "family": arrow_of_time.NAME,
        "question": arrow_of_time.QUESTION,
        "options": list(arrow_of_time.OPTIONS),
        "answer": LETTERS[0],
    }
    return Example(record, Clip(pixels, fps))


def clip_video(v, frames: int, size: int):
    """The video settings `v` with their pixel budgets raised to hold a clip of `frames` squares of `size` px
    at its own size (never lowered), so the frames are encoded at `size` px."""
    area = size * size
    clip = max(v.video_max_pixels, frames * area)
    return dataclasses.replace(v, max_pixels=max(v.max_pixels, area), video_max_pixels=clip)


def prefix_video(cfg):
    """The video settings of this bench's clip: `clip_video` at `bench.prefix_frames` and `prefix_size`."""
    return clip_video(cfg.video, cfg.bench.prefix_frames, cfg.bench.prefix_size)


def random_completions(processor, rows: int, length: int, seed: int) -> torch.Tensor:
    """`(rows, length)` token ids drawn uniformly from the tokenizer's ordinary vocabulary (decodable, no
    special token), each row ending with the end-of-turn token."""
    tok = processor.tokenizer
    special = set(tok.all_special_ids)
    pool = torch.tensor([i for i in range(tok.vocab_size) if i not in special])
    gen = torch.Generator().manual_seed(seed)
    ids = pool[torch.randint(len(pool), (rows, length), generator=gen)]
    ids[:, -1] = tok.convert_tokens_to_ids(end_of_turn(processor))
    return ids


def rollouts(cfg, processor, example: Example, device) -> tuple[dict, dict]:
    """The two variants' rollouts of one group (same prompt, completions and rewards) and their counts."""
    b = cfg.bench
    G, C = b.prefix_group, b.prefix_tokens
    prompts = encode_prompts(processor, [example.record], [example.clip], prefix_video(cfg), device)
    grouped = repeat_batch(prompts, G)
    ids = random_completions(processor, G, C, cfg.seed).to(device)
    texts = processor.tokenizer.batch_decode(ids, skip_special_tokens=True)
    terms = timing_reward(cfg.seed)(texts, [example.record] * G)
    rewards = torch.tensor([t["reward/total"] for t in terms], device=device).view(1, G)
    common = dict(
        examples=[example],
        ids=ids,
        mask=torch.ones_like(ids),
        temperature=torch.full((G,), cfg.grpo.temperature, device=device),
        texts=texts,
        terms=terms,
        rewards=rewards,
        truncated=torch.zeros(G, dtype=torch.bool, device=device),
    )
    plain = dict(grouped)  # a plain dict: every row runs its own full forward, clip included
    counts = {
        "P_prompt_tokens": int(prompts["attention_mask"].sum()),
        "visual_tokens": int((prompts["mm_token_type_ids"] == 2).sum()),
        "G_group": G,
        "C_completion_tokens": C,
        "video_grid_thw": visual_items(prompts),
    }
    return {"shared": Rollout(batch=grouped, **common), "plain": Rollout(batch=plain, **common)}, counts


def trainer(cfg, model, processor, example: Example, out: Path):
    """A GRPO step (`embodied.train.grpo.GRPO`) built as `train_grpo` builds it (reference, optimizer, log),
    for one prompt a step."""
    from embodied.train.distributed import Processes
    from embodied.train.grpo import GRPO
    from embodied.train.metrics import MetricsLog
    from embodied.train.state import Run

    b = cfg.bench
    grpo = dataclasses.replace(
        cfg.grpo,
        prompts_per_step=1,
        group_size=b.prefix_group,
        max_new_tokens=b.prefix_tokens,
        dynamic_sampling=False,
        eval_every=0,
        checkpoint_every=0,
    )
    out.mkdir(parents=True, exist_ok=True)
    run = Run(model, processor, [example], out, prefix_video(cfg), seed=cfg.seed, progress=False)
    return GRPO.build(grpo, run, Processes(), MetricsLog(out / "metrics.jsonl", "grpo"))


@dataclasses.dataclass
class TimedUpdates:
    """The bench's GRPO step (`trainer`) and the timers around its updates (`_timers`)."""

    grpo: GRPO
    timers: Timers

    def update(self, ro: Rollout, step: int, micro_batch: int) -> dict:
        """One `learn` (advantages, loss, backward, AdamW) of rollout `ro` in micro-batches of `micro_batch`
        rows: its seconds, per-part seconds and metrics."""
        t, timers = self.grpo, self.timers
        t.cfg = dataclasses.replace(t.cfg, micro_batch_size=micro_batch)
        timers.seconds.clear()
        timers.calls.clear()
        t0 = time.perf_counter()
        metrics = t.learn(ro, step)
        seconds = time.perf_counter() - t0
        parts = {k: round(v, 3) for k, v in timers.seconds.items()}
        calls = dict(timers.calls)
        return {
            "s": round(seconds, 3),
            "parts_s": parts,
            "shared_prefix_passes": sum(n for k, n in calls.items() if k.endswith("shared_prefix")),
            "loss": round(metrics["loss/total"], 6),
            "grad_norm": round(float(metrics["optim/grad_norm"]), 6),
        }

    def alternate(self, ros: dict, variants: list[str], b, result: dict, out: Path, say) -> list[dict]:
        """`b.warmup` untimed updates of each variant (kept under `result["warmup"]`), then `b.rounds` timed
        rounds, the variants' order reversed every other round; each round's row of updates."""
        rounds, step = [], 0
        micro = {"shared": 0, "plain": b.prefix_plain_micro_batch}
        partial = out / "bench_prefix_partial.json"
        try:
            for r in range(-b.warmup, b.rounds):
                row: dict = {"round": r} if r >= 0 else {"warmup": r + b.warmup}
                for v in variants if r % 2 == 0 else variants[::-1]:
                    step += 1
                    row[v] = self.update(ros[v], step, micro[v])
                    say(f"  {f'round {r}' if r >= 0 else 'warm-up'} {v}: {row[v]['s']:.2f} s", flush=True)
                    if r >= 0:  # a run cut off keeps what it measured
                        partial.write_text(json.dumps(stamped(result | {"rounds": [*rounds, row]}), indent=1))
                (rounds if r >= 0 else result.setdefault("warmup", [])).append(row)
        finally:
            self.timers.restore()
        return rounds


def _timers(model) -> Timers:
    timers = Timers()
    install(timers, TIMED)
    family = model.config.model_type
    if family in MODEL_PARTS:
        vision, text = MODEL_PARTS[family]
        module = f"transformers.models.{family}.modeling_{family}"
        install(timers, [(module, f"{vision}.forward", "vision"), (module, f"{text}.forward", "text")])
    return timers


def check(cfg) -> list[str]:
    """The variants to run, after checking the bench's settings (one line naming what is wrong)."""
    b = cfg.bench
    variants = list(dict.fromkeys(b.prefix_variants))
    if unknown := set(variants) - set(VARIANTS):
        raise ValueError(f"bench.prefix_variants: unknown {sorted(unknown)}; choose among {list(VARIANTS)}")
    if b.prefix_group < 2 or b.prefix_tokens < 2 or b.prefix_frames < 1 or b.prefix_size < 1:
        raise ValueError(
            "bench.prefix_group and bench.prefix_tokens must be >= 2, bench.prefix_frames and "
            f"bench.prefix_size >= 1 (got {b.prefix_group}, {b.prefix_tokens}, {b.prefix_frames}, "
            f"{b.prefix_size})"
        )
    if b.rounds < 1:
        raise ValueError(f"bench.rounds={b.rounds}: bench prefix needs at least one timed round")
    return variants


def check_memory(cfg, variants: list[str]) -> None:
    """Refuse in one line, before the policy loads, an update that cannot fit (`embodied.policy.fits`): the
    plain one is `bench.prefix_plain_micro_batch` (or G) rows of P + C tokens, the shared one a pass of the
    prompt and the G completions (planned as one row of P + G C tokens with G completions' logits)."""
    from embodied.policy.fits import PROMPT_TEXT_TOKENS, check_plan, settings_of, shapes_of

    p, b = cfg.policy, cfg.bench
    shapes = shapes_of(p.path, p.tiny_seed)
    if shapes is None:
        return
    G, C = b.prefix_group, b.prefix_tokens
    side = -(-b.prefix_size // shapes.unit)
    P = PROMPT_TEXT_TOKENS + max(b.prefix_frames // 2, 1) * side * side
    base = settings_of(cfg, "bench step")
    rows = {"plain": b.prefix_plain_micro_batch or G, "shared": 1}
    for v in variants:
        prompt = P + (G - 1) * C if v == "shared" else P  # the shared pass's logits: G C, like G rows of C
        s = dataclasses.replace(base, rows=rows[v], prompt_tokens=prompt, completion_tokens=C)
        check_plan(shapes, s, f"bench prefix ({v} update)", p.path, p.device)


def run(cfg, out: Path, progress: bool = True) -> dict:
    """Warm-up, then `bench.rounds` alternated rounds of the shared-prefix and the plain update; the
    JSON-ready result (partial results in `bench_prefix_partial.json` after every update)."""
    variants = check(cfg)
    check_memory(cfg, variants)
    b = cfg.bench
    t_start = time.perf_counter()
    model, processor = load(cfg.policy)
    device = next(model.parameters()).device
    example = clip_example(b.prefix_frames, b.prefix_size, cfg.video.fps, cfg.seed)
    ros, counts = rollouts(cfg, processor, example, device)
    t = trainer(cfg, model, processor, example, out / "trainer")
    P, G, C = counts["P_prompt_tokens"], b.prefix_group, b.prefix_tokens
    result = _header(cfg, counts, variants)
    result["predicted"] = {
        "token_ratio": round(token_ratio(P, G, C), 4),
        "formula": "(P + G*C) / (G*(P + C))",
        "model_flop_ratio": round(flop_ratio(model_shape(model), P, G, C, counts["video_grid_thw"]), 4),
    }
    result["advantages"] = [round(float(a), 4) for a in _advantages(t.cfg.advantage, ros["shared"])]
    say = print if progress else (lambda *a, **k: None)
    say(
        f"bench prefix: P={P} (visual {counts['visual_tokens']}), G={G}, C={C}; predicted ratio "
        f"{result['predicted']['token_ratio']:.3f}; {b.warmup} warm-up + {b.rounds} rounds of {variants}",
        flush=True,
    )
    reset_peak(device)
    rounds = TimedUpdates(t, _timers(model)).alternate(ros, variants, b, result, out, say)
    result["peak_memory"] = peak_memory(device)
    result["rounds"] = rounds
    result |= _summary(rounds, variants, result["predicted"]["token_ratio"])
    result["wall_s"] = round(time.perf_counter() - t_start, 1)
    return result


def _advantages(advantage: str, ro: Rollout) -> torch.Tensor:
    from embodied.rl.advantages import compute_advantages

    return compute_advantages(ro.rewards, advantage).flatten()


def _summary(rounds: list[dict], variants: list[str], predicted: float) -> dict:
    """Per-variant seconds, each round's ratio and the ratio of the medians, against the target."""
    out: dict = {
        "s_per_update": {v: seconds_summary([row[v]["s"] for row in rounds]) for v in variants},
        "reward": TIMING_REWARD,
    }
    out["parts_median_s"] = {v: _parts(rounds, v) for v in variants}
    if set(VARIANTS) <= set(variants):
        ratios = [round(row["shared"]["s"] / row["plain"]["s"], 4) for row in rounds]
        med = out["s_per_update"]
        measured = round(med["shared"]["median"] / med["plain"]["median"], 4)
        out["ratio"] = {"measured_median": measured, "per_round": ratios, "predicted": predicted}
        out["ratio"]["measured_over_predicted"] = round(measured / predicted, 3)
        out["target"] = "measured_median <= 0.3 and measured_over_predicted <= 1.5"
        out["meets_target"] = measured <= 0.3 and measured / predicted <= 1.5
    return out


def _parts(rounds: list[dict], v: str) -> dict:
    """Median seconds of variant `v`'s update in its vision tower, text model (forward), backward and
    optimizer step, over the rounds (each part summed over its calls in an update)."""
    out = {}
    for part in ("vision", "text", "backward", "optimizer"):
        per_round = [
            sum(s for k, s in row[v]["parts_s"].items() if k.split(">")[-1] == part) for row in rounds
        ]
        out[part] = round(statistics.median(per_round), 3)
    return out


def _header(cfg, counts: dict, variants: list[str]) -> dict:
    import transformers

    p, b = cfg.policy, cfg.bench
    video = prefix_video(cfg)
    return {
        "benchmark": "prefix",
        "commit": _commit(),
        "machine": {
            "cpu": cpu_name(),
            "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "device": p.device,
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "platform": platform.platform(),
        },
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "settings": {
            "policy": p.path,
            "dtype": p.dtype,
            "lora_rank": p.lora_rank,
            "gradient_checkpointing": p.gradient_checkpointing,
            "frames": b.prefix_frames,
            "size": [b.prefix_size, b.prefix_size],
            "fps": video.fps,
            "clip_seconds": b.prefix_frames / video.fps,
            "kl_coef": cfg.grpo.kl_coef,
            "advantage": cfg.grpo.advantage,
            "plain_micro_batch": b.prefix_plain_micro_batch,
            "variants": variants,
            "warmup_updates": b.warmup,
            "rounds": b.rounds,
            "seed": cfg.seed,
        },
        "tokens": counts,
        "trl": _trl_status(),
    }


def _trl_status() -> str:
    """Where TRL's GRPO step is timed: not here (TRL has no update without its rollout; its whole step on the
    same frames as images, beside ours, is `embodied bench step`'s trl phase)."""
    try:
        import trl  # noqa: F401
    except ImportError:
        return "trl not installed (pip install 'embodied[bench]')"
    return "installed: TRL's whole GRPO step beside ours, frames as images, is bench step's trl phase"


def _commit() -> str | None:
    try:
        git = ["git", "rev-parse", "HEAD"]
        done = subprocess.run(git, capture_output=True, text=True, timeout=10, cwd=Path(__file__).parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None
