"""Multi-turn episodes (`env.turns`): answer, watch what the answer did in the simulator, answer again.

Turn 1 is the single-turn prompt: the episode's clip and question. When a turn's answer is executed and
does not succeed, the trajectory's next turn is its own prompt: the conversation so far (the clip and
question, each earlier answer as an assistant message, each earlier outcome as a user message holding the
clip of that answer's simulation, rendered at `video.fps` with as many frames as the episode's clip and of
its size (`outcome_clip`), and `AGAIN`), and the policy answers again; every answer is executed from the
episode's reset state.

A trajectory ends at a success (the task is done), at an answer that cannot be parsed (its turn scores the
unparseable penalty, `embodied.envs.reward`), at a record that is not interactive (an MCQ has one turn),
or after `turns` turns. So it costs at most `turns` simulator calls, as best-of-`turns` does.

Reward terms are per turn (each row keeps its own turn's terms); the trajectory's reward, which GRPO
normalises within the G trajectories of a prompt, combines them (`TURN_REWARDS`):

* ``last``: the total of the trajectory's last turn, i.e. where the episode ended: solved (a success
  total), the final attempt's outcome, or the unparseable penalty. A solve at turn 1 and at turn 2 tie,
  so a probing first strike is not punished.
* ``mean``: the mean total of the turns taken: a solve at turn 1 beats a solve at turn 2.

Every turn is a row of the GRPO batch whose completion tokens get its trajectory's advantage
(`Rollout.owner`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from embodied.envs import action_seconds, is_interactive, parse, render_action
from embodied.envs.config import ONE_TURN, Turns
from embodied.policy.model import (
    concat_batches,
    decode,
    encode_conversations,
    encode_prompts,
    eos_token_ids,
    generate,
    repeat_batch,
)
from embodied.rl.rewards import RewardFn, score
from embodied.rl.rollout import Rollout, Sampling, member_temperatures, sampling_seed
from embodied.video import Clip, VideoConfig

AGAIN = (
    "This is what happened when your answer was executed. Everything is put back as it was at the start. "
    "Answer again, in the same format."
)
"""The words of a later turn's user message (its video is the outcome of the previous answer)."""
TURN_REWARDS = ("last", "mean")
TURN_CLIPS = ("outcome", "frozen")
"""What a later turn's video shows (`env.turn_clip`): ``outcome``, the previous answer's simulation;
``frozen``, that simulation's first frame (the scene at the reset) held for as many frames: the same
scene, size and length with nothing of what the answer did, the control that tells whether a second look
uses what it sees."""


def again(terms: dict, words: bool) -> str:
    """A later turn's words: `AGAIN`, and with `words` (`env.turn_words`) first the outcome said in words,
    from the previous turn's failure terms (e.g. "The outcome: short." for push)."""
    if not words:
        return AGAIN
    failed = [k.split("/", 1)[1] for k, v in terms.items() if v < 0 and k != "reward/total"]
    return f"The outcome: {', '.join(failed) or 'missed'}. {AGAIN}"


def check_turns(turns: int, turn_reward: str) -> None:
    """Fail at once on `env.turns` < 1 or an unknown `env.turn_reward`."""
    if not isinstance(turns, int) or turns < 1:
        raise ValueError(f"env.turns={turns!r}: the number of turns per episode must be an integer >= 1")
    if turn_reward not in TURN_REWARDS:
        raise ValueError(f"env.turn_reward={turn_reward!r}; choose one of {list(TURN_REWARDS)}")


def check_turn_clip(turn_clip: str) -> None:
    """Fail at once on an unknown `env.turn_clip`."""
    if turn_clip not in TURN_CLIPS:
        raise ValueError(f"env.turn_clip={turn_clip!r}; choose one of {list(TURN_CLIPS)}")


def check_env_turns(env) -> None:
    """Check the multi-turn settings of an `EnvConfig` (or a `Turns` value) up front: `turns`,
    `turn_reward`, `turn_clip` and `retry_*` must be valid, and the settings of later turns are refused with
    `turns` = 1 (they would be ignored)."""
    t = env if isinstance(env, Turns) else Turns.of(env)
    check_turns(t.n, t.reward)
    check_turn_clip(t.clip)
    check_retry_sampling(t.retry_temperature, t.retry_min_p)
    if t.n == 1:
        keys = {"words": "turn_words", "clip": "turn_clip", "retry_temperature": "retry_temperature"}
        keys["retry_min_p"] = "retry_min_p"  # the later-turn fields of `Turns` and their `env.` names
        changed = [f for f in keys if getattr(t, f) != getattr(ONE_TURN, f)]
        if given := [f"env.{keys[f]}={getattr(t, f)!r}" for f in changed]:
            raise ValueError(
                f"{', '.join(given)}: set(s) the turns after the first, and env.turns=1 plays none: set "
                "env.turns > 1, or leave them at their defaults"
            )


def check_retry_sampling(temperature: float, min_p: float = 0.0) -> None:
    """Fail at once on a bad `env.retry_temperature` (< 0) or `env.retry_min_p` (outside [0, 1))."""
    number = lambda v: not isinstance(v, bool) and isinstance(v, (int, float))  # noqa: E731
    if not number(temperature) or not temperature >= 0:
        raise ValueError(
            f"env.retry_temperature={temperature!r}: the sampling temperature of turns after the first must "
            "be >= 0 (0: each trajectory keeps its own temperature)"
        )
    if not number(min_p) or not 0 <= min_p < 1:
        raise ValueError(f"env.retry_min_p={min_p!r}: must be in [0, 1) (0: no truncation)")


def trajectory_reward(totals: Sequence[float], turn_reward: str) -> float:
    """The reward of a trajectory from its turns' `reward/total` (see the module docstring)."""
    if turn_reward == "last":
        return float(totals[-1])
    if turn_reward == "mean":
        return float(np.mean(totals))
    raise ValueError(f"env.turn_reward={turn_reward!r}; choose one of {list(TURN_REWARDS)}")


def continues(record: dict, terms: dict) -> bool:
    """Whether a trajectory goes on after a turn scored `terms`: an interactive episode whose answer was
    executed (parsed) and did not succeed."""
    return is_interactive(record) and not terms.get("reward/unparseable") and not terms.get("reward/success")


def outcome_clip(record: dict, text: str, video: VideoConfig, like: Clip, turn_clip: str = "outcome") -> Clip:
    """The clip of executing the answer `text` from the reset, the size of the episode's clip `like`: as
    many frames of its height and width, at `video.fps` from 0 s (fewer if the execution ends sooner).
    `turn_clip="frozen"` holds its first frame for as many frames (`TURN_CLIPS`).

    The same frame count keeps a later turn's visual tokens at twice the first's, not more (GRPO's update
    runs every later-turn prompt's clips through the vision tower); at 2 fps the 4 frames of the shipped
    episodes show 0-1.5 s, by when push's puck has stopped in most episodes (see docs/environments.md)."""
    action = parse(record, text)
    if action is None:
        raise ValueError(f"record {record.get('id', '?')}: no outcome to show for an unparseable answer")
    seconds = action_seconds(record, action)
    n = min(len(like.frames), math.floor(seconds * video.fps + 1e-6) + 1)
    height, width = like.frames.shape[1:3]
    _, frames = render_action(record, action, np.arange(n) / video.fps, width, height)
    if turn_clip == "frozen":
        frames = np.repeat(frames[:1], len(frames), axis=0)
    elif turn_clip != "outcome":
        check_turn_clip(turn_clip)
    return Clip(frames, video.fps)


@dataclass
class Turn:
    """One turn of a batch of trajectories (trajectory t = prompt t // G, member t % G)."""

    trajectories: list[int]
    """The trajectory of each row."""
    texts: list[str]
    terms: list[dict]
    batch: object = None
    ids: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    temperature: torch.Tensor | None = None
    truncated: torch.Tensor | None = None


@dataclass
class Episodes:
    """What `play` returns: the turns, each trajectory's outcome clips, and the trajectory rewards."""

    examples: list
    group_size: int
    turns: list[Turn]
    clips: list[list[Clip]]
    """Per trajectory: the episode's clip, then the outcome clip of every turn followed by another."""
    rewards: torch.Tensor
    """`(P, G)` trajectory rewards (`trajectory_reward`)."""

    def per_trajectory(self) -> list[list[tuple[str, dict]]]:
        """`(text, terms)` of every turn of every trajectory, in turn order."""
        out: list[list[tuple[str, dict]]] = [[] for _ in range(self.rewards.numel())]
        for turn in self.turns:
            for t, text, terms in zip(turn.trajectories, turn.texts, turn.terms):
                out[t].append((text, terms))
        return out


def success_after(trajectory: Sequence[tuple[str, dict]], k: int) -> float:
    """1 if one of the first `k` turns succeeded."""
    return float(any(terms.get("reward/success", 0.0) for _, terms in trajectory[:k]))


def episode_stats(episodes: Episodes, turns: int) -> dict[str, float]:
    """`turns/success@k` (share of trajectories solved within k turns), `turns/mean` (turns taken = simulator
    calls, for interactive records), `turns/ended_unparseable` and `reward/trajectory`."""
    trajs = episodes.per_trajectory()
    stats = {
        f"turns/success@{k}": float(np.mean([success_after(t, k) for t in trajs]))
        for k in range(1, turns + 1)
    }
    stats["turns/mean"] = float(np.mean([len(t) for t in trajs]))
    stats["turns/ended_unparseable"] = float(
        np.mean([bool(t[-1][1].get("reward/unparseable")) for t in trajs])
    )
    stats["reward/trajectory"] = float(episodes.rewards.mean())
    return stats


DEFAULT_SAMPLING = Sampling()
"""`play`'s default sampling settings: one trajectory per example, 48 new tokens a turn."""


@dataclass
class _Game:
    """One call of `play`: what every turn reads, and each trajectory's clips, history and totals so far
    (trajectory t = example t // G, member t % G)."""

    model: Any
    processor: Any
    examples: Sequence
    video: VideoConfig
    reward_fn: RewardFn
    turns: Turns
    sampling: Sampling
    temperature: torch.Tensor | None
    seeds: Sequence[int] | None

    def __post_init__(self):
        G, self.device = self.sampling.group_size, next(self.model.parameters()).device
        self.records = [e.record for e in self.examples]
        n = len(self.examples) * G
        self.clips: list[list[Clip]] = [[self.examples[t // G].clip] for t in range(n)]
        self.history: list[list[tuple[str, str]]] = [[] for _ in range(n)]
        self.totals: list[list[float]] = [[] for _ in range(n)]
        self.eos = torch.tensor(eos_token_ids(self.model, self.processor), device=self.device)

    def answer(self, k: int, active: list[int]) -> Turn:
        """Turn `k` of the trajectories `active`: their prompts encoded, answered and scored."""
        recs = [self.records[t // self.sampling.group_size] for t in active]
        batch = self.encode(k, active, recs)
        temps, row_seeds = self.temperatures(k, active)
        if temps is None:
            ids, mask = generate(
                self.model, self.processor, batch, self.sampling.max_new_tokens, do_sample=False
            )
            temps = torch.ones(len(active), device=self.device)
        else:
            min_p = self.turns.retry_min_p if k > 1 else 0.0
            ids, mask = generate(
                self.model,
                self.processor,
                batch,
                self.sampling.max_new_tokens,
                temps,
                seeds=row_seeds,
                min_p=min_p,
            )
        texts = decode(self.processor, ids, mask)
        terms = score(self.reward_fn, texts, recs, self.sampling.timeout_s)
        truncated = ~torch.isin(ids, self.eos).any(1)
        if self.sampling.shaping is not None:
            self.sampling.shaping(terms, mask.sum(1).cpu(), truncated.cpu())
        return Turn(list(active), texts, terms, batch, ids, mask, temps, truncated)

    def encode(self, k: int, active: list[int], recs: list[dict]):
        """Turn 1: the episodes' prompts, each repeated G times; a later turn: each trajectory's
        conversation."""
        G = self.sampling.group_size
        if k == 1:
            clips = [e.clip for e in self.examples]
            return repeat_batch(encode_prompts(self.processor, recs[::G], clips, self.video, self.device), G)
        args = ([self.clips[t] for t in active], [self.history[t] for t in active])
        return encode_conversations(self.processor, recs, *args, self.video, self.device)

    def temperatures(self, k: int, active: list[int]) -> tuple[torch.Tensor | None, list[int] | None]:
        """Turn `k`'s per-row temperatures (None: greedy; `retry_temperature` after the first turn, when set)
        and seeds (`sampling_seed(seeds[i], g[, k])`, None without `seeds`)."""
        temps = None if self.temperature is None else self.temperature[active].to(self.device)
        if temps is not None and k > 1 and self.turns.retry_temperature > 0:
            temps = torch.full_like(temps, float(self.turns.retry_temperature))
        if self.seeds is None:
            return temps, None
        G = self.sampling.group_size
        keys = [(self.seeds[t // G], t % G) + ((k,) if k > 1 else ()) for t in active]
        return temps, [sampling_seed(*key) for key in keys]

    def advance(self, turn: Turn, k: int) -> list[int]:
        """Record turn `k`'s totals; the trajectories that go on (an executed answer that did not succeed),
        each given its answer's outcome clip and the words of the next turn."""
        going = []
        for t, text, terms in zip(turn.trajectories, turn.texts, turn.terms):
            self.totals[t].append(float(terms["reward/total"]))
            rec = self.records[t // self.sampling.group_size]
            if k < self.turns.n and continues(rec, terms):
                self.clips[t].append(outcome_clip(rec, text, self.video, self.clips[t][0], self.turns.clip))
                self.history[t].append((text, again(terms, self.turns.words)))
                going.append(t)
        return going


@torch.no_grad()
def play(
    model,
    processor,
    examples: Sequence,
    video: VideoConfig,
    reward_fn: RewardFn,
    turns: Turns = ONE_TURN,
    sampling: Sampling = DEFAULT_SAMPLING,
    temperature: torch.Tensor | None = None,
    seeds: Sequence[int] | None = None,
    first: tuple[list[str], list[dict]] | None = None,
) -> Episodes:
    """`sampling.group_size` trajectories of up to `turns.n` turns per example (`Example`s with video
    records), each answer at most `sampling.max_new_tokens` tokens, scored by `reward_fn` (with
    `sampling.shaping` and `sampling.timeout_s`).

    `temperature` is `(P * G,)` per trajectory (None: greedy). With `seeds` (one per example), member g's
    turn 1 is drawn with `sampling_seed(seeds[i], g)`, as `rollout.sample_groups` draws it, and turn k > 1
    with `sampling_seed(seeds[i], g, k)`. `first` gives turn 1's texts and terms already answered (one
    trajectory per example), so only the later turns are generated. `turns` (`Turns.of(cfg.env)`) says
    how: `turns.reward` combines a trajectory's turns; with `turns.words` a later turn's message also says
    the previous outcome in words (`again`); with `turns.retry_temperature` > 0 a sampled turn k > 1 is
    drawn at that temperature instead of its trajectory's, and with `turns.retry_min_p` > 0 only among
    the tokens of at least `retry_min_p` times the top token's probability (greedy play stays greedy);
    `turns.clip` (`TURN_CLIPS`) is what a later turn's video shows.
    """
    check_turns(turns.n, turns.reward)
    check_turn_clip(turns.clip)
    check_retry_sampling(turns.retry_temperature, turns.retry_min_p)
    game = _Game(model, processor, examples, video, reward_fn, turns, sampling, temperature, seeds)
    G, n = sampling.group_size, len(examples) * sampling.group_size
    active, done = list(range(n)), []
    for k in range(1, turns.n + 1):
        if k == 1 and first is not None:
            if G != 1 or len(first[0]) != n:
                raise ValueError("play: `first` gives one answered turn per example (group_size 1)")
            turn = Turn(list(active), list(first[0]), [dict(x) for x in first[1]])
        else:
            turn = game.answer(k, active)
        done.append(turn)
        active = game.advance(turn, k)
        if not active:
            break
    rewards = torch.tensor([trajectory_reward(x, turns.reward) for x in game.totals], device=game.device)
    return Episodes(list(examples), G, done, game.clips, rewards.view(len(examples), G))


def sample_episodes(
    model,
    processor,
    examples: Sequence,
    video: VideoConfig,
    reward_fn: RewardFn,
    turns: Turns,
    sampling: Sampling,
    seeds: Sequence[int] | None = None,
) -> Rollout:
    """`rollout.sample_groups` for multi-turn episodes: `sampling.group_size` sampled trajectories per
    example, every turn a row (turn 1's rows first, prompt-major, then each later turn's), `rewards` the
    `(P, G)` trajectory rewards and `owner` each row's trajectory, whose advantage its tokens get. Turns
    after the first sample at `turns.retry_temperature` when it is > 0 (among the tokens
    `turns.retry_min_p` keeps); every row's log-probs are taken at the temperature it was drawn at, over
    the whole vocabulary."""
    G = sampling.group_size
    temps = member_temperatures(sampling.temperature, list(sampling.temperatures), len(examples), G)
    model.eval()
    ep = play(model, processor, examples, video, reward_fn, turns, sampling, temps, seeds)
    return to_rollout(ep, processor, turns.n)


def to_rollout(ep: Episodes, processor, turns: int) -> Rollout:
    """The turns of `ep` as one `Rollout` (completions right-padded to the longest, prompts left-padded)."""
    parts = ep.turns
    pad = processor.tokenizer.pad_token_id
    width = max(p.ids.shape[1] for p in parts)

    def right(x: torch.Tensor, value: int) -> torch.Tensor:
        return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)

    batch = parts[0].batch if len(parts) == 1 else concat_batches([p.batch for p in parts], pad)
    device = parts[0].ids.device
    owner = torch.tensor([t for p in parts for t in p.trajectories], device=device)
    turn = torch.tensor([k + 1 for k, p in enumerate(parts) for _ in p.trajectories], device=device)
    return Rollout(
        examples=ep.examples,
        batch=batch,
        ids=torch.cat([right(p.ids, pad) for p in parts]),
        mask=torch.cat([right(p.mask, 0) for p in parts]),
        temperature=torch.cat([p.temperature for p in parts]),
        texts=[x for p in parts for x in p.texts],
        terms=[x for p in parts for x in p.terms],
        rewards=ep.rewards,
        truncated=torch.cat([p.truncated for p in parts]),
        owner=owner,
        turn=turn,
        clips=ep.clips,
        stats=episode_stats(ep, turns),
    )
