"""The `eval:` section: how `embodied eval` evaluates a policy or a served model. Kept free of heavy
imports (no torch) because `embodied.config` imports it for every command.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EvalConfig:
    """`embodied eval` (and the evaluations inside the quickstart and the experiments)."""

    split: str = "test"
    batch_size: int = 64
    max_new_tokens: int = 48
    limit: int | None = None
    """Evaluate only the first `limit` records of the split."""
    choice: bool = True
    """Also report forced-choice accuracy (the option letter the model finds most likely)."""
    baseline: str = "none"
    """none | random | majority | blind | single-frame | shuffled-frames (docs/evaluation.md)."""
    samples: int = 0
    """Responses sampled per question at `temperature` for pass@k and cons@k (0 = greedy only). Sampling
    runs `batch_size x samples` sequences at once: lower `batch_size` for a large model."""
    k: list[int] = field(default_factory=list)
    """The k of pass@k and cons@k, each <= `samples` (empty = 1 and `samples`)."""
    temperature: float = 1.0
    """Sampling temperature of the `samples` responses."""
    media: str = "auto"
    """How a clip is shown: video (as its record says: a video record as one video) | images (its frames, one
    image each) | auto (video for a local policy, images through `endpoint`: every OpenAI-compatible server
    takes images; `transformers serve` 5.24 fails on a Qwen2.5-VL video, docs/evaluation.md)."""
    endpoint: str = ""
    """Evaluate a served model instead of `policy.path`: an OpenAI-compatible base URL such as
    http://127.0.0.1:8000/v1 (chat completions). Empty: the local policy."""
    model: str = ""
    """The served model's name (the request's `model`); empty: the one model the endpoint lists at /models."""
    api_key_env: str = ""
    """Name of the environment variable that holds the endpoint's API key (sent as a bearer token). The key
    itself is never a setting, so it is never written to a config, log or result; empty: no key."""
    concurrency: int = 4
    """Endpoint requests in flight at once."""
    timeout: float = 120.0
    """Seconds one endpoint request may take before it is retried."""
    retries: int = 4
    """Retries of an endpoint request after a 429, a 5xx, a timeout or a dropped connection, with exponential
    backoff; a request that still fails is listed under `failed` and not scored."""
    backoff: float = 1.0
    """Seconds before the first retry; each later retry waits twice as long (at most 30 s, or the server's
    Retry-After)."""
    cache_dir: str = ""
    """Where endpoint responses are cached, keyed by model and request content, so a rerun (after a kill or a
    crash) sends only what is missing; empty: `<run_dir>/endpoint_cache`."""
    video_url: str = "auto"
    """With `media=video` through `endpoint`: how the lossless mp4 travels: data (a `data:` URL) | file (its
    path, written under `cache_dir`, for a server on this machine whose video loader refuses `data:` URLs,
    as `transformers serve` does) | auto (file for a server on 127.0.0.1 or localhost, else data)."""
    processor_kwargs: bool = True
    """Send the pixel budget (and do_sample_frames=false for a video) as
    `chat_template_kwargs.processor_kwargs`, which `transformers serve` hands to its processor so that it
    sizes frames as the local policy does, and sampled requests' `do_sample` and `top_k`. Set false for an API
    that refuses unknown request fields."""
