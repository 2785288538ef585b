"""GRPO and its descendants: sample a group of answers per question, score them, push towards the better.

One step, top to bottom: rollout (G samples per prompt, DAPO dynamic sampling if on) -> rewards ->
advantages -> `updates_per_rollout` optimizer steps of the clipped policy loss (+ KL to the frozen initial
policy, entropy controls, PAPO's perception loss), each accumulated over micro-batches -> log -> eval ->
checkpoint. Every recipe is a switch of `GRPOConfig`; presets live in configs/recipes/ (grpo, dapo, drgrpo,
papo, ..., ppo). PPO (`advantage=gae`) swaps the group baseline for a learned critic: a value head on the
policy's last hidden states, trained alongside it (`Critic`, `critic_targets`), saved in every checkpoint.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from embodied.data.load import Example
from embodied.eval.loop import evaluate
from embodied.policy.lora import has_lora
from embodied.policy.model import completion_logprobs, decode, generate, select_rows
from embodied.rl.advantages import ESTIMATORS, compute_advantages
from embodied.rl.episodes import check_env_turns, sample_episodes
from embodied.rl.losses import (
    COV_MODES,
    LOSS_AGGREGATIONS,
    RATIO_LEVELS,
    LossSpec,
    grpo_loss,
    kl_estimate,
    masked_mean,
    perception_loss,
)
from embodied.rl.papo import masked_batch
from embodied.rl.ppo import (
    ValueHead,
    explained_variance,
    first_tokens,
    gae_advantages,
    prompt_explainable_variance,
    sequence_values,
    value_loss,
)
from embodied.rl.rewards import RewardFn, mcq_rewards, mean_terms, overlong_shaping, score
from embodied.rl.rollout import Rollout, Sampling, dynamic_sample, sample_groups, sampling_seed
from embodied.train.checkpoint import resolve_resume, set_aside
from embodied.train.common import (
    apply_gradients,
    index_batches,
    micro_batches,
    param_groups,
    skip_batches,
    with_last,
)
from embodied.train.config import GRPOConfig
from embodied.train.distributed import Processes
from embodied.train.metrics import MetricsLog
from embodied.train.reference import Reference
from embodied.train.state import Run, Trainer
from embodied.video import VideoConfig

CHOICES = {
    "advantage": (*ESTIMATORS, "gae"),
    "loss_agg": LOSS_AGGREGATIONS,
    "ratio_level": RATIO_LEVELS,
    "cov_mode": COV_MODES,
    "overlong": ("off", "hard", "soft"),
    "value_level": ("token", "sequence"),
}


def check_config(cfg, world: int = 1) -> None:
    """Fail before any work on a misspelt recipe switch (naming the key and the choices), a combination
    that cannot run, or one not supported over `world` processes yet."""
    bad = [
        f"grpo.{k}={getattr(cfg, k)!r} (choose {v})" for k, v in CHOICES.items() if getattr(cfg, k) not in v
    ]
    if cfg.updates_per_rollout < 1 or cfg.micro_batch_size < 0 or cfg.max_sampling_rounds < 1:
        bad.append(
            "grpo.updates_per_rollout and grpo.max_sampling_rounds must be >= 1, micro_batch_size >= 0"
        )
    value_lam = cfg.lam if cfg.value_lam is None else cfg.value_lam
    if not (0 <= cfg.gamma <= 1 and 0 <= cfg.lam <= 1 and 0 <= value_lam <= 1):
        bad.append(
            f"grpo.gamma={cfg.gamma}, grpo.lam={cfg.lam} and grpo.value_lam={cfg.value_lam} "
            "must lie in [0, 1]"
        )
    if cfg.value_level == "sequence" and not (cfg.gamma == 1 and cfg.lam == 1):
        bad.append("grpo.value_level=sequence needs grpo.gamma=1 and grpo.lam=1 (A_t = G_t - V(s_0))")
    if min(cfg.value_hidden, cfg.value_warmup_steps, cfg.value_ev_patience) < 0:
        bad.append("grpo.value_hidden, grpo.value_warmup_steps and grpo.value_ev_patience must be >= 0")
    if cfg.kl_in_reward and cfg.advantage != "gae":
        bad.append("grpo.kl_in_reward needs grpo.advantage=gae (per-token rewards go through GAE)")
    if world > 1 and cfg.dynamic_sampling:
        bad.append("grpo.dynamic_sampling with several processes is not supported yet: run it in one")
    if world > 1 and cfg.advantage == "gae":
        bad.append("grpo.advantage=gae (PPO's value head) with several processes is not supported yet")
    if bad:
        raise ValueError("; ".join(bad))


# update() returns each process's share of these; their sum over processes is the global value
UPDATE_SUMS = ("loss/", "clip/", "entropy/")

# the critic's metrics, logged at every step (not only every `log_every`): they say whether it learns
CRITIC_KEYS = ("critic/", "loss/value", "clip/value_fraction")


def inert_clip_settings(cfg) -> list[str]:
    """The clip settings of `cfg` that cannot act because `updates_per_rollout` is 1: the policy that
    sampled is the one updated, so every importance ratio is exactly 1 and a ratio clip never binds; with
    PPO's critic the values are likewise the rollout's own, so the value clip never binds either. Only
    settings a recipe chose are named (a non-default clip, clip-higher, dual clip, GSPO's sequence ratio,
    PPO's value clip), so a plain GRPO run stays quiet. Empty when `updates_per_rollout` > 1."""
    if cfg.updates_per_rollout > 1:
        return []
    default = {f.name: f.default for f in dataclasses.fields(cfg)}["clip_eps"]
    named = [
        f"grpo.clip_eps={cfg.clip_eps}" if cfg.clip_eps != default else "",
        f"grpo.clip_eps_high={cfg.clip_eps_high}" if cfg.clip_eps_high is not None else "",
        f"grpo.dual_clip={cfg.dual_clip}" if cfg.dual_clip is not None else "",
        "grpo.ratio_level=sequence" if cfg.ratio_level == "sequence" else "",
        f"grpo.value_clip={cfg.value_clip}" if cfg.advantage == "gae" and cfg.value_clip > 0 else "",
    ]
    return [n for n in named if n]


def _generator(seed: int, step: int, salt: int) -> torch.Generator:
    """A CPU generator fixed by (seed, step): masks and token picks replay exactly after a resume."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step * 7919 + salt)


def loss_spec(cfg) -> LossSpec:
    """The loss switches of a `GRPOConfig`."""
    return LossSpec(
        clip_eps=cfg.clip_eps,
        clip_eps_high=cfg.clip_eps_high,
        dual_clip=cfg.dual_clip,
        kl_coef=0.0 if cfg.kl_in_reward else cfg.kl_coef,  # in the reward instead (critic_targets)
        kl_kind=cfg.kl_estimator,
        agg=cfg.loss_agg,
        agg_norm=cfg.max_new_tokens,
        ratio_level=cfg.ratio_level,
        entropy_coef=cfg.entropy_coef,
        cov_mode=cfg.cov_mode,
        cov_ratio=cfg.cov_ratio,
        clip_cov_bounds=(cfg.clip_cov_low, cfg.clip_cov_high),
        kl_cov_coef=cfg.kl_cov_coef,
    )


def sampling_args(cfg) -> Sampling:
    """The rollouts' sampling and shaping settings of a `GRPOConfig`."""
    shaping = overlong_shaping(cfg.max_new_tokens, cfg.overlong, cfg.overlong_buffer, cfg.overlong_weight)
    return Sampling(
        cfg.group_size, cfg.max_new_tokens, cfg.temperature, cfg.temperatures, shaping, cfg.reward_timeout_s
    )


@dataclass
class Critic:
    """PPO's critic on one rollout (`grpo.advantage=gae`): the value head and its regression targets."""

    head: ValueHead
    old_values: torch.Tensor
    """`(B, T)` the head's values when the rollout was scored: the centre of the value clip."""
    returns: torch.Tensor
    """`(B, T)` GAE's lambda-returns, the values' targets."""
    value_mask: torch.Tensor
    """`(B, T)` the tokens whose values are trained: every real one, or (`value_level=sequence`) the first."""


def loss_mask(ro: Rollout, cfg) -> torch.Tensor:
    """`(B, T)` the tokens the loss sees: the completions, less truncated ones under `mask_truncated`."""
    return ro.mask * (~ro.truncated).unsqueeze(1) if cfg.mask_truncated else ro.mask


def update(
    t: GRPOTrainer,
    ro: Rollout,
    advantages: torch.Tensor,
    old_logp,
    gen,
    critic: Critic | None = None,
    critic_only: bool = False,
) -> dict:
    """Accumulate the loss's gradient over micro-batches of the rollout (no optimizer step) through `t.net`;
    `t.cfg` is the `GRPOConfig`, whose loss switches go to `grpo_loss` as one `LossSpec`. `advantages` is
    `(B,)` or, with a `critic` (PPO), `(B, T)`; the critic's clipped value loss is then added with weight
    `cfg.vf_coef`. `critic_only` (the critic's warm-up) leaves the policy loss out and stops the value
    loss's gradient at the head's input: only the head gets a gradient.

    Every micro-batch loss is normalised by whole-rollout sizes (summed over processes), so the summed
    gradient equals the whole-batch one. Returns this process's share of the detached metrics, summed the
    same way (clip fractions token-weighted); summing them over processes gives the global values.
    """
    cfg, procs = t.cfg, t.procs
    mask = loss_mask(ro, cfg)
    head = critic.head if critic is not None else None
    if critic_only and head is not None:
        head = _Detached(head)
    rows, tokens = int(procs.sum(torch.tensor(mask.shape[0]))), int(procs.sum(mask.sum()))
    v_count = int(procs.sum(critic.value_mask.sum())) if critic is not None else 0
    step = _Update(t, ro, mask, advantages, old_logp, gen, critic, critic_only, head, rows, tokens, v_count)
    totals: dict[str, float] = {}
    for idx, last in with_last(micro_batches(mask.shape[0], cfg.micro_batch_size)):
        with procs.grad_sync(t.net, last):  # DDP all-reduces once, after the last micro-batch
            loss, terms, entropy = step.loss(idx)
            procs.backward(loss)
        m = mask[idx]
        share = float(m.sum()) / max(tokens, 1)
        for k, v in terms.items():
            totals[k] = totals.get(k, 0.0) + float(v) * (share if k.startswith("clip/") else 1.0)
        totals["loss/total"] = totals.get("loss/total", 0.0) + float(loss.detach())
        totals["entropy/mean"] = (
            totals.get("entropy/mean", 0.0) + float(masked_mean(entropy.detach(), m)) * share
        )
    return totals


@dataclass
class _Update:
    """One `update`: the rollout, its advantages and the whole-rollout sizes every micro-batch's loss is
    normalised by."""

    t: GRPOTrainer
    ro: Rollout
    mask: torch.Tensor
    advantages: torch.Tensor
    old_logp: torch.Tensor | None
    gen: torch.Generator
    critic: Critic | None
    critic_only: bool
    head: torch.nn.Module | None
    rows: int
    tokens: int
    v_count: int

    def loss(self, idx: list[int]) -> tuple[torch.Tensor, dict, torch.Tensor]:
        """The loss of the micro-batch of rows `idx` (policy, value and perception terms), its terms and
        its tokens' entropies."""
        cfg, ro, spec = self.t.cfg, self.ro, loss_spec(self.t.cfg)
        sub, ids, m, temp = select_rows(ro.batch, idx), ro.ids[idx], self.mask[idx], ro.temperature[idx]
        need_entropy_grad = cfg.entropy_coef > 0 or (cfg.papo and cfg.papo_entropy_real > 0)
        logp, entropy, *values = completion_logprobs(
            self.t.net, sub, ids, m, temp, True, need_entropy_grad, self.head
        )
        ref_logp = None
        if self.t.ref is not None and spec.kl_coef > 0:
            with torch.no_grad(), self.t.ref.active() as ref:
                ref_logp = completion_logprobs(ref, sub, ids, m, temp)
        old = logp.detach() if self.old_logp is None else self.old_logp[idx]
        ent = entropy if cfg.entropy_coef > 0 else None
        if self.critic_only:
            loss, terms = torch.zeros((), device=logp.device), {}
        else:
            args = (spec, ent, self.gen, self.rows, self.tokens)
            loss, terms = grpo_loss(logp, old, self.advantages[idx], m, ref_logp, *args)
        if self.critic is not None:
            c, vm = self.critic, self.critic.value_mask[idx]
            v_loss, v_clip = value_loss(
                values[0], c.old_values[idx], c.returns[idx], vm, cfg.value_clip, self.v_count
            )
            loss = loss + cfg.vf_coef * v_loss
            terms |= {"loss/value": v_loss.detach(), "clip/value_fraction": v_clip}
        if cfg.papo and not self.critic_only:
            p_loss, p_terms = self.perception(sub, ids, m, temp, logp, entropy)
            loss = loss + p_loss
            terms |= p_terms
        return loss, terms, entropy

    def perception(self, sub, ids, m, temp, logp, entropy) -> tuple[torch.Tensor, dict]:
        """PAPO's perception loss: the same answers' log-probs with the video masked."""
        cfg = self.t.cfg
        masked = masked_batch(sub, self.t.processor, cfg.papo_mask_prob, cfg.papo_consistent, self.gen)
        with torch.set_grad_enabled(cfg.papo_masked_grad):
            m_logp, m_ent = completion_logprobs(self.t.net, masked, ids, m, temp, True, cfg.papo_masked_grad)
        sizes = {"num_seqs": self.rows, "num_tokens": self.tokens}
        sizes |= {"agg": cfg.loss_agg, "agg_norm": cfg.max_new_tokens}
        weights = (cfg.papo_entropy_real, cfg.papo_entropy_masked)
        return perception_loss(logp, m_logp, m, cfg.papo_gamma, entropy, m_ent, weights, **sizes)


class _Detached(torch.nn.Module):
    """The value head reading detached hidden states: its loss trains the head alone."""

    def __init__(self, head: torch.nn.Module):
        super().__init__()
        self.head = head

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(hidden.detach())


@torch.no_grad()
def rollout_logprobs(model, ro: Rollout, micro_batch_size: int = 0, value_head=None):
    """`(P * G, T)` log-probs of the rollout's tokens under `model`, in micro-batches, without grad; with
    `value_head`, `(log-probs, values)` from the same pass (values float32)."""
    parts = []
    for idx in micro_batches(ro.ids.shape[0], micro_batch_size):
        sub, ids, mask, temp = select_rows(ro.batch, idx), ro.ids[idx], ro.mask[idx], ro.temperature[idx]
        out = completion_logprobs(model, sub, ids, mask, temp, value_head=value_head)
        parts.append(out if value_head is not None else (out,))
    cols = [torch.cat(c) for c in zip(*parts)]
    return cols[0] if value_head is None else (cols[0], cols[1].float())


@torch.no_grad()
def critic_targets(
    model, ref, head: ValueHead, ro: Rollout, cfg
) -> tuple[torch.Tensor, torch.Tensor, Critic, dict]:
    """PPO's advantages for a rollout (`grpo.advantage=gae`): one no-grad pass for the sampling policy's
    log-probs and the head's values, the per-token KL to the reference when it goes in the reward
    (`kl_in_reward`), then GAE. Returns `(whitened advantages (B, T), old log-probs (B, T), the Critic,
    metrics)`."""
    mask = loss_mask(ro, cfg)
    old_logp, old_values = rollout_logprobs(model, ro, cfg.micro_batch_size, head)
    baseline = baseline_values(old_values, mask, cfg)
    kl = None
    if cfg.kl_in_reward and ref is not None:
        with ref.active() as frozen:
            ref_logp = rollout_logprobs(frozen, ro, cfg.micro_batch_size)
        kl = kl_estimate(old_logp, ref_logp, cfg.kl_estimator)
    kl_coef = cfg.kl_coef if kl is not None else 0.0
    rewards = ro.rewards.flatten()
    advantages, returns = gae_advantages(
        rewards,
        baseline,
        mask,
        cfg.gamma,
        cfg.lam,
        kl,
        kl_coef,
        whitened=cfg.whiten,
        value_lam=cfg.value_lam,
        scaled=cfg.whiten_std,
    )
    metrics = {
        "critic/value_mean": float(masked_mean(baseline, mask)),
        "critic/return_mean": float(masked_mean(returns, mask)),
        "critic/explained_variance": float(explained_variance(baseline, returns, mask)),
    }
    if kl is not None:
        metrics["critic/kl_reward"] = float(masked_mean(kl, mask))
    value_mask = first_tokens(mask) if cfg.value_level == "sequence" else mask
    if ro.group_size >= 2:  # what a perfect V(s_0) could explain of these returns
        g0 = (returns * first_tokens(mask)).sum(1).view(ro.rewards.shape)
        metrics["critic/explainable_variance"] = float(prompt_explainable_variance(g0))
    return advantages, old_logp, Critic(head, old_values, returns, value_mask), metrics


def baseline_values(values: torch.Tensor, mask: torch.Tensor, cfg) -> torch.Tensor:
    """`(B, T)` the values the advantages are taken against: the head's per-token values, or with
    `value_level=sequence` each answer's V(s_0) on all its tokens."""
    return sequence_values(values, mask) if cfg.value_level == "sequence" else values


def value_head(model, cfg) -> ValueHead | None:
    """PPO's critic (`grpo.advantage=gae`): a float32 head with a zero-initialised output layer on the
    policy's last hidden states (the backbone is shared unless `value_detach`; a layer of its own with
    `value_hidden` units), on the policy's device; None for the group estimators."""
    if cfg.advantage != "gae":
        return None
    text = getattr(model.config, "text_config", model.config)
    device = next(model.parameters()).device
    return ValueHead(text.hidden_size, device=device, hidden_units=cfg.value_hidden, detach=cfg.value_detach)


def make_optimizer(model, head: ValueHead | None, cfg) -> torch.optim.Optimizer:
    """AdamW over the policy (vision tower at `vision_lr_scale`) and the value head, if any (at
    `value_lr_scale`): one optimizer, so one checkpoint file holds both states."""
    groups = param_groups(model, cfg.lr, cfg.vision_lr_scale)
    if head is not None:
        groups.append({"params": list(head.parameters()), "lr": cfg.lr * cfg.value_lr_scale})
    return torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=0.0)


@torch.no_grad()
def masked_input_accuracy(model, processor, ro: Rollout, cfg, reward_fn, gen) -> dict[str, float]:
    """Greedy answers to this step's prompts with real and with masked visual input, scored by `reward_fn`:
    a policy that truly looks should lose accuracy when it cannot see."""
    G = ro.group_size
    prompts = select_rows(ro.batch, list(range(0, len(ro.examples) * G, G)))
    records = [e.record for e in ro.examples]
    out = {}
    for name, batch in (
        ("real", prompts),
        ("masked", masked_batch(prompts, processor, cfg.papo_mask_prob, cfg.papo_consistent, gen)),
    ):
        ids, mask = generate(model, processor, batch, cfg.max_new_tokens, do_sample=False)
        terms = score(reward_fn, decode(processor, ids, mask), records, cfg.reward_timeout_s)
        key = "reward/accuracy" if "reward/accuracy" in terms[0] else "reward/total"
        out[f"papo/accuracy_{name}"] = sum(t[key] for t in terms) / len(terms)
    return out


def train_grpo(cfg: GRPOConfig, run: Run) -> dict:
    """Run `cfg.steps` GRPO steps: rollout -> advantages -> loss -> step -> log/eval/checkpoint, on
    `run.train` (a `Run`: the policy, the data, `out_dir`, the seed, the reward...). Metrics go to
    `out_dir/metrics.jsonl`, checkpoints to `out_dir/checkpoints/grpo` (`run.resume`: "", "auto" or a
    checkpoint folder). `run.reward_fn(texts, records)` scores a batch (default: the MCQ rules; a failing
    one stops the run with a `RewardError`). Under several processes (`run.procs`) each samples and trains
    on its share of every step's prompts (whole groups, so advantages are exact); only the first logs,
    evaluates and writes checkpoints. `run.turns` (`Turns.of(cfg.env)`) with more than one turn plays
    multi-turn episodes (`embodied.rl.episodes`): a group is G whole trajectories, rewarded by
    `turns.reward`, the outcome also said in words with `turns.words`, turns after the first sampled at
    `turns.retry_temperature` among the tokens `turns.retry_min_p` keeps, a later turn's video chosen by
    `turns.clip`. With `cfg.keep_best` the policy ends on its best held-out point."""
    t = GRPOTrainer.build(cfg, run)
    bar = tqdm(range(t.start, cfg.steps + 1), desc="grpo", unit="step", disable=not run.progress)
    t.t_start = time.perf_counter()
    for step in bar:
        t0 = time.perf_counter()
        ro, sampled = rollout(t.draw, cfg, run.processor, run.video)
        t_rollout, metrics = time.perf_counter() - t0, {}
        if ro is None:  # every group drawn had equal rewards: nothing to learn from this step
            t.empty_steps += 1
        else:
            metrics = learn(t, ro, step)
        if t.head is not None and metrics:
            t.watch.see(step, metrics["critic/explained_variance"])
        t.log_step(step, ro, metrics, sampled, bar, (t0, t_rollout))
        t.held_out(step)
        t.checkpoint(step)
    return t.finish()


def check_run(cfg: GRPOConfig, run: Run, procs: Processes) -> None:
    """Fail before any work on settings that cannot run together (`check_config`, the turns, keep_best);
    warn on clip settings that cannot act (`inert_clip_settings`)."""
    check_config(cfg, procs.world)
    check_env_turns(run.turns)
    if cfg.keep_best and (not cfg.eval_every or procs.world > 1 or run.resume):
        raise ValueError(
            "grpo.keep_best needs grpo.eval_every > 0 and validation clips, in one process, without resume "
            "(the best weights are held in memory)"
        )
    if run.turns.n > 1 and (cfg.dynamic_sampling or cfg.advantage == "gae" or procs.world > 1):
        raise ValueError(
            f"env.turns={run.turns.n} runs with the group estimators in one process: not with "
            "grpo.dynamic_sampling, grpo.advantage=gae or several processes (yet)"
        )
    if inert := inert_clip_settings(cfg):
        warnings.warn(
            f"grpo.updates_per_rollout=1 with {', '.join(inert)}: every importance ratio is exactly 1 "
            "on-policy (the policy that sampled is the one updated), so clipping never acts",
            stacklevel=4,
        )


@dataclass(kw_only=True)
class GRPOTrainer(Trainer):
    """A GRPO run's state (`Trainer`'s, and): the frozen reference policy of the KL term (`ref`), PPO's value
    head and the watch on its explained variance, the reward, the rollouts' sampling settings, whether the
    update takes the sampler's prompt pass, the best held-out weights (`keep_best`) and the counters its
    checkpoints save (prompt draws, steps with nothing to learn from)."""

    ref: Reference | None = None
    head: ValueHead | None = None
    reward_fn: RewardFn | None = None
    sampling: Sampling | None = None
    keep_prefix: bool = False
    best: BestWeights | None = None
    watch: CriticWatch | None = None
    drawn: int = 0
    empty_steps: int = 0

    @classmethod
    def build(cls, cfg: GRPOConfig, run: Run) -> GRPOTrainer:
        """Check the settings; build the reference, the value head, the optimizer and the log; resume
        (`run.resume`) or set an earlier run's checkpoints aside."""
        procs = run.procs or Processes()
        check_run(cfg, run, procs)
        model = run.model
        ref = Reference(model, procs) if cfg.kl_coef > 0 else None  # under LoRA: the adapters off, no copy
        net, head = procs.wrap(model), value_head(model, cfg)
        t = cls(cfg=cfg, run=run, procs=procs, net=net, ref=ref, head=head)
        t.optimizer = make_optimizer(model, head, cfg)
        t.reward_fn = run.reward_fn or mcq_rewards(cfg.accuracy_weight, cfg.format_weight, cfg.order_credit)
        t.log = MetricsLog(run.out_dir / "metrics.jsonl", "grpo")
        t.order = index_batches(len(run.train), cfg.prompts_per_step, run.seed)
        if path := resolve_resume(run.resume, t.ckpt_dir):
            t.resume(path)
        elif cfg.checkpoint_every:
            set_aside(t.ckpt_dir, procs.main)
        t.sampling, t.watch = sampling_args(cfg), CriticWatch(cfg.value_ev_patience)
        t.keep_prefix = keeps_prefix(net, model, cfg, procs, head, run.turns.n)
        t.best = BestWeights() if cfg.keep_best else None
        return t

    @property
    def ckpt_dir(self) -> Path:
        return self.run.out_dir / "checkpoints" / "grpo"

    @property
    def extra(self) -> dict | None:
        """The modules a checkpoint saves beside the policy: PPO's value head."""
        return {"value_head": self.head} if self.head is not None else None

    def resume(self, path: Path) -> None:
        """Load a GRPO checkpoint into the model, optimizer, value head, guard and counters; the next step
        is the one after it, and the batch order skips the batches already drawn."""
        saved = self.procs.load_checkpoint(path, self.model, self.optimizer, extra=self.extra)
        self.drawn, self.empty_steps = saved["drawn"], saved["empty_steps"]
        self.guard.total, self.guard.in_row = saved["skipped"], saved["in_row"]
        self.log.truncate(saved["step"])
        print(f"resuming GRPO from {path} (step {saved['step']})")
        self.start, self.order = saved["step"] + 1, skip_batches(self.order, saved["drawn"])

    def draw(self) -> Rollout:
        """This process's share of the next `prompts_per_step` prompts, answered and scored: G answers per
        prompt, or G trajectories with `run.turns`."""
        run = self.run
        self.drawn += 1
        idx = self.procs.shard(next(self.order))
        # each prompt's answers are seeded by (run seed, draw, prompt): the same whatever the process count
        seeds = [sampling_seed(run.seed, self.drawn, i) for i in idx]
        examples = [run.train[i] for i in idx]
        policy = (run.model, run.processor, examples, run.video, self.reward_fn)
        if run.turns.n > 1:
            return sample_episodes(*policy, run.turns, self.sampling, seeds)
        return sample_groups(*policy, self.sampling, seeds, self.keep_prefix)

    def log_step(self, step: int, ro, metrics: dict, sampled: dict, bar, times: tuple[float, float]) -> None:
        """Every `log_every` steps (and the last) the step's metrics (`step_metrics`); with PPO's critic
        its metrics at every step; the logged rollouts (every `log.samples_every` steps). `times`: when the
        step began and the seconds its rollout took."""
        cfg, procs = self.cfg, self.procs
        if step % cfg.log_every == 0 or step == cfg.steps:
            counts = {"train/skipped_steps": self.guard.total, "train/empty_steps": self.empty_steps}
            metrics = step_metrics(self, metrics | sampled | counts, ro, step)
            if ro is not None:
                bar.set_postfix(r=f"{metrics['reward/total']:.2f}")
            if procs.main:
                t0, t_rollout = times
                self.log.log(
                    step, metrics | {"time/step": time.perf_counter() - t0, "time/rollout": t_rollout}
                )
        elif self.head is not None and metrics and procs.main:  # the critic's metrics at every step
            self.log.log(step, {k: v for k, v in metrics.items() if k.startswith(CRITIC_KEYS)})
        if procs.main:
            self.log.log_rollout(step, ro)  # every log.samples_every steps: frames, answers, rewards, truth

    def held_out(self, step: int) -> None:
        """Every `eval_every` steps (and the last under `keep_best`): greedy accuracy on the validation
        clips, logged, and seen by `best`."""
        cfg, val, best = self.cfg, self.run.val, self.best
        due = cfg.eval_every and val and (step % cfg.eval_every == 0 or (best and step == cfg.steps))
        if self.procs.all_forward and due:
            clips = val[: cfg.eval_examples]
            accuracy = validate(
                self.model, self.processor, clips, self.run.video, self.log, step, self.t_start, self.procs
            )
            if best is not None:
                best.see(step, accuracy, self.model)

    def checkpoint(self, step: int) -> None:
        """Every `checkpoint_every` steps (and the last): the whole state, the counters included."""
        cfg = self.cfg
        if cfg.checkpoint_every and (step % cfg.checkpoint_every == 0 or step == cfg.steps):
            counters = {"drawn": self.drawn, "empty_steps": self.empty_steps}
            counters |= {"skipped": self.guard.total, "in_row": self.guard.in_row}
            self.procs.save_checkpoint(
                self.ckpt_dir, step, self.model, self.optimizer, None, counters, self.run.config_yaml,
                cfg.keep_checkpoints, self.extra,
            )  # fmt: skip

    def finish(self) -> dict:
        """The run's summary, once every process is done; under `keep_best` the policy goes back to its
        best held-out weights."""
        cfg, best = self.cfg, self.best
        self.procs.barrier()
        self.model.eval()
        summary = {"steps": cfg.steps, "wall_s": time.perf_counter() - self.t_start}
        summary["skipped_steps"] = self.guard.total
        if best is not None and best.step is not None:
            best.restore(self.model)
            summary |= {"best_step": best.step, "best_accuracy": best.accuracy}
            if self.procs.main:
                self.log.log(cfg.steps, {"eval/best_step": best.step, "eval/best_accuracy": best.accuracy})
        return summary


class BestWeights:
    """The weights of the held-out point with the highest accuracy so far (the latest of equals), on CPU.
    Under LoRA only the adapters change, so only they are kept (not a second copy of the base weights)."""

    def __init__(self):
        self.step, self.accuracy, self.weights, self.partial = None, -1.0, None, False

    def see(self, step: int, accuracy: float, model) -> None:
        if accuracy >= self.accuracy:
            self.step, self.accuracy = step, accuracy
            state, self.partial = model.state_dict(), has_lora(model)
            if self.partial:
                trained = {n for n, p in model.named_parameters() if p.requires_grad}
                state = {k: v for k, v in state.items() if k in trained}
            self.weights = {k: v.detach().to("cpu", copy=True) for k, v in state.items()}

    def restore(self, model) -> None:
        if self.step is not None:
            model.load_state_dict(self.weights, strict=not self.partial)


class CriticWatch:
    """Warns when PPO's critic is worse than a constant: its explained variance below 0 (below -`tol`: a
    critic that predicts a constant reads 0 give or take rounding) for `patience` steps in a row, once per
    such stretch; `patience` 0 = never."""

    def __init__(self, patience: int, tol: float = 1e-3):
        self.patience, self.tol, self.below = patience, tol, 0

    def see(self, step: int, explained_variance: float) -> bool:
        """Record one step's explained variance; True (with a warning) when the stretch reaches `patience`."""
        self.below = self.below + 1 if explained_variance < -self.tol else 0
        if self.patience <= 0 or self.below != self.patience:
            return False
        warnings.warn(
            f"step {step}: the critic's explained variance has been below 0 for {self.below} steps in a "
            "row: its values are worse than a constant, so the advantages are mostly its error "
            "(docs/recipes.md; try grpo.value_warmup_steps, grpo.value_lr_scale, grpo.value_hidden)",
            stacklevel=2,
        )
        return True


def keeps_prefix(net, model, cfg, procs, head, turns: int) -> bool:
    """Whether the rollout keeps its pass over the prompts for the update (`embodied.policy.groups`): only
    when the update's policy pass sees the same weights, mode and rows. That is one update per rollout
    (nothing steps the optimizer in between), a rollout of one draw that is not re-encoded (no dynamic
    sampling), the whole rollout in one micro-batch, one process with no wrapper around the model (`net`: no
    autocast), no critic (its pass is a full one), no activation checkpointing, single-turn episodes, and
    no dropout (the sampler runs in eval mode, the update in train mode)."""
    dropout = any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules()) or any(
        getattr(c, "attention_dropout", 0.0) > 0 for c in (model.config, model.config.get_text_config())
    )
    rows = cfg.prompts_per_step * cfg.group_size
    return (
        cfg.updates_per_rollout == 1
        and not cfg.dynamic_sampling
        and (cfg.micro_batch_size == 0 or cfg.micro_batch_size >= rows)
        and procs.world == 1
        and net is model
        and head is None
        and not getattr(model, "is_activation_checkpointing", False)
        and turns == 1
        and not dropout
    )


def rollout(draw, cfg, processor, video: VideoConfig) -> tuple[Rollout | None, dict]:
    """This step's rollout: one draw, or DAPO's dynamic sampling (with its statistics)."""
    if cfg.dynamic_sampling:
        return dynamic_sample(draw, cfg.prompts_per_step, cfg.max_sampling_rounds, processor, video)
    return draw(), {}


def learn(t: GRPOTrainer, ro: Rollout, step: int) -> dict:
    """Advantages within each group (or, with PPO's value head `t.head`, GAE against its values), then
    `cfg.updates_per_rollout` optimizer steps against the sampling policy's log-probs (masks and token
    picks drawn from `(seed, step)`); the last update's metrics."""
    cfg, model, head = t.cfg, t.model, t.head
    gen, critic, extra = _generator(t.seed, step, 1), None, {}
    model.train()
    if head is None:
        all_sum = t.procs.sum if t.procs.world > 1 else None
        advantages = compute_advantages(ro.rewards, cfg.advantage, all_sum).flatten()
        if ro.owner is not None:  # multi-turn: every turn's row gets its trajectory's advantage
            advantages = advantages[ro.owner]
        # mu = 1: the sampling policy is the current one, so its log-probs are the detached current ones
        mu = cfg.updates_per_rollout
        old_logp = rollout_logprobs(model, ro, cfg.micro_batch_size) if mu > 1 else None
    else:
        advantages, old_logp, critic, extra = critic_targets(model, t.ref, head, ro, cfg)
    warmup = head is not None and step <= cfg.value_warmup_steps  # the critic learns, the policy waits
    stepped = model if head is None else torch.nn.ModuleList([model, head])  # clipped and stepped together
    for _ in range(cfg.updates_per_rollout):
        metrics = update(t, ro, advantages, old_logp, gen, critic, warmup)
        loss = torch.tensor(metrics["loss/total"])
        stepping = head if warmup else stepped  # no policy parameter has a gradient in the warm-up
        metrics["optim/grad_norm"] = apply_gradients(
            stepping, t.optimizer, loss, cfg.grad_clip, t.guard, step
        )
    if critic is not None:
        extra |= critic_fit(model, ro, critic, cfg) | {"critic/warmup": float(warmup)}
    model.eval()
    return metrics | extra


@torch.no_grad()
def critic_fit(model, ro: Rollout, critic: Critic, cfg) -> dict:
    """How well the head now fits the rollout it was just trained on: the explained variance of its values
    after the updates against the same returns. Beside `critic/explained_variance` (the values the
    advantages were made with, before the head saw this rollout) it separates a critic that cannot fit from
    one that fits but does not carry over to new questions."""
    _, values = rollout_logprobs(model, ro, cfg.micro_batch_size, critic.head)
    mask = loss_mask(ro, cfg)
    fit = explained_variance(baseline_values(values, mask, cfg), critic.returns, mask)
    return {"critic/explained_variance_fit": float(fit)}


def step_metrics(t: GRPOTrainer, metrics: dict, ro: Rollout | None, step: int) -> dict:
    """A logged step's metrics: the update's and the rollout's, reduced over processes, plus PAPO's
    masked-input accuracy (its masks drawn from `(seed, step)`)."""
    if ro is not None:
        metrics |= {
            **mean_terms(ro.terms),
            "reward/group_spread": (ro.rewards.amax(1) > ro.rewards.amin(1)).float().mean(),
            "rollout/len": ro.mask.sum(1).float().mean(),
            "rollout/truncated": ro.truncated.float().mean(),
            **ro.stats,
        }
        metrics = t.procs.reduce_metrics(metrics, summed=UPDATE_SUMS)
    if t.procs.all_forward and ro is not None and t.cfg.papo:
        gen = _generator(t.seed, step, 2)
        metrics |= masked_input_accuracy(t.model, t.processor, ro, t.cfg, t.reward_fn, gen)
    return metrics


def validate(
    model, processor, val: Sequence[Example], video: VideoConfig, log, step: int, t_start: float, procs
):
    """Greedy accuracy on the validation examples, logged as `eval/*` and returned."""
    res = evaluate(model, processor, val, video, choice=False, progress=False)
    if procs.main:
        metrics = {"eval/accuracy": res["accuracy"], "eval/unparseable": res["unparseable"]}
        log.log(step, metrics | {"time/elapsed": time.perf_counter() - t_start})
    return res["accuracy"]
