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
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from embodied.data.load import Example
from embodied.envs import parse, task
from embodied.envs.config import Turns
from embodied.policy.sampling import sync_engine
from embodied.rl.episodes import again, sample_episodes
from embodied.rl.rewards import mcq_rewards, rewards_for
from embodied.rl.rollout import Rollout, Sampling, sample_groups, sampling_seed
from embodied.train.checkpoint import load_checkpoint
from embodied.train.config import ExpertConfig, SFTConfig
from embodied.train.distributed import Processes
from embodied.train.metrics import MetricsLog
from embodied.train.runner import Cadence, Runner
from embodied.train.sft import train_sft
from embodied.train.state import Run

KEEP = ("success", "best")
RETRY_TARGETS = ("own", "group", "better")
BALANCE = ("none", "failures")
BALANCE_FLOOR = 0.1
"""`expert.balance=failures`: a task's weight is its share of failed samples this round plus this floor, so a
task the policy has solved keeps a little of every round's fine-tuning."""
LATER_SETTINGS = {
    "balance": "none",
    "retry_targets": "own",
    "retry_temperature": 0.0,
    "retry_min_p": 0.0,
    "turn_clip": "outcome",
    "replay": False,
}
"""Expert settings added after checkpoints were first written, with the value older runs used."""


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


def task_name(record: dict) -> str:
    """What `expert/success_<task>` and `expert.balance` group by: an episode's task, an MCQ's family."""
    return record.get("task") or record.get("family", "mcq")


def balanced(examples: Sequence[Example], success: dict[str, list[float]], size: int, seed: int) -> list:
    """`expert.balance=failures`: `size` fine-tuning examples drawn from `examples` so that each task's share
    is proportional to its share of this round's samples that failed (`success`: task -> 0/1 per sampled
    answer; a task not sampled this round counts as solved), plus `BALANCE_FLOOR`. A task's examples are
    drawn in shuffled passes (every one before any repeats), seeded by `seed`. One task: `examples` as
    they are."""
    groups: dict[str, list] = {}
    for ex in examples:
        groups.setdefault(task_name(ex.record), []).append(ex)
    if len(groups) < 2:
        return list(examples)
    weight = {t: 1.0 - float(np.mean(success.get(t) or [1.0])) + BALANCE_FLOOR for t in groups}
    total, rng, out = sum(weight.values()), np.random.default_rng(seed), []
    for t in sorted(groups):
        n, group = max(1, round(size * weight[t] / total)), groups[t]
        passes = np.concatenate([rng.permutation(len(group)) for _ in range(-(-n // len(group)))])
        out += [group[i] for i in passes[:n]]
    return out


def task_successes(ro: Rollout) -> list[tuple[str, float]]:
    """Per scored row of `ro` that says whether it succeeded, its prompt's task (`record["task"]`, an MCQ's
    `family`) and 1.0 / 0.0: the training success per task that `expert/success_<task>` logs, so a round on
    several tasks shows which one moves. A multi-turn row is its trajectory's prompt's (`ro.owner`)."""
    G = ro.group_size
    owners = ro.owner.tolist() if ro.owner is not None else range(len(ro.terms))
    out = []
    for row, owner in enumerate(owners):
        if _has_success(ro.terms[row]):
            out.append((task_name(ro.examples[owner // G].record), float(succeeded(ro.terms[row]))))
    return out


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


def select_turns(ro: Rollout, words: bool = False, targets: str = "own") -> list[tuple[Example, str]]:
    """Multi-turn rollouts (`rl.episodes.sample_episodes`): per prompt and turn, the highest-reward
    untruncated answer that succeeded at that turn (ties to the first row), as `(example, answer)`. A turn-k
    example is that trajectory's conversation: the clip and question, its k - 1 failed answers each with the
    words and the clip of its outcome, so fine-tuning on it teaches the answer that worked after seeing them.
    A turn-k record's id gets `/turn<k>` (one target per id).

    `targets="group"` (`expert.retry_targets`) also keeps, for every distinct sequence of failed answers
    that some trajectory of the prompt ran into without then succeeding itself, that conversation with the
    group's best success (any turn) as its target, id `/turn<k>/<j>`: every answer is executed from the
    episode's reset, so the sibling's answer succeeds after those failures too. `targets="better"` keeps the
    same conversations with a nearer target: among the group's executed answers (any turn, untruncated)
    that scored a higher `reward/total` than the last failed answer and are not one of the failed answers,
    the nearest to it by the task's `action_value` (ties: the higher total), success or not. A retry is
    then taught the smallest move that the simulator scored better, a correction of the failed answer,
    where `group` teaches the right answer whatever the failure was."""
    if targets not in RETRY_TARGETS:
        raise ValueError(f"expert.retry_targets={targets!r}; choose one of {list(RETRY_TARGETS)}")
    rows: dict[int, dict[int, int]] = {}  # trajectory -> turn -> row
    for i, (t, k) in enumerate(zip(ro.owner.tolist(), ro.turn.tolist())):
        rows.setdefault(t, {})[k] = i
    ok = lambda i: not bool(ro.truncated[i]) and succeeded(ro.terms[i])  # noqa: E731
    total = lambda i: float(ro.terms[i]["reward/total"])  # noqa: E731
    best: dict[tuple[int, int], int] = {}  # (prompt, turn) -> row
    for t, turns in rows.items():
        for k, i in turns.items():
            key = (t // ro.group_size, k)
            if ok(i) and (key not in best or total(i) > total(best[key])):
                best[key] = i

    def conversation(ex: Example, t: int, k: int, suffix: str) -> Example:
        history = tuple((ro.texts[rows[t][j]], again(ro.terms[rows[t][j]], words)) for j in range(1, k))
        record = ex.record | {"id": f"{ex.record['id']}/turn{k}{suffix}"}
        return Example(record, ex.clip, history, tuple(ro.clips[t][1:k]))

    kept = []
    for (p, k), i in sorted(best.items()):
        ex, t = ro.examples[p], int(ro.owner[i])
        kept.append((conversation(ex, t, k, "") if k > 1 else ex, ro.texts[i]))
    if targets in ("group", "better"):
        for p, ex in enumerate(ro.examples):
            found = [i for (q, _), i in best.items() if q == p]
            success = ro.texts[max(found, key=lambda i: (total(i), -i))] if found else None
            members = [i for t in range(p * ro.group_size, (p + 1) * ro.group_size) for i in rows[t].values()]
            taught = [(int(ro.owner[i]), k) for (q, k), i in best.items() if q == p and k > 1]
            seen = {tuple(ro.texts[rows[t][j]] for j in range(1, k)) for t, k in taught}
            for t in range(p * ro.group_size, (p + 1) * ro.group_size):
                for k in sorted(rows[t])[1:]:  # a later turn: every earlier answer of t failed
                    failed = tuple(ro.texts[rows[t][j]] for j in range(1, k))
                    if failed in seen or ok(rows[t][k]) or any(ok(rows[t][j]) for j in range(1, k)):
                        continue
                    answer = (
                        _nearer_better(ro, ex.record, members, rows[t][k - 1], set(failed))
                        if targets == "better"
                        else success
                    )
                    if answer is None:
                        continue
                    seen.add(failed)
                    kept.append((conversation(ex, t, k, f"/{len(seen)}"), answer))
    return kept


def _nearer_better(ro: Rollout, record: dict, members: list[int], last: int, failed: set[str]) -> str | None:
    """`select_turns(targets="better")`: among rows `members` of one prompt, the answer nearest to row
    `last`'s (by the task's `action_value`) that scored a higher `reward/total`, is untruncated, parses and
    is not in `failed`; ties to the higher total. None if there is none."""
    value = task(record["task"]).action_value
    action = parse(record, ro.texts[last])
    if action is None:
        return None
    score = lambda i: float(ro.terms[i]["reward/total"])  # noqa: E731
    options = {}
    for i in members:
        text = ro.texts[i]
        if bool(ro.truncated[i]) or text in failed or score(i) <= score(last):
            continue
        other = parse(record, text)
        if other is not None:
            options[text] = (abs(value(other) - value(action)), -score(i))
    return min(options, key=options.get) if options else None


def _prompt_id(example_id: str) -> str:
    """The training prompt's id of a kept example: a later turn's conversation adds `/turn<k>[/<j>]` at the
    end (only that suffix is cut, so an id that holds "/turn" elsewhere keeps it)."""
    return re.sub(r"/turn\d+(/\d+)?$", "", example_id)


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

    def resume(self, path: Path) -> dict:
        """Load an expert checkpoint (it must have been written with the same settings)."""
        saved = load_checkpoint(path, self.model)
        old = LATER_SETTINGS | saved["expert"]  # a setting added since had its default value then
        if old != self.settings:
            changed = sorted(
                k for k in self.settings.keys() | old.keys() if old.get(k) != self.settings.get(k)
            )
            raise ValueError(
                f"checkpoint {path} was written with other expert settings ({', '.join(changed)}): resume "
                "with the same expert.* (only expert.rounds may change), or start fresh without resume"
            )
        self.scored, self.kept_total = saved["scored"], saved["kept"]
        self.replayed = dict(saved.get("replay", {}))
        if missing := [i for i in self.replayed if i not in self.by_id]:
            raise ValueError(
                f"checkpoint {path} replays answers to {len(missing)} prompts not in this training set "
                f"(e.g. {missing[0]!r}): resume on the same data, or start fresh without resume"
            )
        self.before_s, self.t_built = saved["elapsed"], time.perf_counter()
        sync_engine(self.run.engine, self.model)  # the checkpoint's weights, not the start's
        return saved

    def step(self, r: int) -> None:
        """Round `r`: sample and keep, fine-tune on the kept answers, and the round's metrics."""
        t0 = time.perf_counter()
        sampled = self.sample_round(r)
        t_sample, t1 = time.perf_counter() - t0, time.perf_counter()
        tuned_on = self.fine_tune(r, sampled)
        self.kept_total += len(sampled.kept)
        self.row = self.round_metrics(sampled, tuned_on, {"time/sample": t_sample, "time/sft": t1})
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
        """The round's row of `metrics.jsonl`; `times`: the seconds spent sampling, and when the
        fine-tuning began."""
        cfg, n, kept = self.cfg, len(sampled.idx), sampled.kept
        metrics = {
            # the share of this round's prompts with a kept answer (at most 1); with turns, also the kept
            # examples per prompt: every turn and, with group or better targets, every failed run has one
            "expert/kept": len({_prompt_id(ex.record["id"]) for ex in kept}) / n,
            "expert/answers_scored": self.scored,
            "reward/total": float(np.mean(sampled.rewards)),
            "time/sample": times["time/sample"],
            "time/sft": time.perf_counter() - times["time/sft"],
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
