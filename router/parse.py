"""Parse and check an OpenAI request body; estimate its prompt tokens. Pure (no I/O).

Raises `tidegate.errors.RequestError` with `param` set; the edge maps it to a 400.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from simulator.tokens import count_chat_tokens, count_completion_prompt_tokens
from tidegate.errors import RequestError
from tidegate.policy.pick import RequestFeatures

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"


class BadRequest(RequestError):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


# One prefix block = 16 tokens under the simulator's rule of 4 UTF-8 bytes per token, i.e. the
# engine's KV block size; cache-aware policies compare these ids across requests.
PREFIX_BLOCK_BYTES = 64
MAX_PREFIX_BLOCKS = 256


def prefix_hashes(text: str) -> tuple[int, ...]:
    """Chained hashes of the full 64-byte blocks of `text` (block i's id covers blocks 0..i),
    so equal ids mean an equal prefix up to that block. Bounded to MAX_PREFIX_BLOCKS."""
    data = text.encode("utf-8", errors="replace")
    out = []
    h = hashlib.blake2b(digest_size=8)
    for i in range(min(len(data) // PREFIX_BLOCK_BYTES, MAX_PREFIX_BLOCKS)):
        h.update(data[i * PREFIX_BLOCK_BYTES:(i + 1) * PREFIX_BLOCK_BYTES])
        out.append(int.from_bytes(h.copy().digest(), "big") >> 1)
    return tuple(out)


def _prompt_text(payload: dict[str, Any], chat: bool) -> str:
    if chat:
        parts = []
        for m in payload.get("messages", []):
            content = m.get("content")
            if isinstance(content, list):
                content = "".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
            parts.append(f"{m.get('role', '')}:{content if isinstance(content, str) else ''}\n")
        return "".join(parts)
    prompt = payload.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(x, str) for x in prompt):
        return "".join(prompt)
    return ""


def parse_request(path: str, body: bytes) -> tuple[dict[str, Any], RequestFeatures]:
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("request body is not valid JSON") from None
    if not isinstance(payload, dict):
        raise BadRequest("request body must be a JSON object")
    model = payload.get("model")
    if model is None or model == "":
        raise BadRequest("you must provide a model parameter", param="model")
    if not isinstance(model, str):
        raise BadRequest("model must be a string", param="model")
    if path == CHAT_PATH:
        messages = payload.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise BadRequest("messages must be a non-empty list of message objects", param="messages")
        try:
            prompt_tokens = count_chat_tokens(messages)
        except TypeError as exc:
            raise BadRequest(str(exc), param="messages") from None
    else:
        prompt = payload.get("prompt")
        if prompt is None:
            raise BadRequest("you must provide a prompt parameter", param="prompt")
        if not isinstance(prompt, str | list):
            raise BadRequest("prompt must be a string or a list", param="prompt")
        try:
            prompt_tokens = count_completion_prompt_tokens(prompt)
        except TypeError as exc:
            raise BadRequest(str(exc), param="prompt") from None
    max_tokens = payload.get("max_completion_tokens", payload.get("max_tokens"))
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        max_tokens = None
    return payload, RequestFeatures(
        model=model, prompt_tokens=prompt_tokens, max_tokens=max_tokens, stream=payload.get("stream") is True,
    )


def request_prefix_hashes(path: str, payload: dict[str, Any]) -> tuple[int, ...]:
    """The prompt's prefix block ids; computed only for policies that read them (hot path)."""
    return prefix_hashes(_prompt_text(payload, path == CHAT_PATH))


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """The OpenAI error envelope."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
