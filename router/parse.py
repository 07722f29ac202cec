"""Parse and check an OpenAI request body; estimate its prompt tokens. Pure (no I/O).

Raises `tidegate.errors.RequestError` with `param` set; the edge maps it to a 400.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tidegate.errors import RequestError
from tidegate.policy.pick import RequestFeatures
from tidegate.router.prompt_tokens import ESTIMATE, PromptCounter
from tidegate.tokens import prefix_block_hashes, prefix_bytes

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
# Deeper JSON is refused (400): Python's decoder would fail with RecursionError near 1,000
# levels, and no OpenAI request (tool schemas included) comes close to this.
DEFAULT_MAX_JSON_DEPTH = 64
# A JSON escape of a UTF-16 surrogate (D800-DFFF); only bodies holding one can decode to a
# string that is not valid Unicode (a lone surrogate), so only those are walked for it.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class BadRequest(RequestError):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


# Prefix blocks are cut by the rule the simulated engine's prefix cache uses (tidegate/tokens.py);
# the router hashes at most this many (16,384 tokens): the per-request cost stays bounded.
MAX_PREFIX_BLOCKS = 256


def prefix_hashes(text: str | bytes) -> tuple[int, ...]:
    """Chained ids of the full PREFIX_BLOCK_BYTES blocks of `text`, bounded to MAX_PREFIX_BLOCKS."""
    return prefix_block_hashes(text, MAX_PREFIX_BLOCKS)


@dataclass(frozen=True, slots=True)
class ParsedBody:
    """A request's JSON and, when counting its prompt already encoded it, the bytes its prefix
    blocks are cut from (None: made from `payload` if a policy asks, request_prefix_hashes)."""

    payload: dict[str, Any]
    prefix: bytes | None = None


def _check_tree(payload: Any, max_depth: int, check_text: bool) -> None:
    """Nesting depth and (when `check_text`) valid Unicode in every string, keys included;
    iterative, so no input can exhaust the stack."""
    stack: list[tuple[Any, int]] = [(payload, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth > max_depth:
                raise BadRequest(f"request JSON is nested deeper than {max_depth} levels")
            items = node.items() if isinstance(node, dict) else enumerate(node)
            for key, value in items:
                if check_text and isinstance(key, str):
                    stack.append((key, depth))
                stack.append((value, depth + 1))
        elif check_text and isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError:
                raise BadRequest("request JSON holds a string that is not valid Unicode "
                                 "(a lone UTF-16 surrogate escape)") from None


def decode_json(body: bytes, max_depth: int = DEFAULT_MAX_JSON_DEPTH) -> Any:
    """The body as JSON, or BadRequest: invalid JSON or UTF-8, nesting deeper than `max_depth`,
    strings that are not valid Unicode. Never any other exception."""
    try:
        # Decoded here rather than by json.loads, which would also take UTF-16/32 bodies.
        payload = json.loads(body.decode("utf-8"))
    except RecursionError:
        raise BadRequest(f"request JSON is nested deeper than {max_depth} levels") from None
    except ValueError:  # UnicodeDecodeError included
        raise BadRequest("request body is not valid JSON") from None
    # A document can only be deeper than the count of its brackets: most bodies skip the walk.
    deep = body.count(b"[") + body.count(b"{") > max_depth
    check_text = _SURROGATE_ESCAPE.search(body) is not None
    if deep or check_text:
        _check_tree(payload, max_depth, check_text)
    return payload


def parse_request(path: str, body: bytes, max_depth: int = DEFAULT_MAX_JSON_DEPTH,
                  counter: PromptCounter = ESTIMATE) -> tuple[ParsedBody, RequestFeatures]:
    payload = decode_json(body, max_depth)
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
            prompt_tokens, prefix = counter.chat_and_prefix(messages)
        except TypeError as exc:
            raise BadRequest(str(exc), param="messages") from None
    else:
        prompt = payload.get("prompt")
        if prompt is None:
            raise BadRequest("you must provide a prompt parameter", param="prompt")
        if not isinstance(prompt, str | list):
            raise BadRequest("prompt must be a string or a list", param="prompt")
        try:
            prompt_tokens, prefix = counter.completion_and_prefix(prompt)
        except TypeError as exc:
            raise BadRequest(str(exc), param="prompt") from None
    max_tokens = payload.get("max_completion_tokens", payload.get("max_tokens"))
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        max_tokens = None
    return ParsedBody(payload, prefix), RequestFeatures(
        model=model, prompt_tokens=prompt_tokens, max_tokens=max_tokens, stream=payload.get("stream") is True,
    )


def request_prefix_hashes(path: str, body: ParsedBody | Mapping[str, Any]) -> tuple[int, ...]:
    """The prompt's prefix block ids, from parse_request's body (or a bare JSON payload);
    computed only for policies that read them (hot path)."""
    if isinstance(body, ParsedBody):
        data = body.prefix if body.prefix is not None else prefix_bytes(body.payload, path == CHAT_PATH)
    else:
        data = prefix_bytes(body, path == CHAT_PATH)
    return prefix_hashes(data)


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """The OpenAI error envelope."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
