"""Expert iteration: sample many answers, keep the verified best, fine-tune on them, and again.

Rejection-sampling fine-tuning in rounds, as STaR (Zelikman et al. 2022) and ReST-EM (Singh et al. 2023)
do with a checker of final answers; here the checker is the reward function, so for interactive episodes
MuJoCo executes every sampled answer and the physical outcome decides which one is kept. One round:

1. draw `prompts_per_round` training prompts and sample `samples` answers to each (`rl.rollout.sample_groups`,
   the same sampling and scoring as a GRPO step, each answer seeded by (run seed, round, prompt));
2. per prompt keep at most one answer (`select`, in `embodied.train.expert_targets` with the other pure
   functions that choose targets): the highest-reward one that succeeded (`keep=success`) or the
   highest-reward one whenever the answers differ (`keep=best`); truncated answers are never kept;
3. fine-tune the current policy for `sft_steps` steps on the kept (prompt, answer) pairs (`train.sft`, a fresh
   optimizer per round; the answer text is the target).

With `replay=true`, step 3 fine-tunes on every prompt's latest kept answer so far, from this round and the
earlier ones (each was verified by the reward, so it stays a valid target): the data grow round by round, as
ReST's do, at the same `sft_steps` per round.

A round depends only on the policy it starts from, on (run seed, round) and, with `replay`, on the kept
answers of earlier rounds: its prompts, samples and fine-tuning are seeded by them. So the checkpoint written
after each round (`out_dir/checkpoints/expert/step-<round>`: weights, counters with the replayed answers, and
the `expert:` settings) is all a resumed run needs, and a run resumed with more `expert.rounds` continues the
shorter run as if it had been asked for more from the start.

Unlike GRPO, nothing is learned from the answers that lost, and no reference policy or KL term is involved.
The answers scored in all are `rounds * prompts_per_round * samples`, which is how it is compared with GRPO at
equal simulator calls (docs/environments.md, "Expert iteration").
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import numpy as np

from embodied.data.load import Example
from embodied.envs.config import Turns
from embodied.policy.sampling import sync_engine
from embodied.rl.episodes import sample_episodes
from embodied.rl.rewards import mcq_rewards, rewards_for
from embodied.rl.rollout import Sampling, sample_groups, sampling_seed
from embodied.train.config import ExpertConfig, SFTConfig
from embodied.train.distributed import Processes
from embodied.train.expert_targets import (
    KEEP,
    RETRY_TARGETS,
    balanced,
    prompt_id,
    select,
    select_turns,
    task_name,
    task_successes,
)
from embodied.train.metrics import MetricsLog
from embodied.train.runner import Cadence, Runner
from embodied.train.sft import train_sft
from embodied.train.state import Run

BALANCE = ("none", "failures")
LATER_SETTINGS = {
    "balance": "none",
    "retry_targets": "own",
    "retry_temperature": 0.0,
    "retry_min_p": 0.0,
    "turn_clip": "outcome",
    "replay": False,
}
"""Expert settings added after checkpoints were first written, with the value older runs used."""


def round_sft(sft_cfg, steps: int, batch_size: int, lr: float):
    """The `SFTConfig` of one fine-tuning pass on selected targets (an expert round): `steps` steps of
    `batch_size` at peak `lr`, with `sft_cfg`'s warmup, clip, weight decay and vision scale, and no
    restarts, validation, early stop, time limit or checkpoints of its own."""
    return dataclasses.replace(
        sft_cfg,
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        restart_every=0,
        eval_every=0,
        stop_at=0.0,
        max_seconds=0.0,
        checkpoint_every=0,
        log_every=max(1, steps // 5),
    )


def round_prompts(n: int, per_round: int, seed: int, round_: int) -> list[int]:
    """Indices of the training prompts of round `round_`: `per_round` of `n` without replacement (all `n`
    when `per_round` is 0 or at least `n`), the same for a given (seed, round)."""
    rng = np.random.default_rng([seed, round_, 113])
    if per_round <= 0 or per_round >= n:
        return rng.permutation(n).tolist()
    return rng.choice(n, size=per_round, replace=False).tolist()


def train_expert(
    cfg: ExpertConfig,
    sft_cfg: SFTConfig,
    run: Run,
    max_new_tokens: int = 16,
    timeout_s: float | None = 60.0,
) -> dict:
    """Run `cfg.rounds` rounds of expert iteration on `run.train` (a `Run`: the policy, the data,
    `out_dir`, the seed...); `sft_cfg` gives the fine-tuning's warmup, clip, weight decay and vision
    scale. Answers of at most `max_new_tokens` tokens are scored with `run.reward_fn` (default: the MCQ
    rules; `timeout_s` bounds one call). Per round, `out_dir/metrics.jsonl` gets the kept share, the
    sampled answers' reward and success, the answers scored so far and the seconds spent sampling and
    fine-tuning; each round's fine-tuning logs under `out_dir/rounds/<r>/`. After each round a checkpoint
    goes to `out_dir/checkpoints/expert` (the newest `sft_cfg.keep_checkpoints`); `run.resume` ("", "auto"
    or a checkpoint folder) continues from one, with the same `expert:` settings but any number of rounds.

    `run.turns` (`Turns.of(cfg.env)`) with more than one turn samples `cfg.samples` multi-turn
    trajectories per prompt (`rl.episodes`) and keeps, per prompt and turn, the best answer that succeeded
    at that turn (`select_turns`, `keep=success` only): a turn-2 target is the answer that worked after the
    policy saw its first answer fail; turns after the first sample at `turns.retry_temperature` (when > 0)
    among the tokens `turns.retry_min_p` keeps, and a later turn's video is chosen by `turns.clip`. Every
    executed answer counts in `answers_scored`."""
    check_expert(cfg, run)
    sampling = Sampling(cfg.samples, max_new_tokens, cfg.temperature, timeout_s=timeout_s)
    cadence = Cadence(cfg.rounds, checkpoint_every=1, keep_checkpoints=sft_cfg.keep_checkpoints)
    procs, log = run.procs or Processes(), MetricsLog(run.out_dir / "metrics.jsonl", "expert")
    algo = Expert.build(cfg, sft_cfg, run, sampling)
    return Runner.build(algo, run, cadence, procs, log).run_steps()


def check_expert(cfg: ExpertConfig, run: Run) -> None:
    """Fail before any work on expert settings that cannot run (with these turns), or no prompts."""
    turns = run.turns  # a Turns checked itself when it was made (envs.config.check_turns)
    if turns.n > 1 and cfg.keep != "success":
        raise ValueError(
            f"env.turns={turns.n}: expert iteration over turns keeps successes only; set expert.keep=success"
        )
    if cfg.rounds < 1 or cfg.samples < 1 or cfg.sft_steps < 1 or cfg.sample_batch < 1:
        raise ValueError(
            "expert.rounds, expert.samples, expert.sft_steps and expert.sample_batch must be >= 1"
        )
    if cfg.keep not in KEEP:
        raise ValueError(f"expert.keep={cfg.keep!r}; choose one of {list(KEEP)}")
    if cfg.balance not in BALANCE:
        raise ValueError(f"expert.balance={cfg.balance!r}; choose one of {list(BALANCE)}")
    if cfg.retry_targets not in RETRY_TARGETS:
        raise ValueError(f"expert.retry_targets={cfg.retry_targets!r}; choose one of {list(RETRY_TARGETS)}")
    if cfg.retry_targets != "own" and turns.n < 2:
        raise ValueError(
            f"expert.retry_targets={cfg.retry_targets!r} sets the targets of later turns: set env.turns > 1"
        )
    if cfg.replay and turns.n > 1:
        raise ValueError(
            f"expert.replay keeps single-turn targets, env.turns={turns.n}: "
            "set expert.replay=false or env.turns=1"
        )
    if not run.train:
        raise ValueError("expert iteration: no training prompts")


def expert_settings(cfg: ExpertConfig, run: Run) -> dict:
    """What a round's outcome depends on, besides the policy (`sample_batch` only groups the sampling): a
    checkpoint saves them, and a resumed run must match them."""
    turns = run.turns
    settings = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("rounds", "sample_batch")}
    settings |= {"seed": run.seed, "turns": turns.n, "turn_reward": turns.reward, "words": turns.words}
    settings |= {"retry_temperature": float(turns.retry_temperature), "retry_min_p": float(turns.retry_min_p)}
    return settings | {"turn_clip": turns.clip}


@dataclass
class Round:
    """What one round's sampling gave: its prompts, the kept examples and their target texts, and the
    sampled answers' rewards and successes (overall and per task) and multi-turn statistics."""

    idx: list[int]
    kept: list[Example] = field(default_factory=list)
    targets: dict[str, str] = field(default_factory=dict)
    rewards: list[float] = field(default_factory=list)
    successes: list[float] = field(default_factory=list)
    turn_stats: dict[str, list] = field(default_factory=dict)
    by_task: dict[str, list[float]] = field(default_factory=dict)


@dataclass
class Expert:
    """The expert-iteration round (`embodied.train.runner.Algorithm`): the round's fine-tuning settings
    (`tune`), the sampling settings, the settings a checkpoint pins, the counters (answers scored, examples
    kept, seconds spent before a resume) and, with `replay`, every prompt's latest kept answer. A round trains
    with an optimizer of its own (its SFT), so a checkpoint holds no optimizer state."""

    cfg: ExpertConfig
    run: Run
    tune: SFTConfig
    sampling: Sampling
    settings: dict
    by_id: dict[str, Example]
    scored: int = 0
    kept_total: int = 0
    replayed: dict[str, str] = field(default_factory=dict)
    """replay: prompt id -> its latest kept answer, in the order first kept."""
    before_s: float = 0.0
    t_built: float = field(default_factory=time.perf_counter)
    row: dict = field(default_factory=dict)
    stage, title, unit, optimizer, schedule, modules = "expert", "expert iteration", "round", None, None, None

    @classmethod
    def build(cls, cfg: ExpertConfig, sft_cfg: SFTConfig, run: Run, sampling: Sampling) -> Expert:
        """The round's pieces; the reward defaults to the MCQ rules."""
        return cls(
            cfg=cfg,
            run=dataclasses.replace(run, reward_fn=run.reward_fn or mcq_rewards()),
            tune=round_sft(sft_cfg, cfg.sft_steps, cfg.batch_size, cfg.lr),
            sampling=sampling,
            settings=expert_settings(cfg, run),
            by_id={ex.record["id"]: ex for ex in run.train} if cfg.replay else {},
        )

    @property
    def model(self):
        return self.run.model

    def elapsed(self) -> float:
        """Seconds the run has spent, those before a resume included."""
        return self.before_s + time.perf_counter() - self.t_built

    def load(self, state: dict) -> None:
        """The counters of an expert checkpoint (the runner loaded the weights), which must have been written
        with the same settings and, with `replay`, on the same prompts."""
        old = LATER_SETTINGS | state["expert"]  # a setting added since had its default value then
        if old != self.settings:
            changed = sorted(
                k for k in self.settings.keys() | old.keys() if old.get(k) != self.settings.get(k)
            )
            raise ValueError(
                f"written with other expert settings ({', '.join(changed)}): resume with the same "
                "expert.* (only expert.rounds may change), or start fresh without resume"
            )
        self.scored, self.kept_total = state["scored"], state["kept"]
        self.replayed = dict(state.get("replay", {}))
        if missing := [i for i in self.replayed if i not in self.by_id]:
            raise ValueError(
                f"it replays answers to {len(missing)} prompts not in this training set "
                f"(e.g. {missing[0]!r}): resume on the same data, or start fresh without resume"
            )
        self.before_s, self.t_built = state["elapsed"], time.perf_counter()
        sync_engine(self.run.engine, self.model)  # the checkpoint's weights, not the start's

    def step(self, r: int) -> None:
        """Round `r`: sample and keep, fine-tune on the kept answers, and the round's metrics."""
        t0 = time.perf_counter()
        sampled = self.sample_round(r)
        t1 = time.perf_counter()
        tuned_on = self.fine_tune(r, sampled)
        times = {"time/sample": t1 - t0, "time/sft": time.perf_counter() - t1}
        self.kept_total += len(sampled.kept)
        self.row = self.round_metrics(sampled, tuned_on, times)
        self.row |= sync_engine(self.run.engine, self.model)  # the next round samples the tuned weights

    def report(self, r: int, due: bool, step_s: float) -> dict:
        return self.row

    def postfix(self, row: dict) -> dict:
        return {"kept": f"{row['expert/kept']:.2f}", "r": f"{row['reward/total']:.2f}"}

    def state(self) -> dict:
        """The counters after a round: answers scored, examples kept, seconds spent, the pinned settings and
        (with `replay`) the replayed answers."""
        counters = {"scored": self.scored, "kept": self.kept_total, "elapsed": self.row["time/elapsed"]}
        counters["expert"] = self.settings
        if self.cfg.replay:
            counters["replay"] = self.replayed
        return counters

    def summary(self) -> dict:
        return {"rounds": self.cfg.rounds, "answers_scored": self.scored, "kept": self.kept_total}

    def sample_round(self, r: int) -> Round:
        """Round `r`'s prompts, `sample_batch` at a time: answers sampled and scored, the best kept."""
        run, cfg = self.run, self.cfg
        out = Round(round_prompts(len(run.train), cfg.prompts_per_round, run.seed, r))
        for start in range(0, len(out.idx), cfg.sample_batch):
            chunk = out.idx[start : start + cfg.sample_batch]
            examples, seeds = [run.train[i] for i in chunk], [sampling_seed(run.seed, r, i) for i in chunk]
            policy = (run.model, run.processor, examples, run.video, run.reward_fn)
            if run.turns.n > 1:  # G trajectories per prompt; every turn's answer is executed
                ro = sample_episodes(*policy, run.turns, self.sampling, seeds, run.engine)
                chosen = select_turns(ro, run.turns.words, cfg.retry_targets)
                for name, value in ro.stats.items():
                    out.turn_stats.setdefault(name, []).append((value, len(chunk)))
            else:
                ro = sample_groups(*policy, self.sampling, seeds, engine=run.engine)
                chosen = [
                    (ro.examples[p], ro.texts[i]) for p, i in enumerate(select(ro, cfg.keep)) if i is not None
                ]
            self.scored += len(ro.texts)
            out.rewards += ro.rewards.flatten().tolist()
            for name, ok in task_successes(ro):  # the same rows `reward/success` averages over
                out.successes.append(ok)
                out.by_task.setdefault(name, []).append(ok)
            for ex, text in chosen:
                out.kept.append(ex)
                out.targets[ex.record["id"]] = text
        return out

    def fine_tune(self, r: int, sampled: Round) -> list[Example]:
        """Fine-tune the policy on the round's kept answers (with `replay`, every prompt's latest; with
        `balance`, drawn by task); returns the examples tuned on."""
        cfg, run = self.cfg, self.run
        tune_on, tune_targets = sampled.kept, sampled.targets
        if cfg.replay:  # this round's answers replace a prompt's earlier one; the others stay
            self.replayed.update(sampled.targets)
            tune_on, tune_targets = [self.by_id[i] for i in self.replayed], dict(self.replayed)
        if cfg.balance == "failures" and tune_on:
            tune_on = balanced(tune_on, sampled.by_task, cfg.sft_steps * cfg.batch_size, run.seed * 1000 + r)
        if tune_on:  # nothing verified yet: the policy is left as it is
            tuning = Run(
                run.model, run.processor, tune_on, run.out_dir / "rounds" / str(r), run.video,
                seed=run.seed * 1000 + r, progress=False,
            )  # fmt: skip
            train_sft(self.tune, tuning, target_fn=lambda rec, kept_text=tune_targets: kept_text[rec["id"]])
        self.model.eval()
        return tune_on

    def round_metrics(self, sampled: Round, tuned_on: list[Example], times: dict) -> dict:
        """The round's row of `metrics.jsonl`; `times`: the seconds spent sampling and fine-tuning."""
        cfg, n, kept = self.cfg, len(sampled.idx), sampled.kept
        metrics = {
            # the share of this round's prompts with a kept answer (at most 1); with turns, also the kept
            # examples per prompt: every turn and, with group or better targets, every failed run has one
            "expert/kept": len({prompt_id(ex.record["id"]) for ex in kept}) / n,
            "expert/answers_scored": self.scored,
            "reward/total": float(np.mean(sampled.rewards)),
            **times,
            "time/elapsed": self.elapsed(),
        }
        if sampled.successes:
            metrics["reward/success"] = float(np.mean(sampled.successes))
        if len(sampled.by_task) > 1:  # several tasks in the pool: each one's share of answers that succeeded
            metrics |= {f"expert/success_{k}": float(np.mean(v)) for k, v in sorted(sampled.by_task.items())}
        if cfg.balance != "none" and tuned_on:  # the share of each task in the round's fine-tuning examples
            names = [task_name(ex.record) for ex in tuned_on]
            metrics |= {f"expert/tuned_{t}": names.count(t) / len(names) for t in sorted(set(names))}
        if cfg.replay:
            metrics["expert/replayed"] = len(self.replayed)
        # multi-turn: turns/success@k etc., weighted by prompts
        for name, parts in sampled.turn_stats.items():
            metrics[name] = sum(v * k for v, k in parts) / sum(k for _, k in parts)
        if self.run.turns.n > 1:
            metrics["expert/kept_examples"] = len(kept) / n
            for k in range(1, self.run.turns.n + 1):
                metrics[f"expert/kept_turn{k}"] = sum(len(e.history) == k - 1 for e in kept) / n
        return metrics


def train_expert_config(cfg, run: Run) -> dict:
    """`train_expert` as a whole config (`embodied.config.Config`) asks: its `expert:` rounds, `sft:`
    optimizer settings, `video:`, seed, the routed reward (`rl.rewards.rewards_for`: physics for episodes,
    rules for questions), the `env` turns and GRPO's token budget and reward timeout; `run` gives the
    policy, the prompts, `out_dir`, progress, resume and the config's YAML. `embodied expert` and the
    env-feedback arm both run it."""
    how = {"video": cfg.video, "seed": cfg.seed, "reward_fn": rewards_for(cfg), "turns": Turns.of(cfg.env)}
    run = dataclasses.replace(run, **how)
    return train_expert(cfg.expert, cfg.sft, run, cfg.grpo.max_new_tokens, cfg.grpo.reward_timeout_s)


def answers_scored(cfg, n_train: int) -> int:
    """How many answers `cfg` (an `ExpertConfig`) samples and scores over a run on `n_train` prompts."""
    per_round = n_train if cfg.prompts_per_round <= 0 else min(cfg.prompts_per_round, n_train)
    return cfg.rounds * per_round * cfg.samples
