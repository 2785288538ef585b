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

One loop plays every multi-turn episode (`play_turns`): GRPO's and expert iteration's rollouts
(`sample_episodes`), `embodied eval` on a local model and on a served one. Only how a batch of
conversations gets its answers differs, an answer source (`AnswerSource`): `Generate` runs the model in
this process, `embodied.eval.served.EndpointAnswerer` sends chat requests. The loop takes the `Turns`
whole, keeps each trajectory's clips, history and totals, draws every row's temperature and seed, scores
the answers and combines a trajectory's turns, so none of that can drift between the two.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from embodied.envs import action_seconds, is_interactive, parse, render_action
from embodied.envs.config import ONE_TURN, TURN_CLIPS, TURN_REWARDS, Turns
from embodied.envs.reward import failed_terms
from embodied.policy.model import concat_batches, encode_conversations
from embodied.policy.sampling import Draw, Engine, Prompts, group_prompts, hf_engine
from embodied.rl.rewards import RewardFn, score
from embodied.rl.rollout import Rollout, Sampling, member_temperatures, sampling_seed
from embodied.video import Clip, VideoConfig

AGAIN = (
    "This is what happened when your answer was executed. Everything is put back as it was at the start. "
    "Answer again, in the same format."
)
"""The words of a later turn's user message (its video is the outcome of the previous answer)."""


def again(terms: dict, words: bool) -> str:
    """A later turn's words: `AGAIN`, and with `words` (`env.turn_words`) first the outcome said in words,
    from the previous turn's failure terms (e.g. "The outcome: short." for push)."""
    if not words:
        return AGAIN
    return f"The outcome: {', '.join(failed_terms(terms)) or 'missed'}. {AGAIN}"


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
    if turn_clip not in TURN_CLIPS:
        raise ValueError(f"env.turn_clip={turn_clip!r}; choose one of {list(TURN_CLIPS)}")
    if turn_clip == "frozen":
        frames = np.repeat(frames[:1], len(frames), axis=0)
    return Clip(frames, video.fps)


@dataclass
class Turn:
    """One turn of a batch of trajectories (trajectory t = prompt t // G, member t % G): what an answer
    source returns (`terms` empty), then scored by `play_turns`. The tensors are a local model's (None from
    a served one); a text that is not a `str` is an answer the source could not obtain (a served request
    that failed, `embodied.eval.endpoint.Failure`)."""

    trajectories: list[int]
    """The trajectory of each row."""
    texts: list
    terms: list[dict]
    batch: object = None
    ids: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    temperature: torch.Tensor | None = None
    truncated: torch.Tensor | None = None
    engine_logprobs: torch.Tensor | None = None
    """The sampling engine's own log-probs of `ids` (None: the engine is the trained model)."""
    version: int = 0
    """The policy version the turn was sampled at."""


@dataclass
class Episodes:
    """What `play_turns` returns: the turns, each trajectory's outcome clips, and the trajectory rewards."""

    examples: list
    group_size: int
    turns: list[Turn]
    clips: list[list[Clip]]
    """Per trajectory: the episode's clip, then the outcome clip of every turn followed by another."""
    rewards: torch.Tensor
    """`(P, G)` trajectory rewards (`trajectory_reward`); NaN for a trajectory in `failed`."""
    failed: dict[int, Any] = field(default_factory=dict)
    """Trajectory -> the answer its source could not obtain (e.g. a `Failure`): the whole trajectory is
    unscored. Always empty for a local model."""

    def per_trajectory(self) -> list:
        """`(text, terms)` of every turn of every trajectory, in turn order; a failed trajectory's entry is
        its failure instead (`failed`)."""
        out: list = [[] for _ in range(self.rewards.numel())]
        for turn in self.turns:
            for t, text, terms in zip(turn.trajectories, turn.texts, turn.terms):
                out[t].append((text, terms))
        return [self.failed.get(t, x) for t, x in enumerate(out)]


def success_after(trajectory: Sequence[tuple[str, dict]], k: int) -> float:
    """1 if one of the first `k` turns succeeded."""
    return float(any(terms.get("reward/success", 0.0) for _, terms in trajectory[:k]))


def episode_stats(episodes: Episodes, turns: Turns) -> dict[str, float]:
    """`turns/success@k` for k up to `turns.n` (share of trajectories solved within k turns), `turns/mean`
    (turns taken = simulator calls, for interactive records), `turns/ended_unparseable` and
    `reward/trajectory`."""
    trajs = episodes.per_trajectory()
    stats = {
        f"turns/success@{k}": float(np.mean([success_after(t, k) for t in trajs]))
        for k in range(1, turns.n + 1)
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
class Ask:
    """One turn's conversations, for an answer source (`AnswerSource`) to answer: row i continues trajectory
    `trajectories[i]` (example t // `group_size`, member t % `group_size`)."""

    k: int
    """The turn, from 1."""
    trajectories: list[int]
    records: list[dict]
    clips: list[list[Clip]]
    """Per row: the episode's clip, then the outcome clip of each earlier turn."""
    history: list[list[tuple[str, str]]]
    """Per row: each earlier turn's `(answer, words of the turn after it)`."""
    temperature: torch.Tensor | None
    """`(rows,)` sampling temperatures; None: greedy."""
    seeds: list[int] | None
    """Per row: the seed of its draw (`sampling_seed(seeds[i], g[, k])`); None: no seeds were given."""
    min_p: float
    """Drop every token below `min_p` times the top token's probability before sampling (0: none)."""
    max_new_tokens: int
    group_size: int


class AnswerSource(Protocol):
    """How a batch of conversations gets its answers, the one part of `play_turns` that differs between a
    model in this process (`Generate`) and a served one (`embodied.eval.served.EndpointAnswerer`)."""

    device: Any
    """Where the trajectory rewards go (the model's device; the CPU for a served model)."""

    def answer(self, ask: Ask) -> Turn:
        """The rows of `ask` answered, in order (`Turn.terms` left empty: `play_turns` scores them)."""
        ...


class Generate:
    """`play_turns`' answer source for a model in this process: its engine (`embodied.policy.sampling`; None:
    Hugging Face `generate` on `model`) at each row's temperature and seed (greedy without temperatures),
    turn 1's prompts encoded once per example and repeated G times, a later turn's as each trajectory's
    conversation (`encode_conversations`)."""

    def __init__(self, model, processor, video: VideoConfig, engine: Engine | None = None):
        self.model, self.processor, self.video = model, processor, video
        self.device = next(model.parameters()).device
        self.engine = hf_engine(model, processor, engine)

    def answer(self, ask: Ask) -> Turn:
        prompts, n = self.encode(ask), ask.max_new_tokens
        if ask.temperature is None:
            out = self.engine.sample(prompts, Draw(n))
            temps = torch.ones(len(ask.trajectories), device=self.device)
        else:
            temps = ask.temperature.to(self.device)
            out = self.engine.sample(prompts, Draw(n, temps, ask.seeds, ask.min_p))
        rows = (list(ask.trajectories), out.texts, [], prompts.batch, out.ids, out.mask, temps, out.truncated)
        return Turn(*rows, out.logprobs, out.version)

    def encode(self, ask: Ask) -> Prompts:
        """Turn 1: the episodes' prompts, each repeated G times; a later turn: each trajectory's
        conversation."""
        G = ask.group_size
        if ask.k == 1:
            first = [c[0] for c in ask.clips[::G]]
            return group_prompts(self.processor, ask.records[::G], first, self.video, self.device, G)
        args = (ask.records, ask.clips, ask.history, self.video, self.device)
        batch = encode_conversations(self.processor, *args)
        return Prompts(batch, list(ask.records), list(ask.clips), list(ask.history), video=self.video)


@dataclass
class _Game:
    """One call of `play_turns`: what every turn reads, and each trajectory's clips, history and totals so
    far (trajectory t = example t // G, member t % G)."""

    examples: Sequence
    video: VideoConfig
    reward_fn: RewardFn
    turns: Turns
    sampling: Sampling
    temperature: torch.Tensor | None
    seeds: Sequence[int] | None

    def __post_init__(self):
        G = self.sampling.group_size
        self.records = [e.record for e in self.examples]
        n = len(self.examples) * G
        self.clips: list[list[Clip]] = [[self.examples[t // G].clip] for t in range(n)]
        self.history: list[list[tuple[str, str]]] = [[] for _ in range(n)]
        self.totals: list[list[float]] = [[] for _ in range(n)]
        self.failed: dict[int, Any] = {}

    def ask(self, k: int, active: list[int]) -> Ask:
        """Turn `k` of the trajectories `active`: their conversations, temperatures (None: greedy;
        `retry_temperature` after the first turn, when set) and seeds (`sampling_seed(seeds[i], g[, k])`,
        None without `seeds`)."""
        G, turns = self.sampling.group_size, self.turns
        temps = None if self.temperature is None else self.temperature[active]
        if temps is not None and k > 1 and turns.retry_temperature > 0:
            temps = torch.full_like(temps, float(turns.retry_temperature))
        seeds = None
        if self.seeds is not None:
            keys = [(self.seeds[t // G], t % G) + ((k,) if k > 1 else ()) for t in active]
            seeds = [sampling_seed(*key) for key in keys]
        recs = [self.records[t // G] for t in active]
        clips, history = [self.clips[t] for t in active], [self.history[t] for t in active]
        min_p, n = (turns.retry_min_p if k > 1 else 0.0), self.sampling.max_new_tokens
        return Ask(k, list(active), recs, clips, history, temps, seeds, min_p, n, G)

    def score(self, turn: Turn) -> Turn:
        """`turn` scored by the reward function (with `sampling.shaping`, `sampling.timeout_s`); a row whose
        answer was not obtained leaves the turn, its trajectory failed."""
        lost = [i for i, x in enumerate(turn.texts) if not isinstance(x, str)]
        if lost:
            if turn.ids is not None:
                raise ValueError("an answer source with token ids lost an answer")
            self.failed |= {turn.trajectories[i]: turn.texts[i] for i in lost}
            keep = [i for i in range(len(turn.texts)) if i not in set(lost)]
            turn = Turn([turn.trajectories[i] for i in keep], [turn.texts[i] for i in keep], [])
        recs = [self.records[t // self.sampling.group_size] for t in turn.trajectories]
        if turn.texts:
            turn.terms = score(self.reward_fn, turn.texts, recs, self.sampling.timeout_s)
        if self.sampling.shaping is not None:
            if turn.mask is None:
                raise ValueError(
                    "reward shaping reads the answers' token counts: this answer source has none"
                )
            self.sampling.shaping(turn.terms, turn.mask.sum(1).cpu(), turn.truncated.cpu())
        return turn

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

    def rewards(self, device) -> torch.Tensor:
        """`(P, G)` trajectory rewards (`turns.reward`), NaN for a failed trajectory."""
        x = [
            math.nan if t in self.failed else trajectory_reward(r, self.turns.reward)
            for t, r in enumerate(self.totals)
        ]
        return torch.tensor(x, device=device).view(len(self.examples), self.sampling.group_size)


@torch.no_grad()
def play_turns(
    source: AnswerSource,
    examples: Sequence,
    video: VideoConfig,
    reward_fn: RewardFn,
    turns: Turns = ONE_TURN,
    sampling: Sampling = DEFAULT_SAMPLING,
    temperature: torch.Tensor | None = None,
    seeds: Sequence[int] | None = None,
    first: tuple[list[str], list[dict]] | None = None,
) -> Episodes:
    """The multi-turn loop: `sampling.group_size` trajectories of up to `turns.n` turns per example
    (`Example`s with video records), each turn's answers from `source` (at most `sampling.max_new_tokens`
    tokens), scored by `reward_fn` (with `sampling.shaping` and `sampling.timeout_s`). Local generation
    (`play`, `sample_episodes`: GRPO, expert iteration, `embodied eval`) and a served endpoint
    (`EndpointAnswerer.play`) both play through it.

    `temperature` is `(P * G,)` per trajectory (None: greedy). With `seeds` (one per example), member g's
    turn 1 is drawn with `sampling_seed(seeds[i], g)`, as `rollout.sample_groups` draws it, and turn k > 1
    with `sampling_seed(seeds[i], g, k)`. `first` gives turn 1's texts and terms already answered (one
    trajectory per example), so only the later turns are asked. `turns` (`Turns.of(cfg.env)`, whole) says
    how: `turns.reward` combines a trajectory's turns; with `turns.words` a later turn's message also says
    the previous outcome in words (`again`); with `turns.retry_temperature` > 0 a sampled turn k > 1 is
    drawn at that temperature instead of its trajectory's, and with `turns.retry_min_p` > 0 only among
    the tokens of at least `retry_min_p` times the top token's probability (greedy play stays greedy);
    `turns.clip` (`TURN_CLIPS`) is what a later turn's video shows. A trajectory one of whose answers the
    source could not obtain stops there, unscored (`Episodes.failed`).
    """
    game = _Game(examples, video, reward_fn, turns, sampling, temperature, seeds)
    G, n = sampling.group_size, len(examples) * sampling.group_size
    active, done = list(range(n)), []
    for k in range(1, turns.n + 1):
        if k == 1 and first is not None:
            if G != 1 or len(first[0]) != n:
                raise ValueError("play_turns: `first` gives one answered turn per example (group_size 1)")
            turn = Turn(list(active), list(first[0]), [dict(x) for x in first[1]])
        else:
            turn = game.score(source.answer(game.ask(k, active)))
        done.append(turn)
        active = game.advance(turn, k)
        if not active:
            break
    return Episodes(list(examples), G, done, game.clips, game.rewards(source.device), game.failed)


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
    engine: Engine | None = None,
) -> Episodes:
    """`play_turns` on a model in this process (`Generate`, through `engine`; None: Hugging Face)."""
    source = Generate(model, processor, video, engine)
    return play_turns(source, examples, video, reward_fn, turns, sampling, temperature, seeds, first)


def sample_episodes(
    model,
    processor,
    examples: Sequence,
    video: VideoConfig,
    reward_fn: RewardFn,
    turns: Turns,
    sampling: Sampling,
    seeds: Sequence[int] | None = None,
    engine: Engine | None = None,
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
    ep = play(model, processor, examples, video, reward_fn, turns, sampling, temps, seeds, engine=engine)
    return to_rollout(ep, processor, turns)


def to_rollout(ep: Episodes, processor, turns: Turns) -> Rollout:
    """The turns of `ep`, played under `turns`, as one `Rollout` (completions right-padded to the longest,
    prompts left-padded; `stats` its `episode_stats`)."""
    parts = ep.turns
    pad = processor.tokenizer.pad_token_id
    width = max(p.ids.shape[1] for p in parts)

    def right(x: torch.Tensor, value: int) -> torch.Tensor:
        return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)

    batch = parts[0].batch if len(parts) == 1 else concat_batches([p.batch for p in parts], pad)
    device = parts[0].ids.device
    owner = torch.tensor([t for p in parts for t in p.trajectories], device=device)
    turn = torch.tensor([k + 1 for k, p in enumerate(parts) for _ in p.trajectories], device=device)
    engine_lp = None
    if all(p.engine_logprobs is not None for p in parts):
        engine_lp = torch.cat([right(p.engine_logprobs, 0) for p in parts])
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
        engine_logprobs=engine_lp,
        version=parts[0].version,
    )
