"""SFT step time: the whole batch in one pass against micro-batches of rows of similar prompt length.

`embodied bench sft -c configs/experiment_cosmos.yaml` times real SFT steps (`train_sft`: encoding, forward,
backward, AdamW) on the config's training clips (`data`, generated if missing) and policy, with
`sft.micro_batch_size=0` (one pass, every prompt padded to the batch's longest) and with
`bench.sft_micro_batch` (rows sorted by prompt length, each micro-batch padded to its own longest). On a mix
of short and long prompts (the cosmos mix: arrow-of-time prompts of about 100 tokens beside puzzles of
200-280) the second skips most of the padding. The two contenders alternate in `bench.rounds` rounds of
`bench.steps` timed steps (after `bench.warmup` untimed ones), in one process, because these machines are
shared and noisy; the ratio is of the medians. The prompt tokens each contender runs are counted too.
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path
from typing import Any


def _positions(rows: list, processor, cfg, size: int) -> int:
    """Prompt token positions (padding included) that one SFT step on `rows` runs with micro-batches of
    `size`: the loop's own split (`train.sft.sft_micro_batches`)."""
    from embodied.policy.model import encode_completions, encode_examples
    from embodied.train.sft import sft_micro_batches, sft_targets

    batch = encode_examples(processor, rows, cfg.video)
    ids, mask = encode_completions(processor, sft_targets([e.record for e in rows], cfg.sft, cfg.seed, 1))
    return sum(part[0]["input_ids"].numel() for part in sft_micro_batches(batch, ids, mask, mask, size))


def run(cfg: Any, out: Path, progress: bool = True) -> dict:
    """Time `train_sft` steps with the whole batch and with `bench.sft_micro_batch` (`cfg`: the run's)."""
    import torch

    from embodied.data.build import ensure_dataset
    from embodied.data.load import load_examples
    from embodied.policy.model import load
    from embodied.train.common import index_batches
    from embodied.train.metrics import read_metrics
    from embodied.train.sft import train_sft
    from embodied.train.state import Run

    ensure_dataset(cfg.data, progress)
    n = cfg.sft.batch_size * (cfg.bench.warmup + cfg.bench.steps) * 2
    train, skipped = load_examples(cfg.data.root, "train", cfg.video.fps, cfg.video.max_frames, limit=n)
    model, processor = load(cfg.policy)
    size = cfg.bench.sft_micro_batch
    contenders = {"whole batch": 0, f"micro-batches of {size}": size}
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for r in range(cfg.bench.rounds):
        names = list(contenders)
        for name in names[r % 2 :] + names[: r % 2]:  # alternate which runs first
            sft = dataclasses.replace(
                cfg.sft,
                micro_batch_size=contenders[name],
                steps=cfg.bench.warmup + cfg.bench.steps,
                log_every=1,
                eval_every=0,
                checkpoint_every=0,
                stop_at=0.0,
                max_seconds=0.0,
            )
            run_dir = out / "bench_sft" / f"round{r}_{contenders[name]}"
            run = Run(model, processor, train, run_dir, cfg.video, seed=cfg.seed + r, progress=False)
            train_sft(sft, run)
            rows = [m for m in read_metrics(run_dir / "metrics.jsonl") if "time/step" in m]
            times[name] += [m["time/step"] for m in rows if m["step"] > cfg.bench.warmup]
            if progress:
                print(f"round {r} {name}: median {statistics.median(times[name]):.3f} s/step", flush=True)
    first = [train[i] for i in next(index_batches(len(train), cfg.sft.batch_size, cfg.seed))]
    result = {
        "policy": cfg.policy.path,
        "data": str(cfg.data.root),
        "batch_size": cfg.sft.batch_size,
        "threads": torch.get_num_threads(),
        "skipped_videos": len(skipped),
        "contenders": {
            name: {
                "micro_batch_size": size,
                "median_s_per_step": round(statistics.median(times[name]), 4),
                "steps_timed": len(times[name]),
                "prompt_positions_first_batch": _positions(first, processor, cfg, size),
            }
            for name, size in contenders.items()
        },
    }
    whole, micro = (result["contenders"][name]["median_s_per_step"] for name in contenders)
    result["speedup"] = round(whole / micro, 3)
    return result
