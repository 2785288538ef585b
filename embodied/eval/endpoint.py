"""An OpenAI-compatible chat endpoint as an evaluation's answer source: HTTP, retries and a response cache.

Only the standard library speaks HTTP here (`urllib` and a thread pool), so evaluating a served model needs
no SDK. What it guarantees, and why:

* **The answer read back is the answer generated.** Requests ask for a streamed answer and the text is
  rebuilt from the reasoning and content pieces in the order they arrived (`embodied.eval.reading`). A
  non-streamed answer from `transformers serve` 5.24 goes through a response parser that keeps one
  reasoning and one content region, so a text with two `<think>` or `<answer>` regions came back as its
  last ones. A server that refuses streaming (a 4xx naming `stream`, or a JSON body instead of events) is
  asked without it; `Usage.read` counts which way each answer came.
* **Nothing billed twice.** Every answered request is written to disk before it is used, keyed by the model
  and the request's whole content (messages with their frames, temperature, seed, limits), never by the
  endpoint's address or the key. A killed evaluation run again sends only what it had not got back; a
  request asked twice within one run is sent once.
* **Nothing lost, nothing scored that was not answered.** 429 and 5xx responses, timeouts and dropped
  connections are retried with exponential backoff (a server's `Retry-After` is honoured). A request that
  still fails comes back as a `Failure` with its `cause` (counted and listed by the caller, never scored) and
  is not cached, so the next run asks again. Other 4xx answers (a wrong model, a missing `/v1`) and a 200
  whose body is no chat completion (not JSON, no choices, `content: null`) are not retried: they would fail
  the same way.
* **Fields a server refuses are dropped, not fatal.** A 422 naming unexpected fields (`transformers serve`
  refuses `do_sample` and `top_k`) makes the client resend without them; sampling fields then travel as
  `generation_config` (a JSON string `transformers serve` reads) so a sampled request still samples.
* **No credential anywhere.** The key is read from the variable named by `eval.api_key_env` when a request
  is sent and goes into the `Authorization` header only. A URL holding `user:password@` is refused before
  it reaches a message, a config or a log (`check_url`).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from embodied.eval.reading import BadResponse, read_json, read_stream

RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
"""HTTP statuses worth asking again: rate limits, timeouts and server-side failures."""
MAX_BACKOFF_S = 30.0
READ_VERSION = 2
"""Part of every cache key: answers cached before streamed reading (version 1) are not reused."""
SAMPLING_FIELDS = ("do_sample", "top_k")
"""Extra sampling fields: vLLM and SGLang read them; `transformers serve` refuses them (422) and reads
`generation_config` instead."""


@dataclass
class Failure:
    """A request that got no usable answer after its retries: why, how many tries, and the kind of fault
    (`cause`: refused, unreachable, not_found, model, auth, client, server, timeout, bad_response)."""

    error: str
    attempts: int
    cause: str = "server"


@dataclass
class Usage:
    """What the endpoint did this run: requests by fate, tokens, seconds, and how answers were read."""

    requests: int = 0
    """Distinct requests this run needed (a request asked again within the run counts once)."""
    sent: int = 0
    """Distinct requests the server received this run (retries not counted; a refused connection is not
    received)."""
    cached: int = 0
    """Distinct requests answered from the cache of an earlier run, without sending."""
    repeated: int = 0
    """Asks within this run for an answer this run already had (e.g. a multi-turn sample's first turn and the
    same sample for best-of-N): not sent again."""
    unreached: int = 0
    """Requests that never reached the server (connection refused, host not found)."""
    failed: int = 0
    retries: int = 0
    prompt_tokens: int | None = None
    """Prompt tokens of every answer used (cached answers included), as the server reported them; None (not
    reported) when no answer carried a `usage` (a streamed answer carries one only at the end of its stream,
    asked for with `stream_options.include_usage`: `transformers serve` 5.25 sends none without it)."""
    completion_tokens: int | None = None
    sent_prompt_tokens: int | None = None
    """Prompt tokens of the answers fetched this run: what this run was billed (None: not reported)."""
    sent_completion_tokens: int | None = None
    unreported: int = 0
    """Answers fetched this run without a token `usage`: left out of the token counters above."""
    request_seconds: float = 0.0
    """Summed wall time of the requests sent (they overlap when `concurrency` > 1)."""
    read: dict[str, int] = field(default_factory=dict)
    """Answers fetched this run by how they were read: `stream` (rebuilt from pieces) or `json`."""
    refused_fields: list[str] = field(default_factory=list)
    """Request fields the server refused (422), dropped from later requests."""
    errors: list[str] = field(default_factory=list)
    causes: dict[str, int] = field(default_factory=dict)
    """Failed requests by cause (see `Failure.cause`)."""


def cache_key(model: str, body: dict) -> str:
    """The cache key of a request: sha256 of the model and the request's content, canonical JSON."""
    blob = json.dumps(
        {"model": model, "body": body, "read": READ_VERSION}, sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def check_url(url: str) -> str:
    """`url` without a trailing slash; refuses a URL that is not http(s) or that holds credentials, in a
    message that does not repeat them."""
    if not url.startswith(("http://", "https://")):
        shown = redact(url) if "@" in url else url
        raise ValueError(
            f"eval.endpoint={shown!r}: give the server's base URL, e.g. http://127.0.0.1:8000/v1"
        )
    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None:
        raise ValueError(
            f"eval.endpoint={redact(url)!r} holds a user name or password: give the URL without them and the "
            "key through eval.api_key_env (the NAME of an environment variable holding it)"
        )
    return url.rstrip("/")


def redact(url: str) -> str:
    """`url` with any `user:password@` replaced by `***@`."""
    return re.sub(r"(?<=//)[^/@]*@", "***@", url, count=1)


def http_cause(code: int, detail: str) -> str:
    """The kind of fault an HTTP error status names (see `Failure.cause`)."""
    if code in (401, 403):
        return "auth"
    if (
        code in (400, 404, 422)
        and re.search(r"\bmodel\b|pinned", detail, re.I)
        and "field" not in detail.lower()
    ):
        return "model"
    if code == 404:
        return "not_found"
    return "server" if code >= 500 else "client"


class Unreachable(ValueError):
    """The server could not be asked for its models (connection refused, no such route, a refused key)."""


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
    what was done. `on_response(done)` (optional) is called after each answer is stored, with the number of
    answers stored so far in this call: a progress hook, also how a test stops a server mid-evaluation.
    `stream=False` reads non-streamed answers only."""

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
        stream: bool = True,
    ):
        self.url = check_url(url)
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
        self.api_key_env, self.timeout, self.stream = api_key_env, timeout, stream
        self.refused: set[str] = set()
        self.model = model or self.served_model()
        self.cache = ResponseCache(cache_dir)
        self.concurrency, self.retries, self.backoff = concurrency, retries, backoff
        self.on_response = on_response
        self.usage = Usage()
        self._lock = threading.Lock()
        self._seen: set[str] = set()  # keys this run asked for
        self._mine: set[str] = set()  # keys this run fetched from the server
        self.first_error: dict[str, str] = {}  # cause -> its first error message

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.api_key_env:  # read at the last moment; lives only in this dict and the socket
            headers["Authorization"] = f"Bearer {os.environ[self.api_key_env]}"
        return headers

    def listed_models(self) -> list[str]:
        """The model ids the server lists at `/models`; raises `ValueError` naming the fault."""
        req = urllib.request.Request(f"{self.url}/models", headers=self._headers())
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                return [m["id"] for m in json.loads(r.read()).get("data", [])]
        except urllib.error.HTTPError as e:
            raise Unreachable(f"{self.url}/models answered HTTP {e.code}: {self._hint(e.code)}") from e
        except (urllib.error.URLError, OSError) as e:
            raise Unreachable(unreachable_message(self.url, e)) from e
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise Unreachable(f"{self.url}/models did not answer with a model list ({e})") from e

    def _hint(self, code: int) -> str:
        if code == 404:
            return no_route_message(self.url)
        if code in (401, 403):
            return "the server wants a key: export it and set eval.api_key_env to the variable's name"
        return "set eval.model to the served model's name to skip this lookup"

    def served_model(self) -> str:
        """The one model the server lists at `/models` (for `eval.model` left empty)."""
        ids = self.listed_models()
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
            for k, v in found.items():
                if k in self._seen:
                    self.usage.repeated += v is not None
                    continue
                self._seen.add(k)
                self.usage.requests += 1
                self.usage.cached += v is not None and k not in self._mine
        done = [0]

        def fetch(key: str) -> None:
            result = self._send(unique[key])
            if not isinstance(result, Failure):
                self.cache.put(key, result)
                with self._lock:
                    self._mine.add(key)
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
        reported = {k: int(u[k]) for k in ("prompt_tokens", "completion_tokens") if u.get(k) is not None}
        prefix = "sent_" if sent else ""
        with self._lock:
            for k, v in reported.items():  # a counter no answer reported stays None: "not reported", never 0
                setattr(self.usage, prefix + k, (getattr(self.usage, prefix + k) or 0) + v)
            if sent:
                self.usage.unreported += not reported
                how = response.get("read", "json")
                self.usage.read[how] = self.usage.read.get(how, 0) + 1

    def _wire(self, body: dict) -> dict:
        """What goes on the wire for `body`: refused fields dropped, `stream` asked for, and sampling fields
        a server refused sent as `generation_config` (how `transformers serve` takes them)."""
        wire = {k: v for k, v in body.items() if k not in self.refused}
        if self.stream:
            wire["stream"] = True
            if "stream_options" not in self.refused:  # the OpenAI way to get a streamed answer's usage
                wire["stream_options"] = {"include_usage": True}
        dropped = [k for k in SAMPLING_FIELDS if k in body and k in self.refused]
        if dropped and "generation_config" not in self.refused and float(body.get("temperature") or 0) > 0:
            config = {"do_sample": True, "temperature": float(body["temperature"])}
            config |= {"top_p": float(body.get("top_p", 1.0)), "top_k": max(0, int(body.get("top_k", 0)))}
            wire["generation_config"] = json.dumps(
                config | {"max_new_tokens": int(body.get("max_tokens", 64))}
            )
        return wire

    def _post(self, body: dict) -> dict:
        """One POST of `body`: the response (streamed or not, as the server answered); raises on failure."""
        data = json.dumps(self._wire(body)).encode()
        req = urllib.request.Request(f"{self.url}/chat/completions", data, self._headers(), method="POST")
        with urllib.request.urlopen(req, timeout=self.timeout) as r:
            if "text/event-stream" in (r.headers.get("Content-Type") or ""):
                return read_stream(r)
            return read_json(r.read())

    def _adapt(self, code: int, detail: str, body: dict) -> bool:
        """Learn from a 4xx that the server refuses streaming or some fields; True when the request is worth
        sending again at once without them."""
        if code not in (400, 422):
            return False
        low = detail.lower()
        # `stream` the word, not `stream_options`: a server refusing the usage option still streams
        if self.stream and re.search(r"\bstream\b", low) and "unexpected" not in low:
            self.stream = False
            return True
        names = set(re.findall(r"'([A-Za-z_]+)'", detail)) if "field" in low else set()
        names |= {"stream_options"} & set(re.findall(r"[a-z_]+", low))  # the client's own option, named bare
        named = names & (set(body) | {"stream", "stream_options", "generation_config"})  # sent (refused: not)
        if not named:
            return False
        with self._lock:
            self.refused |= named
            self.usage.refused_fields = sorted(self.refused)
        if "stream" in named:
            self.stream = False
        return True

    def _send(self, body: dict) -> dict | Failure:
        """POST one request with retries; the parsed response, or a `Failure` naming the last error."""
        error, cause, attempt, reached, adapted = "", "server", 0, False, 0
        while attempt <= self.retries:
            attempt += 1
            wait = self.backoff * 2 ** (attempt - 1)
            t0 = time.perf_counter()
            try:
                response = self._post(body)
                self._add_seconds(t0)
                self._count_tokens(response, sent=True)
                self._count_reached(True)
                return response
            except urllib.error.HTTPError as e:
                self._add_seconds(t0)
                reached = True
                detail = e.read()[:300].decode(errors="replace")
                error, cause = f"HTTP {e.code}: {detail}", http_cause(e.code, detail)
                if adapted < 4 and self._adapt(e.code, detail, body):
                    adapted, attempt = adapted + 1, attempt - 1  # the same request, without what was refused
                    continue
                if e.code not in RETRY_STATUS:
                    break
                wait = max(wait, _retry_after(e.headers.get("Retry-After")))
            except BadResponse as e:
                self._add_seconds(t0)
                reached, error, cause = True, f"BadResponse: {e}", "bad_response"
                break
            except (
                TimeoutError,
                urllib.error.URLError,
                http.client.HTTPException,
                ConnectionError,
                OSError,
            ) as e:
                self._add_seconds(t0)
                reason = getattr(e, "reason", e)
                error, cause = f"{type(e).__name__}: {reason}", _network_cause(e, reason)
                reached = reached or cause not in ("refused", "unreachable")
            if attempt <= self.retries:
                with self._lock:
                    self.usage.retries += 1
                time.sleep(min(MAX_BACKOFF_S, wait))
        self._count_reached(reached)
        return self._fail(error, attempt, cause)

    def _count_reached(self, reached: bool) -> None:
        with self._lock:
            if reached:
                self.usage.sent += 1
            else:
                self.usage.unreached += 1

    def _add_seconds(self, t0: float) -> None:
        with self._lock:
            self.usage.request_seconds += time.perf_counter() - t0

    def _fail(self, error: str, attempts: int, cause: str) -> Failure:
        with self._lock:
            self.usage.failed += 1
            self.usage.causes[cause] = self.usage.causes.get(cause, 0) + 1
            self.first_error.setdefault(cause, error)
            if error not in self.usage.errors and len(self.usage.errors) < 20:
                self.usage.errors.append(error)
        return Failure(error, attempts, cause)


def unreachable_message(url: str, error: BaseException) -> str:
    """Why nothing reached `url`, and what to do."""
    reason = getattr(error, "reason", error)
    if isinstance(reason, ConnectionRefusedError):
        return (
            f"connection refused at {url}: no server listens there; start it (e.g. transformers serve FOLDER "
            "--host 127.0.0.1 --port P) or fix the host and port in eval.endpoint"
        )
    return (
        f"could not reach {url} ({type(reason).__name__}: {reason}): check the host and port in eval.endpoint"
    )


def no_route_message(url: str) -> str:
    """What a 404 on the chat route means."""
    if not url.rstrip("/").endswith("/v1"):
        return f"eval.endpoint={url!r} must be the server's base URL ending in /v1 (e.g. http://127.0.0.1:8000/v1)"
    return f"{url} has no OpenAI chat route: is eval.endpoint the server's OpenAI-compatible base URL?"


def likely_cause(client: EndpointClient) -> str:
    """One line naming why the requests failed (for an evaluation that answered nothing), from the most
    frequent cause of the client's failures: connection refused, no `/v1` route, a model the server does not
    serve, every request 5xx, or an answer that was no chat completion."""
    causes = client.usage.causes
    top = max(causes, key=causes.get) if causes else "server"
    first = client.first_error.get(top, "")
    if top in ("refused", "unreachable"):
        return unreachable_message(
            client.url, ConnectionRefusedError() if top == "refused" else OSError(first)
        )
    if top == "not_found":
        return f"HTTP 404 at {client.url}/chat/completions: " + no_route_message(client.url)
    if top == "model":
        try:
            listed = f"it lists {client.listed_models()} at /models"
        except ValueError:
            listed = "it lists no models at /models"
        return f"wrong model: the server does not serve eval.model={client.model!r} ({first[:160]}); {listed}"
    if top == "auth":
        return f"the server refused the key ({first[:120]}): check eval.api_key_env and the key it names"
    if top == "server":
        return f"every request failed with a server error ({first[:200]}): see the server's log"
    if top == "timeout":
        return f"every request timed out ({first[:120]}): raise eval.timeout or check the server"
    return f"every request failed ({top}: {first[:200]})"


def _network_cause(error: BaseException, reason) -> str:
    """refused / unreachable (the request never reached the server), timeout, or server (dropped)."""
    if isinstance(reason, TimeoutError) or "timed out" in str(reason):
        return "timeout"
    if isinstance(error, urllib.error.URLError):  # raised before a response: the connection failed
        return "refused" if isinstance(reason, ConnectionRefusedError) else "unreachable"
    return "server"


def _retry_after(value: str | None) -> float:
    """Seconds a `Retry-After` header asks for (0 when absent or given as a date)."""
    try:
        return float(value) if value else 0.0
    except ValueError:
        return 0.0
