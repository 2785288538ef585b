"""GRPO step time against TRL's `GRPOTrainer`, side by side in one process.

Three contenders train the same tiny Qwen2.5-VL checkpoint on the same simulated arrow-of-time prompts
with the `grpo` section's settings (G, new tokens, KL coefficient, lr, temperature, prompts per step):

- `trl_images`: TRL's GRPOTrainer, the 4 frames of each clip given as 4 images (TRL takes no video);
- `ours_images`: `embodied.train.grpo.train_grpo` on the same frames given as the same 4 images;
- `ours_video`: `train_grpo` on the frames given as one video (half the visual tokens: 2 frames share
  a temporal patch).

They run in interleaved blocks (every round runs each once, the order rotated), and the first `warmup`
steps of each block are not timed. TRL's time per step is the wall time between consecutive
`on_step_end` callbacks (everything the trainer does for a step); TRL's own `step_time` (the time
inside `training_step` only: generation, scoring, loss, backward, without the optimizer step, data
loading and logging) is reported beside it as the view most favourable to TRL. Ours is the loop's
`time/step` (everything but writing the metrics line).
"""

from __future__ import annotations

import dataclasses
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from embodied.data.load import Example
from embodied.policy.architectures import architecture_of
from embodied.policy.model import encode_prompts, load_policy, resolve_policy_path
from embodied.questions import arrow_of_time, format_question
from embodied.rl.rewards import mcq_reward
from embodied.video import Clip

CONTENDERS = ("trl_images", "ours_images", "ours_video")


def simulate_examples(
    n: int, seed: int, width: int = 112, height: int = 112, spec: arrow_of_time.ClipSpec | None = None
) -> list[Example]:
    """`n` arrow-of-time clips (half reversed) rendered in-process, as video records (`spec`: frames and
    rate of a clip, `data.clip`; default 4 frames at 2 fps)."""
    from embodied.worlds import DropWorld

    spec = spec or arrow_of_time.ClipSpec()
    rng = np.random.default_rng(seed)
    world = DropWorld(width=width, height=height)
    try:
        out = []
        for i, rev in enumerate(arrow_of_time.balanced_directions(n, rng)):
            record, frames = arrow_of_time.make_example(world, seed * 100_003 + i, bool(rev), spec)
            out.append(
                Example({"id": f"bench-{i}", "video": f"bench-{i}.mp4", **record}, Clip(frames, spec.fps))
            )
    finally:
        world.close()
    return out


def as_images(examples: list[Example]) -> list[Example]:
    """The same examples with each clip's frames given as separate images (`images` records)."""
    out = []
    for e in examples:
        record = {k: v for k, v in e.record.items() if k != "video"}
        record["images"] = [f"{e.record['id']}-frame{i}" for i in range(len(e.clip.frames))]
        out.append(Example(record, e.clip))
    return out


def trl_dataset(examples: list[Example]):
    """A `datasets.Dataset` in TRL's multimodal format: conversational `prompt`, `images`, `answer`."""
    from datasets import Dataset
    from PIL import Image

    rows = []
    for e in examples:
        text = format_question(e.record["question"], e.record["options"])
        content = [{"type": "image"} for _ in e.clip.frames] + [{"type": "text", "text": text}]
        rows.append(
            {
                "prompt": [{"role": "user", "content": content}],
                "images": [Image.fromarray(f) for f in e.clip.frames],
                "answer": e.record["answer"],
            }
        )
    return Dataset.from_list(rows)


def seconds_summary(times: list[float]) -> dict:
    """Count, mean, median, min and max of step times in seconds (`{"n": 0}` for none)."""
    if not times:
        return {"n": 0}
    return {
        "n": len(times),
        "mean": round(statistics.fmean(times), 4),
        "median": round(statistics.median(times), 4),
        "min": round(min(times), 4),
        "max": round(max(times), 4),
    }


def trl_block(
    model, processor, dataset, grpo, n_steps: int, out: Path, seed: int, reward_fn=None
) -> list[dict]:
    """Run TRL's GRPOTrainer for `n_steps` steps; returns per-step `{"s": seconds, "len": mean length}`.
    The reward is the MCQ rules with `grpo`'s weights, or `reward_fn` (a `RewardFn`) when given."""
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer

    rows: list[dict] = []

    class StepClock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            now = time.perf_counter()
            rows.append({"s": now - self.t})
            self.t = now

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs and rows:
                rows[-1]["len"] = float(logs["completions/mean_length"])
                if "step_time" in logs:
                    rows[-1]["inner"] = float(logs["step_time"])

    args = TRLConfig(
        output_dir=str(out),
        per_device_train_batch_size=grpo.prompts_per_step * grpo.group_size,
        num_generations=grpo.group_size,
        max_completion_length=grpo.max_new_tokens,
        beta=grpo.kl_coef,
        epsilon=grpo.clip_eps,
        learning_rate=grpo.lr,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=grpo.grad_clip,
        temperature=grpo.temperature,
        top_p=1.0,
        top_k=0,
        loss_type="grpo",  # per-sequence token mean, then mean over sequences: ours by default
        scale_rewards="group",
        gradient_checkpointing=False,  # TRL's default is on; ours is off, so equal work means off
        bf16=False,
        use_cpu=not str(next(model.parameters()).device).startswith("cuda"),
        max_steps=n_steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=seed,
    )

    def reward(completions, answer, **_):
        if reward_fn is not None:
            texts = [c[0]["content"] for c in completions]
            return [t["reward/total"] for t in reward_fn(texts, [{"answer": a} for a in answer])]
        return [
            mcq_reward(c[0]["content"], a, grpo.accuracy_weight, grpo.format_weight)["reward/total"]
            for c, a in zip(completions, answer)
        ]

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=dataset,
        processing_class=processor,
        callbacks=[StepClock()],
    )
    for cb in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(cb)
    trainer.train()
    return rows


def _ours_block(model, processor, examples, grpo, video, n_steps: int, out: Path, seed: int) -> list[dict]:
    """Run `train_grpo` for `n_steps` steps; returns per-step `{"s": seconds, "len": mean length}`."""
    from embodied.train.grpo import train_grpo
    from embodied.train.state import Run

    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.jsonl").unlink(missing_ok=True)
    cfg = dataclasses.replace(grpo, steps=n_steps, log_every=1, eval_every=0)
    train_grpo(cfg, Run(model, processor, examples, out, video, seed=seed, progress=False))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{"s": r["time/step"], "len": r["rollout/len"]} for r in rows if "time/step" in r]


def _prompt_tokens(processor, examples: list[Example], images: list[Example], dataset, video) -> dict:
    """Prompt length (tokens, visual ones included) of the first example as each contender encodes it."""
    from trl.data_utils import prepare_multimodal_messages

    row = dataset[0]
    msgs = prepare_multimodal_messages(row["prompt"], images=row["images"])
    trl = processor.apply_chat_template([msgs], tokenize=True, add_generation_prompt=True, return_dict=True)
    ours = {
        name: int(encode_prompts(processor, [ex[0].record], [ex[0].clip], video)["input_ids"].shape[1])
        for name, ex in (("ours_images", images), ("ours_video", examples))
    }
    return {"trl_images": len(trl["input_ids"][0]), **ours}


def _require_trl() -> str:
    try:
        import trl
    except ImportError as e:
        raise ImportError("`embodied bench grpo-vs-trl` needs TRL: pip install 'embodied[bench]'") from e
    return trl.__version__


WORKLOAD = {"prompts_per_step": 4, "group_size": 8, "max_new_tokens": 32, "kl_coef": 0.04, "lr": 5e-5}
"""The GRPO settings both sides run (docs/benchmarks.md), fixed so that the ratio stays comparable across
runs whatever the training defaults become; the remaining `grpo.*` settings apply to both sides."""


def run(cfg, out: Path, progress: bool = True) -> dict:
    """Time GRPO steps of TRL and of this framework side by side; returns the JSON-ready result. With
    `bench.trl_policies`, those policies' contenders run in the same rounds, interleaved with `policy.path`'s,
    and their reports sit under `side_by_side`."""
    import transformers

    trl_version = _require_trl()
    cfg = dataclasses.replace(cfg, grpo=dataclasses.replace(cfg.grpo, **WORKLOAD))
    b, grpo, video = cfg.bench, cfg.grpo, cfg.video
    policies = list(dict.fromkeys([cfg.policy.path, *b.trl_policies]))
    clips = simulate_examples(b.prompts, cfg.seed)
    models, rows, data = {}, {}, {}
    for p in policies:
        path = resolve_policy_path(p, cfg.policy.tiny_seed)
        models[p] = {c: load_policy(path, cfg.policy.dtype, cfg.policy.device) for c in CONTENDERS}
        rows[p] = {c: [] for c in CONTENDERS}
        # frames at the size this architecture sees them (Qwen3-VL: 96 px): TRL's processor sees the same
        arch = architecture_of(models[p]["ours_video"][1])
        examples = [Example(e.record, arch.seen_clip(e.clip, video)) for e in clips]
        data[p] = {"ours_images": as_images(examples), "ours_video": examples, "trl": trl_dataset(examples)}
    n = b.warmup + b.steps
    blocks = [(p, c) for p in policies for c in CONTENDERS]
    for r in range(b.rounds):
        for p, c in blocks[r % len(blocks) :] + blocks[: r % len(blocks)]:  # the order rotated each round
            model, processor = models[p][c]
            where = out / f"policy{policies.index(p)}" / c / f"round{r}"
            t0 = time.perf_counter()
            if c == "trl_images":
                block = trl_block(model, processor, data[p]["trl"], grpo, n, where, cfg.seed + r)
            else:
                block = _ours_block(model, processor, data[p][c], grpo, video, n, where, cfg.seed + r)
            rows[p][c].append(block[b.warmup :])
            if progress:
                s = [x["s"] for x in block[b.warmup :]]
                print(
                    f"round {r} {p} {c}: {len(block)} steps in {time.perf_counter() - t0:.1f} s, "
                    f"median {statistics.median(s):.3f} s/step (timed)",
                    flush=True,
                )
    reports = {
        p: _report(
            dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, path=p)),
            rows[p],
            trl_version,
            transformers.__version__,
            _prompt_tokens(
                models[p]["ours_images"][1],
                *(data[p][k] for k in ("ours_video", "ours_images", "trl")),
                video,
            ),
        )
        for p in policies
    }
    result = reports[policies[0]]
    if len(policies) > 1:
        result["side_by_side"] = {p: reports[p] for p in policies[1:]}
    return result


def _report(cfg, rows: dict, trl_version: str, tf_version: str, prompt_tokens: dict) -> dict:
    grpo = cfg.grpo
    result: dict = {
        "benchmark": "grpo-vs-trl",
        "machine": {
            "cpu_count": __import__("os").cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "device": cfg.policy.device,
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": tf_version,
            "trl": trl_version,
        },
        "settings": {
            "policy": cfg.policy.path,
            "prompts": cfg.bench.prompts,
            "prompts_per_step": grpo.prompts_per_step,
            "group_size": grpo.group_size,
            "max_new_tokens": grpo.max_new_tokens,
            "kl_coef": grpo.kl_coef,
            "lr": grpo.lr,
            "temperature": grpo.temperature,
            "rounds": cfg.bench.rounds,
            "timed_steps_per_round": cfg.bench.steps,
            "warmup_steps_per_block": cfg.bench.warmup,
            "prompt_tokens": prompt_tokens,
        },
        "contenders": {},
    }
    for c, blocks in rows.items():
        flat = [x for blk in blocks for x in blk]
        lens = [x["len"] for x in flat if "len" in x]
        inner = [x["inner"] for x in flat if "inner" in x]
        result["contenders"][c] = {
            "s_per_step": seconds_summary([x["s"] for x in flat]),
            **({"trl_training_step_s": seconds_summary(inner)} if inner else {}),
            "median_per_round": [round(statistics.median([x["s"] for x in blk]), 4) for blk in blocks if blk],
            "completion_len_mean": round(statistics.fmean(lens), 2) if lens else None,
            "steps_s": [round(x["s"], 4) for x in flat],
        }
    med = {c: result["contenders"][c]["s_per_step"].get("median") for c in rows}
    mean = {c: result["contenders"][c]["s_per_step"].get("mean") for c in rows}
    if med["trl_images"]:
        result["ratio"] = {
            "ours_images_over_trl_median": round(med["ours_images"] / med["trl_images"], 3),
            "ours_images_over_trl_mean": round(mean["ours_images"] / mean["trl_images"], 3),
            "ours_video_over_trl_median": round(med["ours_video"] / med["trl_images"], 3),
        }
        inner = result["contenders"]["trl_images"].get("trl_training_step_s", {}).get("median")
        if inner:
            result["ratio"]["ours_images_over_trl_inner_median"] = round(med["ours_images"] / inner, 3)
        result["target"] = "ours_images_over_trl_median <= 0.5"
        result["meets_target"] = result["ratio"]["ours_images_over_trl_median"] <= 0.5
    return result
