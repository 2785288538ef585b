"""GRPO: sample a group of answers per question, score them by rule, push towards the better ones.

One step: rollout (G samples per prompt) -> rewards -> group-normalised advantages -> clipped policy
loss + k3 KL to the frozen initial policy -> AdamW step -> log. With one update per rollout the ratio
is 1 in value but carries the policy gradient (the sampling log-probs are the detached current ones).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm

from embodied.datasets import Example
from embodied.evaluate import evaluate
from embodied.metrics import MetricsLog
from embodied.policy import completion_logprobs, decode, encode_prompts, generate, repeat_batch
from embodied.rl.advantages import ESTIMATORS, compute_advantages
from embodied.rl.losses import LOSS_AGGREGATIONS, grpo_loss, masked_mean
from embodied.rl.rewards import RewardFn, mcq_rewards, mean_terms, score
from embodied.train.common import NonFiniteGuard, index_batches, optimizer_step
from embodied.video import VideoConfig


def train_grpo(
    model,
    processor,
    train: Sequence[Example],
    cfg,
    video: VideoConfig,
    out_dir: str | Path,
    val: Sequence[Example] = (),
    seed: int = 0,
    progress: bool = True,
    reward_fn: RewardFn | None = None,
) -> dict:
    """Run `cfg.steps` GRPO steps (`cfg` is a `GRPOConfig`); metrics go to `out_dir/metrics.jsonl`.

    `reward_fn(texts, records)` scores a batch of completions (default: the rule-based MCQ reward); see
    `embodied.rl.rewards.RewardFn`. If it raises or times out the run stops with a `RewardError`.
    """
    if cfg.advantage not in ESTIMATORS or cfg.loss_agg not in LOSS_AGGREGATIONS:
        raise ValueError(
            f"grpo.advantage={cfg.advantage!r} (choose {ESTIMATORS}), "
            f"grpo.loss_agg={cfg.loss_agg!r} (choose {LOSS_AGGREGATIONS})"
        )
    device = next(model.parameters()).device
    ref = copy.deepcopy(model).eval().requires_grad_(False) if cfg.kl_coef > 0 else None
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    log = MetricsLog(Path(out_dir) / "metrics.jsonl", "grpo")
    order = index_batches(len(train), cfg.prompts_per_step, seed)
    guard = NonFiniteGuard()
    reward_fn = reward_fn or mcq_rewards(cfg.accuracy_weight, cfg.format_weight)
    G = cfg.group_size
    bar = tqdm(range(1, cfg.steps + 1), desc="grpo", unit="step", disable=not progress)
    t_start = time.perf_counter()
    for step in bar:
        t0 = time.perf_counter()
        chunk = [train[i] for i in next(order)]
        records = [e.record for e in chunk]
        batch = repeat_batch(encode_prompts(processor, records, [e.clip for e in chunk], video, device), G)

        # Rollout: G samples per prompt from the current policy.
        model.eval()
        ids, mask = generate(model, processor, batch, cfg.max_new_tokens, cfg.temperature)
        texts = decode(processor, ids, mask)
        t_rollout = time.perf_counter() - t0

        # Rewards and advantages, normalised within each group of G.
        terms = score(reward_fn, texts, [records[i // G] for i in range(len(texts))], cfg.reward_timeout_s)
        rewards = torch.tensor([t["reward/total"] for t in terms], device=device).view(len(records), G)
        advantages = compute_advantages(rewards, cfg.advantage).flatten()

        # Loss and update.
        model.train()
        logp, entropy = completion_logprobs(model, batch, ids, mask, cfg.temperature, with_entropy=True)
        ref_logp = None
        if ref is not None:
            with torch.no_grad():
                ref_logp = completion_logprobs(ref, batch, ids, mask, cfg.temperature)
        loss, loss_terms = grpo_loss(
            logp,
            logp.detach(),
            advantages,
            mask,
            ref_logp,
            cfg.clip_eps,
            cfg.kl_coef,
            clip_eps_high=cfg.clip_eps_high,
            dual_clip=cfg.dual_clip,
            kl_kind=cfg.kl_estimator,
            agg=cfg.loss_agg,
            agg_norm=cfg.max_new_tokens,
        )
        grad_norm = optimizer_step(model, optimizer, loss, cfg.grad_clip, guard, step)

        if step % cfg.log_every == 0 or step == cfg.steps:
            metrics = {
                **mean_terms(terms),
                **loss_terms,
                "reward/group_spread": (rewards.std(dim=1) > 0).float().mean(),
                "rollout/len": mask.sum(1).float().mean(),
                "entropy/mean": masked_mean(entropy, mask),
                "optim/grad_norm": grad_norm,
                "time/step": time.perf_counter() - t0,
                "time/rollout": t_rollout,
                "train/skipped_steps": guard.total,
            }
            log.log(step, metrics)
            bar.set_postfix(
                reward=f"{metrics['reward/total']:.2f}", fmt=f"{metrics.get('reward/format', 0):.2f}"
            )
        if cfg.eval_every and val and step % cfg.eval_every == 0:
            res = evaluate(model, processor, val[: cfg.eval_examples], video, choice=False, progress=False)
            log.log(step, {"eval/accuracy": res["accuracy"], "eval/unparseable": res["unparseable"]})
    model.eval()
    return {"steps": cfg.steps, "wall_s": time.perf_counter() - t_start, "skipped_steps": guard.total}
