"""GRPO and its descendants: sample a group of answers per question, score them, push towards the better.

One step, top to bottom (`GRPO.step`): rollout (G samples per prompt, DAPO dynamic sampling if on) ->
rewards -> advantages (an `Estimator`: a group baseline, or PPO's critic with `advantage=gae`,
`embodied.rl.critic`) -> `updates_per_rollout` optimizer steps of the clipped policy loss (+ KL to the frozen
initial policy, entropy controls, PAPO's perception loss, the estimator's own loss, registered loss terms),
each accumulated over micro-batches. The runner (`embodied.train.runner`) does the rest: logging,
validation, keep-best, checkpoints, resume. Every recipe is a switch of `GRPOConfig`; presets live in
configs/recipes/ (grpo, dapo, drgrpo, papo, ..., ppo).
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from dataclasses import dataclass
from operator import attrgetter
from typing import NamedTuple

import torch

from embodied.envs.config import Turns
from embodied.policy.groups import PromptPass
from embodied.policy.lora import is_checkpointing
from embodied.policy.model import completion_logprobs, completion_outputs, select_rows
from embodied.policy.sampling import sync_engine
from embodied.rl.advantages import ESTIMATORS, Context, Estimate, Estimator
from embodied.rl.critic import check_ppo  # importing it registers grpo.advantage=gae
from embodied.rl.episodes import sample_episodes
from embodied.rl.losses import (
    COV_MODES,
    IS_CORRECTIONS,
    LOSS_AGGREGATIONS,
    LOSSES,
    RATIO_LEVELS,
    LossInputs,
    LossSpec,
    engine_is_weights,
    grpo_loss,
    k3_kl,
    masked_mean,
    perception_loss,
)
from embodied.rl.papo import masked_batch, masked_input_accuracy
from embodied.rl.rewards import mcq_rewards, mean_terms, overlong_shaping
from embodied.rl.rollout import (
    Rollout,
    Sampling,
    dynamic_sample,
    engine_metrics,
    micro_batches,
    rollout_logprobs,
    sample_groups,
    sampling_seed,
)
from embodied.train.common import (
    NonFiniteGuard,
    apply_gradients,
    index_batches,
    param_groups,
    skip_batches,
    with_last,
)
from embodied.train.config import GRPOConfig
from embodied.train.distributed import Processes
from embodied.train.metrics import MetricsLog
from embodied.train.reference import Reference
from embodied.train.runner import Cadence, Runner
from embodied.train.state import Run

CHOICES = {
    "loss_agg": LOSS_AGGREGATIONS,
    "ratio_level": RATIO_LEVELS,
    "is_correction": IS_CORRECTIONS,
    "cov.mode": COV_MODES,
    "overlong.mode": ("off", "hard", "soft"),
}

# update() returns each process's share of these; their sum over processes is the global value
UPDATE_SUMS = ("loss/", "clip/", "entropy/", "drift/")


def check_config(cfg, world: int = 1) -> None:
    """Fail before any work on a misspelt recipe switch (naming the key and the choices), a combination
    that cannot run, or one not supported over `world` processes yet."""
    value = {k: attrgetter(k)(cfg) for k in CHOICES}  # dotted: `cov.mode`
    bad = [f"grpo.{k}={value[k]!r} (choose {v})" for k, v in CHOICES.items() if value[k] not in v]
    if cfg.advantage not in ESTIMATORS:
        bad.append(f"grpo.advantage={cfg.advantage!r} (choose {tuple(ESTIMATORS)})")
    unknown = [name for name in cfg.loss_terms if name not in LOSSES]
    if unknown:
        bad.append(f"grpo.loss_terms: {unknown} are not registered loss terms (registered: {sorted(LOSSES)})")
    if cfg.updates_per_rollout < 1 or cfg.micro_batch_size < 0 or cfg.max_sampling_rounds < 1:
        bad.append(
            "grpo.updates_per_rollout and grpo.max_sampling_rounds must be >= 1, micro_batch_size >= 0"
        )
    if cfg.target_kl is not None and cfg.target_kl <= 0:
        bad.append(f"grpo.target_kl={cfg.target_kl} must be > 0 (or null: no stop)")
    if not 0.0 <= cfg.is_floor <= 1.0 <= cfg.is_cap:
        bounds = f"grpo.is_floor={cfg.is_floor}, grpo.is_cap={cfg.is_cap}"
        bad.append(f"{bounds}: need 0 <= is_floor <= 1 <= is_cap")
    bad += check_ppo(cfg, world)
    if world > 1 and cfg.dynamic_sampling:
        bad.append("grpo.dynamic_sampling with several processes is not supported yet: run it in one")
    if bad:
        raise ValueError("; ".join(bad))


def inert_settings(cfg) -> list[str]:
    """The clip and stop settings of `cfg` that cannot act because `updates_per_rollout` is 1: the loss's old
    log-probs are the trainer's own at the sampled weights (under `rollout.engine=vllm` too: the engine's
    enter only the sampler's correction, `grpo.is_correction`), so every PPO ratio is exactly 1 and a ratio
    clip never binds; with PPO's critic the values are likewise the rollout's own, so the value clip never
    binds either, and a `target_kl` has no later update to stop. Only settings a recipe chose are named (a
    non-default clip, clip-higher, dual clip, GSPO's sequence ratio, PPO's value clip, target_kl), so a plain
    GRPO run stays quiet. Empty when `updates_per_rollout` > 1."""
    if cfg.updates_per_rollout > 1:
        return []
    default = {f.name: f.default for f in dataclasses.fields(cfg)}["clip_eps"]
    value_clip = cfg.advantage == "gae" and cfg.ppo.value_clip > 0
    named = [
        f"grpo.clip_eps={cfg.clip_eps}" if cfg.clip_eps != default else "",
        f"grpo.clip_eps_high={cfg.clip_eps_high}" if cfg.clip_eps_high is not None else "",
        f"grpo.dual_clip={cfg.dual_clip}" if cfg.dual_clip is not None else "",
        "grpo.ratio_level=sequence" if cfg.ratio_level == "sequence" else "",
        f"grpo.target_kl={cfg.target_kl}" if cfg.target_kl is not None else "",
        f"grpo.ppo.value_clip={cfg.ppo.value_clip}" if value_clip else "",
    ]
    return [n for n in named if n]


def inert_correction(cfg, engine) -> list[str]:
    """The sampler-correction settings of `cfg` (`grpo.is_*`) that cannot act, each with why: all of them
    with no engine log-probs to correct against (`engine` None: `rollout.engine=hf`, the sampler is the
    trained model), the bounds with the correction off, the floor under truncation (it caps from above
    only). As `inert_settings`, only the settings a recipe chose (not the defaults) are named."""
    default = {f.name: f.default for f in dataclasses.fields(cfg)}
    chosen = [k for k in ("is_correction", "is_cap", "is_floor") if getattr(cfg, k) != default[k]]
    off = cfg.is_correction == "off"
    if off or engine is None:
        why = "grpo.is_correction=off" if off else "rollout.engine=hf samples with the trained model itself"
        named = [k for k in chosen if not (off and k == "is_correction")]
        return [f"grpo.{k}={getattr(cfg, k)} ({why}: no correction)" for k in named]
    if "is_floor" in chosen and cfg.is_correction.endswith("_truncate"):
        return [f"grpo.is_floor={cfg.is_floor} (grpo.is_correction={cfg.is_correction} caps from above only)"]
    return []


def _generator(seed: int, step: int, salt: int) -> torch.Generator:
    """A CPU generator fixed by (seed, step): masks and token picks replay exactly after a resume."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step * 7919 + salt)


def loss_spec(cfg) -> LossSpec:
    """The loss switches of a `GRPOConfig`."""
    return LossSpec(
        clip_eps=cfg.clip_eps,
        clip_eps_high=cfg.clip_eps_high,
        dual_clip=cfg.dual_clip,
        kl_coef=0.0 if cfg.ppo.kl_in_reward else cfg.kl_coef,  # in the reward instead (rl.critic)
        kl_kind=cfg.kl_estimator,
        agg=cfg.loss_agg,
        agg_norm=cfg.max_new_tokens,
        ratio_level=cfg.ratio_level,
        entropy_coef=cfg.entropy_coef,
        cov_mode=cfg.cov.mode,
        cov_ratio=cfg.cov.ratio,
        clip_cov_bounds=(cfg.cov.clip_low, cfg.cov.clip_high),
        kl_cov_coef=cfg.cov.kl_coef,
    )


def sampling_args(cfg) -> Sampling:
    """The rollouts' sampling and shaping settings of a `GRPOConfig`."""
    o = cfg.overlong
    shaping = overlong_shaping(cfg.max_new_tokens, o.mode, o.buffer, o.weight)
    return Sampling(
        cfg.group_size, cfg.max_new_tokens, cfg.temperature, cfg.temperatures, shaping, cfg.reward_timeout_s
    )


def loss_mask(ro: Rollout, cfg) -> torch.Tensor:
    """`(B, T)` the tokens the loss sees: the completions, less truncated ones under `mask_truncated`."""
    return ro.mask * (~ro.truncated).unsqueeze(1) if cfg.mask_truncated else ro.mask


def make_optimizer(model, estimator: Estimator, cfg) -> torch.optim.Optimizer:
    """AdamW over the policy (vision tower at `vision_lr_scale`) and the estimator's modules (PPO's value
    head at `ppo.value_lr_scale`): one optimizer, so one checkpoint file holds both states."""
    groups = param_groups(model, cfg.lr, cfg.vision_lr_scale) + estimator.param_groups(cfg.lr)
    return torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=0.0)


class LastStep(NamedTuple):
    """What `GRPO.step` leaves for `GRPO.report`: the step's rollout (None when every group drawn had equal
    rewards), its update metrics, the sampling statistics (DAPO's rounds) and the rollout's seconds."""

    rollout: Rollout | None = None
    metrics: dict = {}
    sampled: dict = {}
    rollout_s: float = 0.0


class Update(NamedTuple):
    """What every micro-batch of one update shares (`GRPO.update`, `GRPO.loss`)."""

    ro: Rollout
    mask: torch.Tensor
    """`(B, T)` the tokens the loss sees (`loss_mask`)."""
    est: Estimate
    """The advantages (`(B,)` or `(B, T)`) and the sampling policy's log-probs (None: on-policy)."""
    gen: torch.Generator
    """PAPO's masks and any token picks, drawn from `(seed, step)`."""
    learns: bool
    """False under a critic's warm-up: the policy loss is left out, only the estimator's own loss acts."""
    head: torch.nn.Module | None
    """The estimator's head on the policy's hidden states (PPO's value head), or None."""
    rows: int
    """Rows of the whole update, summed over processes: every micro-batch's loss is normalised by it."""
    tokens: int
    """Loss tokens of the whole update, summed over processes."""
    prefix: tuple | None = None
    """The sampler's pass over the rollout's prompts, taken for the policy pass (None: it runs again)."""


@dataclass
class GRPO:
    """The GRPO step (`embodied.train.runner.Algorithm`): the policy as the loss sees it (`net`, wrapped
    under DDP or FSDP), the frozen reference of the KL term (`ref`: under LoRA the adapters off, no copy),
    the advantage estimator, the optimizer, the reward, the rollouts' sampling settings, whether the update
    takes the sampler's prompt pass (`keeps_prefix`), the batch order and the counters its checkpoints
    save."""

    cfg: GRPOConfig
    run: Run
    procs: Processes
    net: torch.nn.Module
    ref: Reference | None
    estimator: Estimator
    optimizer: torch.optim.Optimizer
    reward_fn: object
    sampling: Sampling
    keep_prefix: bool
    order: object
    log: MetricsLog
    guard: NonFiniteGuard = dataclasses.field(default_factory=NonFiniteGuard)
    drawn: int = 0
    empty_steps: int = 0
    last: LastStep = LastStep()
    stage, title, unit, schedule = "grpo", "GRPO", "step", None

    @classmethod
    def build(cls, cfg: GRPOConfig, run: Run, procs: Processes, log: MetricsLog) -> GRPO:
        """Check the settings; build the reference, the estimator and the optimizer."""
        check_run(cfg, run, procs)
        model = run.model
        ref = Reference(model, procs) if cfg.kl_coef > 0 else None
        net, estimator = procs.wrap(model), ESTIMATORS[cfg.advantage](cfg, model)
        reward_fn = run.reward_fn or mcq_rewards(cfg.accuracy_weight, cfg.format_weight, cfg.order_credit)
        order = index_batches(len(run.train), cfg.prompts_per_step, run.seed)
        keep = keeps_prefix(net, model, cfg, procs, estimator.head(True), run.turns)
        optimizer = make_optimizer(model, estimator, cfg)
        return cls(
            cfg, run, procs, net, ref, estimator, optimizer, reward_fn, sampling_args(cfg), keep, order, log
        )

    @property
    def modules(self) -> dict | None:
        return self.estimator.modules or None

    def step(self, step: int) -> None:
        """One step, in cleanrl's order: the rollout (every answer scored as it is drawn: the rewards), then
        on it the advantages and the updates (`learn`); the runner asks `report` for the metrics next. With
        `keep_prefix` the sampler runs its pass over the prompts with gradients and leaves it in
        `prompt_pass`, and the update's policy pass takes it instead of running it again."""
        t0 = time.perf_counter()
        prompt_pass = PromptPass() if self.keep_prefix else None
        ro, sampled = self.rollout(prompt_pass)
        t_rollout, metrics = time.perf_counter() - t0, {}
        if ro is None:  # every group drawn had equal rewards: nothing to learn from this step
            self.empty_steps += 1
        else:
            metrics = self.learn(ro, step, prompt_pass)
            metrics |= sync_engine(self.run.engine, self.run.model)  # the next rollout samples these weights
        self.last = LastStep(ro, metrics, sampled, t_rollout)

    def learn(self, ro: Rollout, step: int, prompt_pass: PromptPass | None = None) -> dict:
        """The advantages of `ro`, then the updates on them (masks and token picks drawn from `(seed, step)`):
        the last update's metrics, the estimator's, and how far the sampling engine's log-probs are from the
        trainer's before any update (`engine_metrics`)."""
        model = self.run.model
        gen = _generator(self.run.seed, step, 1)
        drift = engine_metrics(model, self.run.processor, ro, self.cfg.micro_batch_size)
        model.train()
        est, ctx = self.advantages(ro)
        metrics = self.updates(ro, est, gen, step, prompt_pass)
        after = self.estimator.after_update(ro, ctx, est, step)
        model.eval()
        return metrics | est.metrics | after | drift

    def rollout(self, prompt_pass: PromptPass | None = None) -> tuple[Rollout | None, dict]:
        """This step's rollout: one draw (its prompt pass left in `prompt_pass`, if given), or DAPO's dynamic
        sampling, with its statistics (`keeps_prefix` is off there: the kept groups are re-encoded)."""
        cfg, run = self.cfg, self.run
        if cfg.dynamic_sampling:
            rounds = (cfg.prompts_per_step, cfg.max_sampling_rounds)
            return dynamic_sample(self.draw, *rounds, run.processor, run.video)
        return self.draw(prompt_pass), {}

    def draw(self, prompt_pass: PromptPass | None = None) -> Rollout:
        """This process's share of the next `prompts_per_step` prompts, answered and scored: G answers per
        prompt, or G trajectories with `run.turns`."""
        run = self.run
        self.drawn += 1
        idx = self.procs.shard(next(self.order))
        # each prompt's answers are seeded by (run seed, draw, prompt): the same whatever the process count
        seeds = [sampling_seed(run.seed, self.drawn, i) for i in idx]
        policy = (run.model, run.processor, [run.train[i] for i in idx], run.video, self.reward_fn)
        if run.turns.n > 1:
            return sample_episodes(*policy, run.turns, self.sampling, seeds, run.engine)
        return sample_groups(*policy, self.sampling, seeds, prompt_pass, run.engine)

    def advantages(self, ro: Rollout) -> tuple[Estimate, Context]:
        """The estimator's advantages of `ro` (and the context it estimated in), with the sampling policy's
        log-probs when several updates move the policy away from it (one update: the sampling policy is the
        current one, so the loss takes its own detached log-probs)."""
        cfg, model = self.cfg, self.run.model
        all_sum = self.procs.sum if self.procs.world > 1 else None
        ctx = Context(model, self.ref, loss_mask(ro, cfg), cfg.micro_batch_size, all_sum, ro.owner)
        est = self.estimator.estimate(ro, ctx)
        if est.old_logp is None and cfg.updates_per_rollout > 1:
            est.old_logp = rollout_logprobs(model, ro, cfg.micro_batch_size)
        return est, ctx

    def updates(
        self, ro: Rollout, est: Estimate, gen, step: int, prompt_pass: PromptPass | None = None
    ) -> dict:
        """`updates_per_rollout` optimizer steps against the sampling policy's log-probs (with `target_kl`,
        fewer once the policy drifted that far): the last update's metrics, with cleanrl's approx_kl and clip
        fraction over the updates that ran. Under a critic's warm-up only the estimator's modules step."""
        cfg, model, mu = self.cfg, self.run.model, self.cfg.updates_per_rollout
        learns, mods = self.estimator.policy_learns(step), list(self.estimator.modules.values())
        stepped = model if not mods else torch.nn.ModuleList([model, *mods] if learns else mods)
        gauges = []
        for _ in range(mu):
            metrics = self.update(ro, est, gen, learns, prompt_pass)
            loss = torch.tensor(metrics["loss/total"])
            metrics["optim/grad_norm"] = apply_gradients(
                stepped, self.optimizer, loss, cfg.grad_clip, self.guard, step
            )
            if mu > 1:
                gauges.append((metrics.pop("drift/approx_kl"), metrics.get("clip/fraction", 0.0)))
                kl = torch.tensor(gauges[-1][0])  # the stop: one decision over every process's share
                if cfg.target_kl is not None and float(self.procs.sum(kl)) > cfg.target_kl:
                    break
        if gauges:
            metrics |= {"drift/approx_kl": gauges[-1][0], "optim/updates": len(gauges)}
            metrics["drift/clip_fraction_mean"] = sum(c for _, c in gauges) / len(gauges)
        return metrics

    def update(
        self, ro: Rollout, est: Estimate, gen, learns: bool = True, prompt_pass: PromptPass | None = None
    ) -> dict:
        """Accumulate the loss's gradient over micro-batches of the rollout (no optimizer step) through `net`.
        `est` holds the advantages (`(B,)` or `(B, T)`) and the sampling policy's log-probs (None: on-policy);
        with `learns` False (a critic's warm-up) the policy loss is left out and only the estimator's own loss
        acts, on its module alone. `prompt_pass`: the sampler's pass over the prompts, taken by the policy
        pass of an update that runs the whole rollout in one micro-batch (`keeps_prefix`).

        Every micro-batch loss is normalised by whole-rollout sizes (summed over processes), so the summed
        gradient equals the whole-batch one. Returns this process's share of the detached metrics, summed the
        same way (clip fractions and drift token-weighted); summing them over processes gives the global
        values.
        """
        cfg, procs = self.cfg, self.procs
        mask = loss_mask(ro, cfg)
        rows, tokens = int(procs.sum(torch.tensor(mask.shape[0]))), int(procs.sum(mask.sum()))
        parts = micro_batches(mask.shape[0], cfg.micro_batch_size)
        # the kept pass is of every prompt of the rollout: only a pass over all its rows can take it
        prefix = prompt_pass.take(self.net) if prompt_pass is not None and len(parts) == 1 else None
        u = Update(ro, mask, est, gen, learns, self.estimator.head(learns), rows, tokens, prefix)
        totals: dict[str, float] = {}
        for idx, last in with_last(parts):
            with procs.grad_sync(self.net, last):  # DDP all-reduces once, after the last micro-batch
                loss, terms, entropy = self.loss(u, idx)
                procs.backward(loss)
            m = mask[idx]
            share = float(m.sum()) / max(tokens, 1)
            for k, v in terms.items():
                if k.endswith("_max"):  # a maximum over the micro-batches (`rollout/is_ratio_max`)
                    totals[k] = max(totals.get(k, -float("inf")), float(v))
                    continue
                weight = share if k.startswith(("clip/", "drift/")) else 1.0  # token-weighted fractions
                totals[k] = totals.get(k, 0.0) + float(v) * weight
            totals["loss/total"] = totals.get("loss/total", 0.0) + float(loss.detach())
            totals["entropy/mean"] = (
                totals.get("entropy/mean", 0.0) + float(masked_mean(entropy.detach(), m)) * share
            )
        return totals

    def loss(self, u: Update, idx: list[int]) -> tuple[torch.Tensor, dict, torch.Tensor]:
        """The loss of the micro-batch of rows `idx` of update `u` (policy, estimator, perception and
        registered terms), its terms and its tokens' entropies."""
        cfg, ro, est, spec = self.cfg, u.ro, u.est, loss_spec(self.cfg)
        sub, ids, m, temp = select_rows(ro.batch, idx), ro.ids[idx], u.mask[idx], ro.temperature[idx]
        papo = cfg.papo.enabled and cfg.papo.entropy_real > 0
        entropy_grad = cfg.entropy_coef > 0 or papo or bool(cfg.loss_terms)
        mode = "grad" if entropy_grad else "detached"
        logp, entropy, values = completion_outputs(self.net, sub, ids, m, temp, mode, u.head, prefix=u.prefix)
        ref_logp = None
        if self.ref is not None and spec.kl_coef > 0:
            with torch.no_grad(), self.ref.active() as ref:
                ref_logp = completion_logprobs(ref, sub, ids, m, temp)
        old = logp.detach() if est.old_logp is None else est.old_logp[idx]
        ent = entropy if cfg.entropy_coef > 0 else None
        if not u.learns:
            loss, terms = torch.zeros((), device=logp.device), {}
        else:  # the policy loss, each token's policy-gradient term weighted by the sampler's correction
            weight, is_terms = self.correction(u, idx, old, m)
            args = (spec, ent, u.gen, u.rows, u.tokens, weight)
            loss, terms = grpo_loss(logp, old, est.advantages[idx], m, ref_logp, *args)
            terms |= is_terms
        if (own := self.estimator.loss(values, idx, est)) is not None:
            loss, terms = loss + own[0], terms | own[1]
        if cfg.papo.enabled and u.learns:
            p_loss, p_terms = self.perception(u, sub, ids, m, temp, logp, entropy)
            loss, terms = loss + p_loss, terms | p_terms
        if cfg.loss_terms and u.learns:
            inputs = LossInputs(logp, old, ref_logp, est.advantages[idx], m, entropy, **self.sizes(u))
            for name, weight in cfg.loss_terms.items():
                value = LOSSES[name](inputs)
                loss, terms = loss + weight * value, terms | {f"loss/{name}": value.detach()}
        if cfg.updates_per_rollout > 1:  # cleanrl's approx_kl: KL(sampling || current), k3, before the step
            terms["drift/approx_kl"] = masked_mean(k3_kl(old, logp.detach()), m)
        return loss, terms, entropy

    def correction(self, u: Update, idx: list[int], old: torch.Tensor, m: torch.Tensor) -> tuple:
        """The sampler/trainer importance weights `(B, T)` of the micro-batch of rows `idx` (the loss's old
        log-probs `old` against the engine's: `engine_is_weights`, `grpo.is_*`) and their statistics; None
        and {} with the correction off or no engine log-probs (`rollout.engine=hf`): the loss is then computed
        exactly as without the correction, with no weight of ones multiplied in."""
        cfg, engine_logp = self.cfg, u.ro.engine_logprobs
        if cfg.is_correction == "off" or engine_logp is None:
            return None, {}
        bounds = (cfg.is_cap, cfg.is_floor, u.rows, u.tokens)
        return engine_is_weights(old, engine_logp[idx].to(old.device), m, cfg.is_correction, *bounds)

    def sizes(self, u: Update) -> dict:
        """The loss aggregation and the whole-update sizes it normalises by."""
        cfg = self.cfg
        return {
            "agg": cfg.loss_agg,
            "agg_norm": cfg.max_new_tokens,
            "num_seqs": u.rows,
            "num_tokens": u.tokens,
        }

    def perception(self, u: Update, sub, ids, m, temp, logp, entropy) -> tuple[torch.Tensor, dict]:
        """PAPO's perception loss: the same answers' log-probs with the video masked."""
        p = self.cfg.papo
        masked = masked_batch(sub, self.run.processor, p.mask_prob, p.consistent, u.gen)
        with torch.set_grad_enabled(p.masked_grad):
            mode = "grad" if p.masked_grad else "detached"
            m_logp, m_ent, _ = completion_outputs(self.net, masked, ids, m, temp, mode)
        weights = (p.entropy_real, p.entropy_masked)
        return perception_loss(logp, m_logp, m, p.gamma, entropy, m_ent, weights, **self.sizes(u))

    def report(self, step: int, due: bool, step_s: float) -> dict:
        """Every `log_every` steps (and the last) the step's metrics (`step_metrics`); the estimator's
        every-step metrics in between; the logged rollouts (every `log.samples_every` steps)."""
        ro, metrics, sampled, t_rollout = self.last
        row = {}
        if due:
            counts = {"train/skipped_steps": self.guard.total, "train/empty_steps": self.empty_steps}
            row = self.step_metrics(metrics | sampled | counts, ro, step)
            row |= {"time/step": step_s, "time/rollout": t_rollout}
        elif self.estimator.every_step and metrics:
            row = {k: v for k, v in metrics.items() if k.startswith(self.estimator.every_step)}
        if self.procs.main:
            self.log.log_rollout(step, ro)  # every log.samples_every steps: frames, answers, rewards, truth
        return row

    def step_metrics(self, metrics: dict, ro: Rollout | None, step: int) -> dict:
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
            metrics = self.procs.reduce_metrics(metrics, summed=UPDATE_SUMS)
        if self.procs.all_forward and ro is not None and self.cfg.papo.enabled:
            gen, run = _generator(self.run.seed, step, 2), self.run
            metrics |= masked_input_accuracy(run.model, run.processor, ro, self.cfg, self.reward_fn, gen)
        return metrics

    def postfix(self, row: dict) -> dict:
        return {"r": f"{row['reward/total']:.2f}"} if "reward/total" in row else {}

    def state(self) -> dict:
        return {"drawn": self.drawn, "empty_steps": self.empty_steps} | self.guard.state()

    def load(self, state: dict) -> None:
        """The guard and counters of a GRPO checkpoint (the runner loaded the weights, the optimizer and the
        estimator's modules); the batch order skips the batches already drawn; the engine gets the
        checkpoint's weights, not the start's."""
        self.drawn, self.empty_steps = state["drawn"], state["empty_steps"]
        self.guard.load(state)
        self.order = skip_batches(self.order, state["drawn"])
        sync_engine(self.run.engine, self.run.model)

    def summary(self) -> dict:
        return {"skipped_steps": self.guard.total}


def train_grpo(cfg: GRPOConfig, run: Run) -> dict:
    """Run `cfg.steps` GRPO steps: rollout -> advantages -> loss -> step -> log/eval/checkpoint, on
    `run.train` (a `Run`: the policy, the data, `out_dir`, the seed, the reward...). Metrics go to
    `out_dir/metrics.jsonl`, checkpoints to `out_dir/checkpoints/grpo` (`run.resume`: "", "auto" or a
    checkpoint folder). `run.reward_fn(texts, records)` scores a batch (default: the MCQ rules; a failing
    one stops the run with a `RewardError`). Under several processes (`run.procs`) each samples and trains
    on its share of every step's prompts (whole groups, so advantages are exact); only the first logs,
    evaluates and writes checkpoints. `run.turns` (`Turns.of(cfg.env)`) with more than one turn plays
    multi-turn episodes (`embodied.rl.episodes`): a group is G whole trajectories. With `cfg.keep_best` the
    policy ends on its best held-out point."""
    procs, cadence = run.procs or Processes(), Cadence.of(cfg)  # the runner checks the cadence
    log = MetricsLog(run.out_dir / "metrics.jsonl", "grpo")
    return Runner.build(GRPO.build(cfg, run, procs, log), run, cadence, procs, log).run_steps()


def check_run(cfg: GRPOConfig, run: Run, procs: Processes) -> None:
    """Fail before any work on settings that cannot run together (`check_config` and the turns); warn on
    clip and stop settings that cannot act (`inert_settings`) and on sampler-correction settings that cannot
    (`inert_correction`)."""
    check_config(cfg, procs.world)
    if run.turns.n > 1 and (cfg.dynamic_sampling or cfg.advantage == "gae" or procs.world > 1):
        raise ValueError(
            f"env.turns={run.turns.n} runs with the group estimators in one process: not with "
            "grpo.dynamic_sampling, grpo.advantage=gae or several processes (yet)"
        )
    for setting in inert_correction(cfg, run.engine):
        warnings.warn(f"{setting}: this setting never acts", stacklevel=4)
    if inert := inert_settings(cfg):
        why = "the policy that sampled is the one updated: every importance ratio is exactly 1, no clip binds"
        if cfg.target_kl is not None:
            why += "; no later update is left for target_kl to stop"
        warnings.warn(
            f"grpo.updates_per_rollout=1 with {', '.join(inert)}: these settings never act ({why})",
            stacklevel=4,
        )


def keeps_prefix(net, model, cfg: GRPOConfig, procs: Processes, head, turns: Turns) -> bool:
    """Whether a GRPO step keeps the sampler's pass over the prompts for its update (`GRPO.step`'s
    `PromptPass`, `embodied.policy.groups`): only when the update's policy pass sees the same weights, mode
    and rows. That is one update per rollout
    (nothing steps the optimizer in between), a rollout of one draw that is not re-encoded (no dynamic
    sampling), the whole rollout in one micro-batch, one process with no wrapper around the model (`net`: no
    autocast), no estimator head (a critic's pass is a full one), no activation checkpointing, single-turn
    episodes, and no dropout (the sampler runs in eval mode, the update in train mode)."""
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
        and not is_checkpointing(model)
        and turns.n == 1
        and not dropout
    )
