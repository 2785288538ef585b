"""Expert iteration: sample many answers, keep the verified best, fine-tune on them, and again.

Rejection-sampling fine-tuning in rounds, as STaR (Zelikman et al. 2022) and ReST-EM (Singh et al. 2023)
do with a checker of final answers; here the checker is the reward function, so for interactive episodes
MuJoCo executes every sampled answer and the physical outcome decides which one is kept. One round:

1. draw `prompts_per_round` training prompts and sample `samples` answers to each (`rl.rollout.sample_groups`,
   the same sampling and scoring as a GRPO step, each answer seeded by (run seed, round, prompt));
2. per prompt keep at most one answer (`select`): the highest-reward one that succeeded (`keep=success`) or
   the highest-reward one whenever the answers differ (`keep=best`); truncated answers are never kept;
3. fine-tune the current policy for `sft_steps` steps on the kept (prompt, answer) pairs (`train.sft`, a fresh
   optimizer per round; the answer text is the target).

A round depends only on the policy it starts from and on (run seed, round): its prompts, samples and
fine-tuning are seeded by them, and nothing else carries over. So the checkpoint written after each round
(`out_dir/checkpoints/expert/step-<round>`: weights, counters and the `expert:` settings) is all a resumed run
needs, and a run resumed with more `expert.rounds` continues the shorter run as if it had been asked for more
from the start.

Unlike GRPO, nothing is learned from the answers that lost, and no reference policy or KL term is involved.
The answers scored in all are `rounds * prompts_per_round * samples`, which is how it is compared with GRPO at
equal simulator calls (docs/environments.md, "Expert iteration").
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from embodied.data.load import Example
from embodied.rl.rewards import RewardFn, mcq_rewards, rewards_for
from embodied.rl.rollout import Rollout, sample_groups, sampling_seed
from embodied.train.checkpoint import load_checkpoint, resolve_resume, save_checkpoint, set_aside
from embodied.train.metrics import MetricsLog
from embodied.train.sft import train_sft
from embodied.video import VideoConfig

KEEP = ("success", "best")


def succeeded(terms: dict[str, float]) -> bool:
    """Whether an answer's reward terms say it succeeded: `reward/success` (interactive tasks), else
    `reward/accuracy` (MCQs)."""
    value = terms.get("reward/success", terms.get("reward/accuracy"))
    if value is None:
        raise KeyError(
            f"expert.keep=success needs reward/success or reward/accuracy; terms are {sorted(terms)}"
        )
    return value >= 0.5


def _has_success(terms: dict[str, float]) -> bool:
    return "reward/success" in terms or "reward/accuracy" in terms


def select(ro: Rollout, keep: str) -> list[int | None]:
    """Per prompt of `ro`, the row of the answer to keep, or None: the highest `reward/total` among its
    untruncated answers that succeeded (`keep="success"`), or among all its untruncated answers when their
    rewards are not all equal (`keep="best"`: an answer above its group's mean). Ties go to the first row."""
    if keep not in KEEP:
        raise ValueError(f"expert.keep={keep!r}; choose one of {list(KEEP)}")
    G = ro.group_size
    chosen: list[int | None] = []
    for p in range(len(ro.examples)):
        rows = [p * G + g for g in range(G) if not bool(ro.truncated[p * G + g])]
        if keep == "success":
            rows = [r for r in rows if succeeded(ro.terms[r])]
        elif len({float(ro.rewards[p, r - p * G]) for r in range(p * G, p * G + G)}) < 2:
            rows = []
        chosen.append(max(rows, key=lambda r: (float(ro.rewards[p, r - p * G]), -r)) if rows else None)
    return chosen


def round_prompts(n: int, per_round: int, seed: int, round_: int) -> list[int]:
    """Indices of the training prompts of round `round_`: `per_round` of `n` without replacement (all `n`
    when `per_round` is 0 or at least `n`), the same for a given (seed, round)."""
    rng = np.random.default_rng([seed, round_, 113])
    if per_round <= 0 or per_round >= n:
        return rng.permutation(n).tolist()
    return rng.choice(n, size=per_round, replace=False).tolist()


def train_expert(
    model,
    processor,
    train: Sequence[Example],
    cfg,
    sft_cfg,
    video: VideoConfig,
    out_dir: str | Path,
    seed: int = 0,
    progress: bool = True,
    reward_fn: RewardFn | None = None,
    max_new_tokens: int = 16,
    timeout_s: float | None = 60.0,
    resume: str = "",
    config_yaml: str = "",
) -> dict:
    """Run `cfg.rounds` rounds of expert iteration (`cfg` is an `ExpertConfig`; `sft_cfg` an `SFTConfig`
    whose warmup, clip, weight decay and vision scale the fine-tuning uses) on `train`, scoring answers with
    `reward_fn` (default: the MCQ rules). Per round, `out_dir/metrics.jsonl` gets the kept share, the
    sampled answers' reward and success, the answers scored so far and the seconds spent sampling and
    fine-tuning; each round's fine-tuning logs under `out_dir/rounds/<r>/`. After each round a checkpoint
    goes to `out_dir/checkpoints/expert` (the newest `sft_cfg.keep_checkpoints`); `resume` ("", "auto" or a
    checkpoint folder) continues from one, with the same `expert:` settings but any number of rounds."""
    if cfg.rounds < 1 or cfg.samples < 1 or cfg.sft_steps < 1 or cfg.sample_batch < 1:
        raise ValueError(
            "expert.rounds, expert.samples, expert.sft_steps and expert.sample_batch must be >= 1"
        )
    if cfg.keep not in KEEP:
        raise ValueError(f"expert.keep={cfg.keep!r}; choose one of {list(KEEP)}")
    if not train:
        raise ValueError("expert iteration: no training prompts")
    out_dir = Path(out_dir)
    reward_fn = reward_fn or mcq_rewards()
    log = MetricsLog(out_dir / "metrics.jsonl", "expert")
    tune = dataclasses.replace(
        sft_cfg,
        steps=cfg.sft_steps,
        batch_size=cfg.batch_size,
        lr=cfg.lr,
        restart_every=0,
        eval_every=0,
        stop_at=0.0,
        max_seconds=0.0,
        checkpoint_every=0,
        log_every=max(1, cfg.sft_steps // 5),
    )
    # what a round's outcome depends on, besides the policy (sample_batch only groups the sampling)
    settings = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("rounds", "sample_batch")}
    settings["seed"] = seed
    ckpt_dir, first, scored, kept_total, before = out_dir / "checkpoints" / "expert", 1, 0, 0, 0.0
    if path := resolve_resume(resume, ckpt_dir):
        saved = load_checkpoint(path, model)
        if saved["expert"] != settings:
            changed = sorted(k for k in settings if saved["expert"].get(k) != settings[k])
            raise ValueError(
                f"checkpoint {path} was written with other expert settings ({', '.join(changed)}): resume "
                "with the same expert.* (only expert.rounds may change), or start fresh without resume"
            )
        scored, kept_total, before = saved["scored"], saved["kept"], saved["elapsed"]
        first = saved["step"] + 1
        log.truncate(saved["step"])
        print(f"resuming expert iteration from {path} (round {saved['step']})")
    else:
        set_aside(ckpt_dir)
    t_start = time.perf_counter() - before
    bar = tqdm(range(first, cfg.rounds + 1), desc="expert", unit="round", disable=not progress)
    for r in bar:
        t0 = time.perf_counter()
        idx = round_prompts(len(train), cfg.prompts_per_round, seed, r)
        kept: list[Example] = []
        targets: dict[str, str] = {}
        rewards, successes = [], []
        for start in range(0, len(idx), cfg.sample_batch):
            chunk = idx[start : start + cfg.sample_batch]
            ro = sample_groups(
                model,
                processor,
                [train[i] for i in chunk],
                video,
                reward_fn,
                cfg.samples,
                max_new_tokens,
                temperature=cfg.temperature,
                seeds=[sampling_seed(seed, r, i) for i in chunk],
                timeout_s=timeout_s,
            )
            scored += len(ro.texts)
            rewards += ro.rewards.flatten().tolist()
            successes += [float(succeeded(t)) for t in ro.terms if _has_success(t)]
            for p, row in enumerate(select(ro, cfg.keep)):
                if row is not None:
                    ex = ro.examples[p]
                    kept.append(ex)
                    targets[ex.record["id"]] = ro.texts[row]
        t_sample = time.perf_counter() - t0
        t1 = time.perf_counter()
        if kept:  # nothing verified this round: the policy is left as it is
            train_sft(
                model,
                processor,
                kept,
                tune,
                video,
                out_dir / "rounds" / str(r),
                seed=seed * 1000 + r,
                progress=False,
                target_fn=lambda rec, kept_text=targets: kept_text[rec["id"]],
            )
        model.eval()
        kept_total += len(kept)
        metrics = {
            "expert/kept": len(kept) / len(idx),
            "expert/answers_scored": scored,
            "reward/total": float(np.mean(rewards)),
            "time/sample": t_sample,
            "time/sft": time.perf_counter() - t1,
            "time/elapsed": time.perf_counter() - t_start,
        }
        if successes:
            metrics["reward/success"] = float(np.mean(successes))
        log.log(r, metrics)
        counters = {
            "scored": scored,
            "kept": kept_total,
            "elapsed": metrics["time/elapsed"],
            "expert": settings,
        }
        # no optimizer state: each round's fine-tuning starts a fresh one
        save_checkpoint(
            ckpt_dir, r, model, None, None, counters, config_yaml, sft_cfg.keep_checkpoints, optim_state={}
        )
        bar.set_postfix(kept=f"{metrics['expert/kept']:.2f}", r=f"{metrics['reward/total']:.2f}")
    return {
        "rounds": cfg.rounds,
        "answers_scored": scored,
        "kept": kept_total,
        "wall_s": time.perf_counter() - t_start,
    }


def train_expert_config(
    model,
    processor,
    train: Sequence[Example],
    cfg,
    out_dir: str | Path,
    progress: bool = True,
    resume: str = "",
    config_yaml: str = "",
) -> dict:
    """`train_expert` as a whole config (`embodied.config.Config`) asks: its `expert:` rounds, `sft:`
    optimizer settings, `video:`, seed, the routed reward (`rl.rewards.rewards_for`: physics for episodes,
    rules for questions) and GRPO's token budget and reward timeout. `embodied expert` and the
    env-feedback arm both run it."""
    return train_expert(
        model,
        processor,
        train,
        cfg.expert,
        cfg.sft,
        cfg.video,
        out_dir,
        cfg.seed,
        progress,
        rewards_for(cfg),
        cfg.grpo.max_new_tokens,
        cfg.grpo.reward_timeout_s,
        resume,
        config_yaml,
    )


def answers_scored(cfg, n_train: int) -> int:
    """How many answers `cfg` (an `ExpertConfig`) samples and scores over a run on `n_train` prompts."""
    per_round = n_train if cfg.prompts_per_round <= 0 else min(cfg.prompts_per_round, n_train)
    return cfg.rounds * per_round * cfg.samples
