"""Reading a chat completion back as the text the model generated: a streamed answer rebuilt from its pieces
in arrival order, or a non-streamed one; anything else is a `BadResponse` (a failed request, never scored).

Why streaming: `transformers serve` 5.24 passes a non-streamed answer through a response parser that keeps
ONE reasoning and ONE content region, each new `<think>` or `<answer>` region overwriting the last, so a text
with two of them came back as its last ones. Streamed, every piece arrives in order: reasoning pieces (the
server cut `<think>`/`</think>` off them) and content pieces, which `rebuild_text` puts back together.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

END_MARKERS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>")
"""End-of-turn tokens a server's reasoning parser leaves in the reasoning when `<think>` never closed."""


class BadResponse(ValueError):
    """A 200 that holds no chat completion (not JSON, no choices, `content: null`): not retried."""


def rebuild_text(pieces: Sequence[tuple[str, str]], finish_reason: str | None = None) -> str:
    """The assistant's text from streamed `(kind, text)` pieces in arrival order, kind `reasoning` or
    `content`: a reasoning run is put back inside `<think>...</think>`. A reasoning run left open at the end
    (the model never wrote `</think>`: the server's parser then keeps the end-of-turn token in it, or the
    token budget ran out) stays open, as the local decode has it."""
    out, mode = [], "content"
    for kind, text in pieces:
        if kind == "reasoning" and mode != "reasoning":
            out.append("<think>")
        elif kind == "content" and mode == "reasoning":
            out.append("</think>")
        mode = kind
        out.append(text)
    text = "".join(out)
    if mode == "reasoning":
        stripped = text.rstrip()
        ended = next((m for m in END_MARKERS if stripped.endswith(m)), None)
        if ended:
            return stripped[: -len(ended)]
        if finish_reason != "length":
            return text + "</think>"
    return text


def read_stream(lines) -> dict:
    """A streamed chat completion (server-sent events, `data: {...}` lines) as one non-streamed response
    whose message content is the rebuilt text (`rebuild_text`); raises `BadResponse` on a body that is not
    such a stream, and `ConnectionError` on an error event (retried like a 5xx)."""
    pieces: list[tuple[str, str]] = []
    usage, finish, logprobs, events = None, None, [], 0
    for raw in lines:
        line = raw.decode(errors="replace").strip() if isinstance(raw, bytes) else raw.strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        try:
            chunk = json.loads(data)
        except ValueError as e:
            raise BadResponse(f"a stream event that is not JSON: {data[:120]!r}") from e
        if "error" in chunk:
            raise ConnectionError(f"the server's stream ended with an error: {str(chunk['error'])[:200]}")
        events += 1
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if reasoning:
                pieces.append(("reasoning", reasoning))
            if delta.get("content"):
                pieces.append(("content", delta["content"]))
            logprobs += (choice.get("logprobs") or {}).get("content") or []
            finish = choice.get("finish_reason") or finish
    if not events:
        raise BadResponse("a 200 with an empty event stream")
    message = {"role": "assistant", "content": rebuild_text(pieces, finish)}
    choice = {"index": 0, "message": message, "finish_reason": finish}
    if logprobs:
        choice["logprobs"] = {"content": logprobs}
    return {"choices": [choice], "usage": usage, "read": "stream"}


def read_json(raw: bytes) -> dict:
    """A non-streamed chat completion; raises `BadResponse` on a body that is not one."""
    try:
        response = json.loads(raw)
    except ValueError as e:
        raise BadResponse(f"a 200 whose body is not JSON: {raw[:120]!r}") from e
    if not isinstance(response, dict) or not response.get("choices"):
        raise BadResponse(f"a 200 without choices: {str(response)[:200]}")
    message = response["choices"][0].get("message") or {}
    if message.get("content") is None and not (message.get("reasoning_content") or message.get("reasoning")):
        raise BadResponse("a 200 with content: null (no answer text)")
    return response | {"read": "json"}
