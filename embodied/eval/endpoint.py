"""An OpenAI-compatible chat endpoint as an evaluation's answer source: HTTP, retries and a response cache.

Only the standard library speaks HTTP here (`urllib` and a thread pool), so evaluating a served model needs
no SDK. What it guarantees, and why:

* **Nothing billed twice.** Every answered request is written to disk before it is used, keyed by the model
  and the request's whole content (messages with their data-URL frames, temperature, seed, limits), never
  by the endpoint's address or the key. A killed evaluation run again sends only what it had not got back;
  a request asked twice within one run is sent once.
* **Nothing lost.** 429 and 5xx responses, timeouts and dropped connections are retried with exponential
  backoff (a server's `Retry-After` is honoured). A request that still fails comes back as a `Failure`
  (counted and listed by the caller, never scored as a wrong answer) and is not cached, so the next run
  asks again. Other 4xx answers (a bad request, a wrong key) are not retried: they would fail the same way.
* **The key stays in the environment.** It is read from the variable named by `eval.api_key_env` when a
  request is sent, goes into the `Authorization` header only, and is never stored on this object's
  public fields, in the cache, in a result or in an error message.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
"""HTTP statuses worth asking again: rate limits, timeouts and server-side failures."""
MAX_BACKOFF_S = 30.0


@dataclass
class Failure:
    """A request that got no usable answer after its retries: why, and how many tries it took."""

    error: str
    attempts: int


@dataclass
class Usage:
    """What the endpoint cost this run: requests by fate, tokens, seconds."""

    requests: int = 0
    """Requests asked for (cached ones included; repeats within the run counted once)."""
    sent: int = 0
    """Requests that went over the network this run (retries not counted)."""
    cached: int = 0
    """Requests answered from the on-disk cache without sending."""
    failed: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    """Prompt tokens of every answer used (cached answers included), as the server reported them."""
    completion_tokens: int = 0
    sent_prompt_tokens: int = 0
    """Prompt tokens of the answers fetched this run: what this run was billed."""
    sent_completion_tokens: int = 0
    request_seconds: float = 0.0
    """Summed wall time of the requests sent (they overlap when `concurrency` > 1)."""
    errors: list[str] = field(default_factory=list)


def cache_key(model: str, body: dict) -> str:
    """The cache key of a request: sha256 of the model and the request's content, canonical JSON."""
    blob = json.dumps({"model": model, "body": body}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


class ResponseCache:
    """One JSON file per answered request under `root/<key[:2]>/<key>.json`, written atomically (a temporary
    file renamed into place), so a run killed mid-write leaves no half answer behind."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict | None:
        p = self.path(key)
        try:
            return json.loads(p.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def put(self, key: str, response: dict) -> None:
        p = self.path(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.{os.getpid()}.{threading.get_ident()}")
        tmp.write_text(json.dumps(response))
        tmp.replace(p)

    def __len__(self) -> int:
        return sum(1 for _ in self.root.glob("*/*.json")) if self.root.is_dir() else 0


class EndpointClient:
    """Chat completions from `url` (`http://HOST:PORT/v1`) for `model`, cached under `cache_dir`.

    `complete(bodies)` returns, in order, each request's response JSON or a `Failure`; `usage` adds up
    what was sent. `on_response(done)` (optional) is called after each answer is stored, with the number of
    answers stored so far in this call: a progress hook, also how a test stops a server mid-evaluation."""

    def __init__(
        self,
        url: str,
        model: str,
        cache_dir: str | Path,
        api_key_env: str = "",
        concurrency: int = 4,
        timeout: float = 120.0,
        retries: int = 4,
        backoff: float = 1.0,
        on_response: Callable[[int], None] | None = None,
    ):
        if not url.startswith(("http://", "https://")):
            raise ValueError(
                f"eval.endpoint={url!r}: give the server's base URL, e.g. http://127.0.0.1:8000/v1"
            )
        if api_key_env and api_key_env not in os.environ:
            raise ValueError(
                f"eval.api_key_env={api_key_env!r}: no such environment variable; export it with the key, or "
                "leave eval.api_key_env empty for a server that needs none"
            )
        if concurrency < 1 or timeout <= 0 or retries < 0 or backoff < 0:
            raise ValueError(
                f"eval.concurrency={concurrency}, eval.timeout={timeout}, eval.retries={retries}, "
                f"eval.backoff={backoff}: need concurrency >= 1, timeout > 0, retries >= 0, backoff >= 0"
            )
        self.url = url.rstrip("/")
        self.api_key_env = api_key_env
        self.timeout = timeout
        self.model = model or self.served_model()
        self.cache = ResponseCache(cache_dir)
        self.concurrency, self.timeout, self.retries, self.backoff = concurrency, timeout, retries, backoff
        self.on_response = on_response
        self.usage = Usage()
        self._lock = threading.Lock()

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.api_key_env:  # read at the last moment; lives only in this dict and the socket
            headers["Authorization"] = f"Bearer {os.environ[self.api_key_env]}"
        return headers

    def served_model(self) -> str:
        """The one model the server lists at `/models` (for `eval.model` left empty)."""
        req = urllib.request.Request(f"{self.url}/models", headers=self._headers())
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                ids = [m["id"] for m in json.loads(r.read()).get("data", [])]
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise ValueError(
                f"eval.model is empty and {self.url}/models did not answer ({e}); set eval.model"
            ) from e
        if len(ids) != 1:
            raise ValueError(f"eval.model is empty and {self.url}/models lists {ids}: set eval.model to one")
        return ids[0]

    def complete(self, bodies: Sequence[dict]) -> list[dict | Failure]:
        """The response of each chat request of `bodies` (`model` is filled in), cached or sent."""
        bodies = [{"model": self.model, **b} for b in bodies]
        keys = [cache_key(self.model, b) for b in bodies]
        unique = dict(zip(keys, bodies))  # one request per distinct content
        found = {k: self.cache.get(k) for k in unique}
        missing = [k for k, v in found.items() if v is None]
        with self._lock:
            self.usage.requests += len(unique)
            self.usage.cached += len(unique) - len(missing)
        done = [0]

        def fetch(key: str) -> None:
            result = self._send(unique[key])
            if not isinstance(result, Failure):
                self.cache.put(key, result)
            found[key] = result
            with self._lock:
                done[0] += 1
                n = done[0]
            if self.on_response is not None and not isinstance(result, Failure):
                self.on_response(n)

        if missing:
            with ThreadPoolExecutor(min(self.concurrency, len(missing))) as pool:
                list(pool.map(fetch, missing))
        for v in found.values():
            if isinstance(v, dict):
                self._count_tokens(v, sent=False)
        return [found[k] for k in keys]

    def _count_tokens(self, response: dict, sent: bool) -> None:
        u = response.get("usage") or {}
        with self._lock:
            if sent:
                self.usage.sent_prompt_tokens += int(u.get("prompt_tokens") or 0)
                self.usage.sent_completion_tokens += int(u.get("completion_tokens") or 0)
            else:
                self.usage.prompt_tokens += int(u.get("prompt_tokens") or 0)
                self.usage.completion_tokens += int(u.get("completion_tokens") or 0)

    def _send(self, body: dict) -> dict | Failure:
        """POST one request with retries; the parsed response, or a `Failure` naming the last error."""
        data = json.dumps(body).encode()
        with self._lock:
            self.usage.sent += 1
        error, attempt = "", 0
        for attempt in range(1, self.retries + 2):
            wait = self.backoff * 2 ** (attempt - 1)
            t0 = time.perf_counter()
            try:
                req = urllib.request.Request(
                    f"{self.url}/chat/completions", data, self._headers(), method="POST"
                )
                with urllib.request.urlopen(req, timeout=self.timeout) as r:
                    response = json.loads(r.read())
                self._add_seconds(t0)
                if not response.get("choices"):
                    return self._fail(f"a response without choices: {str(response)[:200]}", attempt)
                self._count_tokens(response, sent=True)
                return response
            except urllib.error.HTTPError as e:
                self._add_seconds(t0)
                detail = e.read()[:300].decode(errors="replace")
                error = f"HTTP {e.code}: {detail}"
                if e.code not in RETRY_STATUS:
                    return self._fail(error, attempt)
                wait = max(wait, _retry_after(e.headers.get("Retry-After")))
            except (TimeoutError, urllib.error.URLError, http.client.HTTPException, ConnectionError) as e:
                self._add_seconds(t0)
                error = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
            except (OSError, ValueError) as e:
                self._add_seconds(t0)
                error = f"{type(e).__name__}: {e}"
            if attempt <= self.retries:
                with self._lock:
                    self.usage.retries += 1
                time.sleep(min(MAX_BACKOFF_S, wait))
        return self._fail(error, attempt)

    def _add_seconds(self, t0: float) -> None:
        with self._lock:
            self.usage.request_seconds += time.perf_counter() - t0

    def _fail(self, error: str, attempts: int) -> Failure:
        with self._lock:
            self.usage.failed += 1
            if error not in self.usage.errors and len(self.usage.errors) < 20:
                self.usage.errors.append(error)
        return Failure(error, attempts)


def _retry_after(value: str | None) -> float:
    """Seconds a `Retry-After` header asks for (0 when absent or given as a date)."""
    try:
        return float(value) if value else 0.0
    except ValueError:
        return 0.0
