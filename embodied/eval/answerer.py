"""Where an evaluation's answers come from: a model loaded here (`LocalAnswerer`) or a served one
(`embodied.eval.served.EndpointAnswerer`). The scoring (`embodied.eval.loop`, `embodied.eval.env_loop`,
`embodied.eval.stats`) is written once against this seam, so a served model is measured by the same code
and the same numbers as a local one.

An answerer gives, for records and the clips they are shown with:

* `greedy(records, clips)`: one greedy response per record;
* `sample(records, clips, n, temperature, seeds)`: n sampled responses per record;
* `choice(records, clips, responses)`: forced-choice log-likelihoods per option letter, or None where the
  source cannot give them (a server that returns no log-probs);
* `play(examples, reward_fn, turns, ...)`: multi-turn episodes (`env.turns` > 1), the outcome clip of each
  turn shown at the next, through the one loop `embodied.rl.episodes.play_turns` (its `Episodes`).

A response that could not be obtained (a request that failed after its retries) is an
`embodied.eval.endpoint.Failure` in place of the text; the callers count and list it and never score it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import torch

from embodied.policy.model import completion_logprobs, encode_completions, encode_prompts, repeat_batch
from embodied.policy.sampling import Draw, Engine, Prompts, hf_engine, repeat_prompts
from embodied.questions import LETTERS
from embodied.video import Clip, VideoConfig

if TYPE_CHECKING:
    from embodied.envs.config import Turns
    from embodied.rl.episodes import Episodes

MEDIA = ("auto", "video", "images")
"""`eval.media`: how a clip is shown. `video`: as its record says (a video record as one video, an image
record as its images); `images`: every clip as its frames, one image each; `auto`: `video` for a local
model, `images` through an endpoint (the form every OpenAI-compatible server accepts)."""


def check_media(media: str) -> None:
    if media not in MEDIA:
        raise ValueError(f"eval.media={media!r}; choose one of {list(MEDIA)} (docs/evaluation.md)")


def as_images(record: dict, clip: Clip) -> dict:
    """`record` shown as its clip's frames, one image each (`eval.media=images`): no `video` key, one
    `images` entry per frame (names only; the pixels are the clip's)."""
    out = {k: v for k, v in record.items() if k != "video"}
    out["images"] = [f"frame-{i}" for i in range(len(clip.frames))]
    return out


class Answerer(Protocol):
    """The answer source of an evaluation (see the module docstring)."""

    def greedy(self, records: Sequence[dict], clips: Sequence[Clip]) -> list: ...

    def sample(
        self, records: Sequence[dict], clips: Sequence[Clip], n: int, temperature: float, seeds: Sequence[int]
    ) -> list[list]: ...

    def choice(self, records: Sequence[dict], clips: Sequence[Clip], responses: Sequence) -> list: ...

    def play(
        self,
        examples: Sequence,
        reward_fn,
        turns: Turns,
        group_size: int = 1,
        temperature=None,
        seeds=None,
        first=None,
    ) -> Episodes: ...

    def settings(self) -> dict: ...


def choice_prefix(response: str) -> str:
    """Where forced choice puts the answer: the greedy response up to its first `<answer>` (the
    model's own reasoning), or an empty `<think></think>` (the SFT target's shape) when it has none."""
    cut = response.find("<answer>")
    return response[:cut] if cut >= 0 else "<think></think>"


@torch.no_grad()
def choice_scores(model, processor, batch, records: Sequence[dict], responses: Sequence[str]) -> torch.Tensor:
    """Forced choice: `(B, max options)` log-likelihood of `choice_prefix + <answer>X</answer>` per
    option letter X (-inf past a record's own options). The prefix is the same for every X, so only
    the answer decides; scoring `<answer>X</answer>` right after the prompt would instead ask a trained
    model about a completion it never writes (it starts with `<think>`)."""
    k = max(len(r["options"]) for r in records)
    grouped = repeat_batch(batch, k)
    texts = [f"{choice_prefix(t)}<answer>{LETTERS[j]}</answer>" for t in responses for j in range(k)]
    ids, mask = encode_completions(processor, texts, device=batch["input_ids"].device)
    lp = (completion_logprobs(model, grouped, ids, mask) * mask).sum(1).view(len(records), k)
    for i, r in enumerate(records):
        lp[i, len(r["options"]) :] = -torch.inf
    return lp


@torch.no_grad()
def sampled_responses(engine: Engine, prompts: Prompts, n: int, max_new_tokens: int, temperature: float):
    """`n` responses per prompt of `prompts`, sampled by `engine` at `temperature`: `(B, n)` texts."""
    texts = engine.sample(repeat_prompts(prompts, n), Draw(max_new_tokens, temperature)).texts
    return [texts[i : i + n] for i in range(0, len(texts), n)]


class LocalAnswerer:
    """A model loaded in this process, answered by `engine` (`rollout.engine`; None: Hugging Face `generate`
    on the model). Sampling draws from torch's global generator, as the evaluation always has (its callers
    seed it), so `seeds` are not used; the prompts of the last `greedy` call are reused by `sample` and
    `choice` on the same records (encoding them once). Forced choice is scored by the model itself."""

    def __init__(
        self,
        model,
        processor,
        video: VideoConfig,
        max_new_tokens: int = 48,
        media: str = "auto",
        engine: Engine | None = None,
    ):
        check_media(media)
        self.model, self.processor, self.video = model, processor, video
        self.max_new_tokens, self.images = max_new_tokens, media == "images"
        self.engine = hf_engine(model, processor, engine)
        self._last: tuple[list, Prompts] | None = None

    def _prompts(self, records: Sequence[dict], clips: Sequence[Clip]) -> Prompts:
        key = [(id(r), id(c)) for r, c in zip(records, clips)]  # both live for the whole evaluation
        if self._last is None or self._last[0] != key:
            shown = [as_images(r, c) for r, c in zip(records, clips)] if self.images else list(records)
            device = next(self.model.parameters()).device
            batch = encode_prompts(self.processor, shown, clips, self.video, device)
            prompts = Prompts(batch, shown, [[c] for c in clips], images=self.images, video=self.video)
            self._last = (key, prompts)
        return self._last[1]

    @torch.no_grad()
    def greedy(self, records: Sequence[dict], clips: Sequence[Clip]) -> list[str]:
        return self.engine.sample(self._prompts(records, clips), Draw(self.max_new_tokens)).texts

    def sample(
        self, records, clips, n: int, temperature: float, seeds: Sequence[int] = ()
    ) -> list[list[str]]:
        prompts = self._prompts(records, clips)
        return sampled_responses(self.engine, prompts, n, self.max_new_tokens, temperature)

    def choice(self, records, clips, responses) -> list:
        batch = self._prompts(records, clips).batch
        return list(choice_scores(self.model, self.processor, batch, records, responses).cpu())

    def play(
        self,
        examples: Sequence,
        reward_fn,
        turns: Turns,
        group_size: int = 1,
        temperature=None,
        seeds=None,
        first=None,
    ) -> Episodes:
        """`embodied.rl.episodes.play_turns` on this model (`play`), the loop a served model plays too."""
        from embodied.rl.episodes import play
        from embodied.rl.rollout import Sampling

        if self.images:
            raise ValueError(
                "eval.media=images shows no video, and multi-turn episodes (env.turns > 1) need one"
            )
        args = (self.model, self.processor, examples, self.video, reward_fn, turns)
        sampling = Sampling(group_size, self.max_new_tokens)
        return play(*args, sampling, temperature, seeds, first, engine=self.engine)

    def settings(self) -> dict:
        engine = {} if self.engine.name == "hf" else {"engine": self.engine.name}  # hf: as before engines
        return {"media": "images" if self.images else "video"} | engine
