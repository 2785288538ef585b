"""A served model as an evaluation's answer source (`eval.endpoint`): the same question text and the same
sampled frames as a local model gets, sent as OpenAI chat requests (`embodied.eval.endpoint` sends them).

What a request holds, and why:

* The messages a local prompt is made of (`embodied.policy.model.prompt_text` / `conversation_text`): the
  clip, then the question text (`embodied.questions.format_question`); on a later turn of an episode each
  earlier answer as an assistant message and a user message with that answer's outcome clip and the words
  of `embodied.rl.episodes.again`. No system message: the server's chat template adds its default, as the
  local one does.
* The clip's frames exactly as sampled for the local model (`video.fps`, `video.max_frames`, at the size
  they were loaded), losslessly: each frame a PNG data URL (`image_url`), or with `eval.media=video` one
  lossless H.264 RGB mp4 data URL (`video_url`, an extension that vLLM and `transformers serve` read) at
  the clip's rate.
* The pixel budget as `chat_template_kwargs.processor_kwargs` (`eval.processor_kwargs`): the size limits
  `embodied.policy.model.media_kwargs` gives the local processor, and for a video `do_sample_frames=False`
  (the frames are already sampled; `transformers serve` would otherwise ask for 32). `transformers serve`
  passes them to the processor; another server may ignore or refuse them.
* Greedy requests at temperature 0; sampled ones at `eval.temperature` with `top_p` 1, a seed per question
  and sample (so a rerun sends the same requests and hits the cache) and, where the server takes extra
  fields (`eval.processor_kwargs`), `do_sample` and `top_k` (the whole vocabulary, as the local sampler
  draws). `transformers serve` refuses those two and gets them as `generation_config`
  (`embodied.eval.endpoint`): without it, it sets the temperature but not `do_sample` and answers greedily.
  A server whose samples are still identical is caught (`EndpointAnswerer.check_sampling`) and the sampled
  figures are reported unavailable, never as numbers.
* With `eval.media=video`, a video record goes as one lossless mp4: a `data:` URL, or (`eval.video_url`
  `file`, the default for a server on this machine) the path of the mp4 written under the cache folder,
  for servers whose video loader refuses `data:` URLs (`transformers serve` reads http(s) URLs and paths).
"""

from __future__ import annotations

import base64
import hashlib
import io
from collections.abc import Sequence
from fractions import Fraction
from urllib.parse import urlsplit

import numpy as np

from embodied.envs.config import Turns
from embodied.eval.answerer import check_media
from embodied.eval.endpoint import EndpointClient, Failure
from embodied.eval.reading import END_MARKERS
from embodied.questions import LETTERS, format_question
from embodied.rl.episodes import Ask, Episodes, Turn, play_turns
from embodied.rl.rollout import Sampling, sampling_seed
from embodied.video import Clip, VideoConfig, encode_png, frame_pixel_cap

VIDEO_URLS = ("auto", "data", "file")
"""`eval.video_url`: how a video travels with `eval.media=video`: a `data:` URL, or the path of a file
written under the cache folder (for a server on this machine whose loader refuses `data:` URLs); `auto`:
`file` for a server on 127.0.0.1 / localhost, `data` otherwise."""
PROBES = 3
"""Requests of the sampling probe (`EndpointAnswerer.check_sampling`)."""
TOP_LOGPROBS = 20
"""Alternatives asked per token when log-probs are requested (the OpenAI API's maximum)."""


def png_url(frame: np.ndarray) -> str:
    """A frame `(H, W, 3)` uint8 as a lossless PNG data URL."""
    return "data:image/png;base64," + base64.b64encode(encode_png(frame)).decode()


def mp4_url(clip: Clip) -> str:
    """A clip as a lossless mp4 data URL: H.264 in RGB (`libx264rgb`, crf 0), so the decoded frames equal the
    clip's pixel for pixel, at the clip's frame rate (the server reads the rate from the file)."""
    import av

    buf = io.BytesIO()
    h, w = clip.frames.shape[1:3]
    with av.open(buf, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264rgb", rate=Fraction(clip.fps).limit_denominator(1000))
        stream.width, stream.height, stream.pix_fmt = w, h, "rgb24"
        stream.options = {"crf": "0", "preset": "veryfast"}
        stream.codec_context.thread_count = 1
        for f in clip.frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(f), format="rgb24")))
        container.mux(stream.encode())
    return "data:video/mp4;base64," + base64.b64encode(buf.getvalue()).decode()


def response_text(response: dict | Failure) -> str | Failure:
    """The assistant's text as the local decode gives it, up to whitespace at the edges of the parts. A
    streamed answer arrives rebuilt in `content` (`embodied.eval.reading.rebuild_text`, every region in
    order). A non-streamed one from a server that splits `<think>...</think>` into `reasoning_content`
    (transformers serve does for Qwen models, keeping only the last region of each kind) gets it put back in
    front; one that never closed (the parser then keeps the end-of-turn token in it) goes back unclosed. An
    empty `<think></think>` is dropped by the server either way and cannot be restored."""
    if isinstance(response, Failure):
        return response
    message = response["choices"][0].get("message") or {}
    content = message.get("content") or ""
    reasoning = message.get("reasoning_content", message.get("reasoning"))
    if reasoning is None:
        return content
    for end in END_MARKERS:
        if reasoning.rstrip().endswith(end):
            return f"<think>{reasoning.rstrip()[: -len(end)]}{content}"
    return f"<think>{reasoning}</think>{content}"


def choice_from_logprobs(response: dict | Failure, n_options: int) -> list[float] | None:
    """Forced choice from a greedy response's token log-probs: the log-prob of each option letter at the first
    token after the response's `<answer>` (-inf for a letter not among the returned alternatives). None when
    the server returned no log-probs or the response has no `<answer>` (the local forced choice then scores
    after an empty `<think></think>`, which a chat endpoint cannot be asked to do)."""
    if isinstance(response, Failure):
        return None
    tokens = ((response["choices"][0].get("logprobs") or {}).get("content")) or []
    text = "".join(t.get("token", "") for t in tokens)
    cut = text.find("<answer>")
    if not tokens or cut < 0:
        return None
    start, pos = cut + len("<answer>"), 0
    for t in tokens:
        if pos >= start:
            scores = [-float("inf")] * n_options
            for alt in t.get("top_logprobs") or [t]:
                word = alt.get("token", "").strip()
                if word in LETTERS[:n_options]:
                    j = LETTERS.index(word)
                    scores[j] = max(scores[j], float(alt["logprob"]))
            return scores if max(scores) > -float("inf") else None
        pos += len(t.get("token", ""))
    return None


class EndpointAnswerer:
    """`embodied.eval.answerer.Answerer` over an `EndpointClient` (see the module docstring), and the answer
    source of multi-turn episodes played through it (`embodied.rl.episodes.AnswerSource`: `answer`)."""

    device = "cpu"
    """Where `play_turns` puts the trajectory rewards."""

    def __init__(
        self,
        client: EndpointClient,
        video: VideoConfig,
        max_new_tokens: int = 48,
        media: str = "auto",
        processor_kwargs: bool = True,
        logprobs: bool = False,
        video_url: str = "auto",
    ):
        check_media(media)
        if video_url not in VIDEO_URLS:
            raise ValueError(f"eval.video_url={video_url!r}; choose one of {list(VIDEO_URLS)}")
        self.client, self.video, self.max_new_tokens = client, video, max_new_tokens
        self.media = "images" if media == "auto" else media
        self.processor_kwargs, self.logprobs = processor_kwargs, logprobs
        host = urlsplit(client.url).hostname or ""
        local = host in ("127.0.0.1", "localhost", "::1")
        self.video_url = ("file" if local else "data") if video_url == "auto" else video_url
        self.sampling = ""
        """Why sampled figures are unavailable (`check_sampling`), or "" while the server samples."""
        self._urls: dict[int, list[dict]] = {}
        self._greedy: dict[tuple[int, int], dict | Failure] = {}

    def _video_part(self, clip: Clip) -> dict:
        """A clip as one lossless mp4 `video_url`: a data URL, or the path of the file under the cache."""
        url = mp4_url(clip)
        if self.video_url == "file":
            data = base64.b64decode(url.split(",", 1)[1])
            path = self.client.cache.root / "videos" / f"{hashlib.sha256(data).hexdigest()[:24]}.mp4"
            if not path.is_file():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
            url = str(path.resolve())
        return {"type": "video_url", "video_url": {"url": url}}

    def _parts(self, record: dict, clip: Clip) -> list[dict]:
        """The content parts showing `clip` (encoded once per clip object)."""
        if id(clip) not in self._urls:
            if len(self._urls) > 4096:
                self._urls.clear()
            if self.media == "video" and "video" in record:
                self._urls[id(clip)] = [self._video_part(clip)]
            else:
                self._urls[id(clip)] = [
                    {"type": "image_url", "image_url": {"url": png_url(f)}} for f in clip.frames
                ]
        return self._urls[id(clip)]

    def _body(
        self,
        record: dict,
        clips: Sequence[Clip],
        history: Sequence,
        temperature: float,
        seed=None,
        tokens=None,
    ):
        """One chat request: `clips[0]` and the question, then each earlier `(answer, words)` of `history`
        with the next clip; at most `tokens` new tokens (None: `max_new_tokens`)."""
        text = format_question(record["question"], record["options"], record.get("instruction"))
        messages = [
            {"role": "user", "content": [*self._parts(record, clips[0]), {"type": "text", "text": text}]}
        ]
        for (answer, words), clip in zip(history, clips[1:]):
            messages.append({"role": "assistant", "content": answer})
            messages.append(
                {"role": "user", "content": [*self._parts(record, clip), {"type": "text", "text": words}]}
            )
        body: dict = {
            "messages": messages,
            "max_tokens": self.max_new_tokens if tokens is None else tokens,
            "temperature": float(temperature),
        }
        if temperature > 0:
            body |= {"top_p": 1.0, "seed": int(seed) % 2**31}
            if self.processor_kwargs:  # the server takes extra fields: ask it to sample, whole vocabulary
                body |= {"do_sample": True, "top_k": -1}
        elif self.logprobs:
            body |= {"logprobs": True, "top_logprobs": TOP_LOGPROBS}
        if self.processor_kwargs:
            body["chat_template_kwargs"] = {"processor_kwargs": self._processor_kwargs(record, clips)}
        return body

    def _processor_kwargs(self, record: dict, clips: Sequence[Clip]) -> dict:
        """The pixel budget `media_kwargs` gives the local processor, for the kind of parts sent."""
        size = {"shortest_edge": self.video.min_pixels}
        cap = frame_pixel_cap(max(len(c.frames) for c in clips), self.video)
        if self.media == "video" and "video" in record:
            return {"do_sample_frames": False, "videos_kwargs": {"size": size | {"longest_edge": cap}}}
        return {"images_kwargs": {"size": size | {"longest_edge": cap}}}

    def greedy(self, records: Sequence[dict], clips: Sequence[Clip]) -> list:
        bodies = [self._body(r, [c], [], 0.0) for r, c in zip(records, clips)]
        responses = self.client.complete(bodies)
        self._greedy = {(id(r), id(c)): x for r, c, x in zip(records, clips, responses)}
        return [response_text(x) for x in responses]

    def sample(self, records, clips, n: int, temperature: float, seeds: Sequence[int]) -> list[list]:
        bodies = [
            self._body(r, [c], [], temperature, sampling_seed(s, j))
            for r, c, s in zip(records, clips, seeds)
            for j in range(n)
        ]
        texts = [response_text(x) for x in self.client.complete(bodies)]
        return [texts[i * n : (i + 1) * n] for i in range(len(records))]

    def choice(self, records, clips, responses) -> list:
        got = [self._greedy.get((id(r), id(c))) for r, c in zip(records, clips)]
        return [
            None if x is None else choice_from_logprobs(x, len(r["options"])) for r, x in zip(records, got)
        ]

    def play(
        self,
        examples: Sequence,
        reward_fn,
        turns: Turns,
        group_size: int = 1,
        temperature=None,
        seeds: Sequence[int] | None = None,
        first: tuple[list, list] | None = None,
    ) -> Episodes:
        """Multi-turn episodes through the endpoint: `embodied.rl.episodes.play_turns`, the loop a local
        model plays, with this answerer as its answer source (`answer`). A trajectory one of whose requests
        failed is its `Failure` in `per_trajectory()` (`Episodes.failed`), unscored."""
        sampling = Sampling(group_size, self.max_new_tokens)
        return play_turns(self, examples, self.video, reward_fn, turns, sampling, temperature, seeds, first)

    def answer(self, ask: Ask) -> Turn:
        """One turn of `play_turns` (`embodied.rl.episodes.AnswerSource`): each row's conversation as a chat
        request at its temperature (0: greedy) with its seed; a failed request is its `Failure`."""
        if ask.min_p > 0:
            raise ValueError(
                f"env.retry_min_p={ask.min_p}: a chat request carries no min-p truncation; set "
                "env.retry_min_p=0 to play later turns through an endpoint"
            )
        temps = [0.0] * len(ask.records) if ask.temperature is None else ask.temperature.tolist()
        if ask.seeds is None and any(t > 0 for t in temps):
            raise ValueError(
                "sampled requests to an endpoint need seeds (one per example), so reruns hit the cache"
            )
        seeds = ask.seeds if ask.seeds is not None else [None] * len(temps)
        rows = zip(ask.records, ask.clips, ask.history, temps, seeds)
        bodies = [self._body(r, c, h, t, s, ask.max_new_tokens) for r, c, h, t, s in rows]
        texts = [response_text(x) for x in self.client.complete(bodies)]
        return Turn(list(ask.trajectories), texts, [])

    def check_sampling(
        self, record: dict, clip: Clip, seed: int, sampled: Sequence[Sequence], temperature
    ) -> str:
        """ "" when the server samples; else why the sampled figures are unavailable (also kept in
        `self.sampling`). Samples that differ on any question show that it samples. When every question's
        samples are identical (`sampled`: the texts per question), `PROBES` more requests for `record` at a
        high temperature with new seeds tell a confident model from a server that answers greedily."""
        texts = [[t for t in s if isinstance(t, str)] for s in sampled]
        if temperature <= 0 or not any(len(t) > 1 for t in texts) or any(len(set(t)) > 1 for t in texts):
            return ""
        hot = max(2.0, 2.0 * float(temperature))
        bodies = [self._body(record, [clip], [], hot, sampling_seed(seed, 1000 + j)) for j in range(PROBES)]
        probe = {t for t in map(response_text, self.client.complete(bodies)) if isinstance(t, str)}
        if len(probe) > 1:
            return ""
        self.sampling = (
            f"unavailable: the server returned identical samples for different seeds at temperature "
            f"{float(temperature):g} on every question, and {PROBES} more at temperature {hot:g} were "
            "identical too: it answers greedily whatever the temperature (docs/evaluation.md)"
        )
        return self.sampling

    def settings(self) -> dict:
        out = {"media": self.media, "processor_kwargs": self.processor_kwargs}
        out["read"] = "stream" if self.client.stream else "json"
        if self.media == "video":
            out["video_url"] = self.video_url
        if self.client.refused:
            out["refused_fields"] = sorted(self.client.refused)
        return out | ({"sampling": self.sampling} if self.sampling else {})
