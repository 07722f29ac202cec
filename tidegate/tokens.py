"""Deterministic prompt token counts without a tokenizer, and prompt prefix blocks.

The simulator and the router's prompt-size estimate share these rules, so that both agree (they
live in the shared core because neither process may import the other; see [tool.importlinter]):

- text: ``max(1, ceil(len(text.encode("utf-8")) / 4))`` -- about 4 bytes per token, the usual
  rule of thumb for English with BPE tokenizers (Llama 3: ~4.2 characters per token);
- chat: for each message, the tokens of its content (the text rule; 0 for empty content) plus 4
  for the role and the template's delimiters; plus 2 for the assistant-turn header that the chat
  template appends. Content given as a list of parts counts the ``text`` of each text part; a
  ``name`` field is counted as text too; other parts (images) count nothing.
- a prompt given as token ids counts one token per id.

Prefix blocks, shared by the router (affinity) and the simulated engine (its prefix cache), so
that a block id the router predicts is the block the engine caches: the prompt's text (a
completion prompt as sent; a chat as ``role:content\n`` per message, in order) is cut into
PREFIX_BLOCK_BYTES-byte blocks (64 tokens under the byte rule, four 16-token KV blocks), and
block i's id is a chained hash of bytes 0..PREFIX_BLOCK_BYTES·(i+1) (XXH3-64, see
prefix_block_hashes), so equal ids mean an equal prefix up to that block. A chat's content is
read by the same rule as for its count (`_content_text`), and `chat_prompt` /
`completion_prompt` give the count and the block bytes from one encoding of the text. Token-id
prompts have no text and get no blocks.

Pure functions: no I/O, no state.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from xxhash import xxh3_64_intdigest as _xxh3_64

BYTES_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 4
TOKENS_PER_REPLY = 2
# Prefix blocks of 64 tokens (4 of vLLM's 16-token KV blocks): a prefix cache hit is counted to
# 64 tokens, and the router hashes a 4k-token prompt in 64 steps, not 256 (each one is a Python
# call: the per-request cost of prefix affinity is mostly this loop).
PREFIX_BLOCK_BYTES = 256
PREFIX_BLOCK_TOKENS = PREFIX_BLOCK_BYTES // BYTES_PER_TOKEN


def _text_tokens(text: str) -> int:
    n = len(text.encode("utf-8"))
    return -(-n // BYTES_PER_TOKEN)


def count_prompt_tokens(text: str) -> int:
    """Tokens of a plain-text prompt: max(1, ceil(utf-8 bytes / 4))."""
    return max(1, _text_tokens(text))


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type", "text") == "text":
                text = part.get("text")
                if isinstance(text, str):
                    parts.append(text)
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    raise TypeError("message content must be a string, a list of parts or null")


def count_chat_tokens(messages: Iterable[Mapping[str, Any]],
                      text_tokens: Callable[[str], int] = _text_tokens) -> int:
    """Tokens of a chat prompt: sum(content tokens + 4 per message) + 2. `text_tokens` counts a
    text (default: the byte rule; the router passes a real tokenizer's count when it has one)."""
    total = TOKENS_PER_REPLY
    for msg in messages:
        total += TOKENS_PER_MESSAGE + text_tokens(_content_text(msg.get("content")))
        name = msg.get("name")
        if isinstance(name, str):
            total += text_tokens(name)
    return total


def _prompt_text(prompt: Any) -> str | None:
    """A /v1/completions prompt's text: the string, or a list of strings joined; None for token
    ids and anything else (the one place the prompt's forms are told apart, for counts and blocks)."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list | tuple) and prompt and all(isinstance(x, str) for x in prompt):
        return "".join(prompt)
    return None


def count_completion_prompt_tokens(prompt: str | Sequence[int] | Sequence[str],
                                   prompt_tokens: Callable[[str], int] = count_prompt_tokens) -> int:
    """Tokens of a /v1/completions `prompt`: a string, a list of token ids, or a list of strings
    (counted as one prompt made of their concatenation). `prompt_tokens` counts a text prompt."""
    text = _prompt_text(prompt)
    if text is not None:
        return prompt_tokens(text)
    items = list(prompt)
    if items and all(isinstance(x, int) and not isinstance(x, bool) for x in items):
        return len(items)
    raise TypeError("prompt must be a string, a non-empty list of strings or a non-empty list of token ids")


def chat_prompt(messages: Iterable[Mapping[str, Any]]) -> tuple[int, bytes]:
    """(tokens by count_chat_tokens' byte rule, the bytes its prefix blocks are cut from), in one
    pass: each content is encoded once for both. TypeError as count_chat_tokens; UnicodeEncodeError
    for text that is not valid Unicode (a lone surrogate)."""
    total = TOKENS_PER_REPLY
    parts: list[bytes] = []
    for msg in messages:
        data = _content_text(msg.get("content")).encode("utf-8")
        total += TOKENS_PER_MESSAGE - (-len(data) // BYTES_PER_TOKEN)
        name = msg.get("name")
        if isinstance(name, str):
            total += _text_tokens(name)
        role = msg.get("role", "")
        parts += (f"{role}:".encode(), data, b"\n")
    return total, b"".join(parts)


def completion_prompt(prompt: str | Sequence[int] | Sequence[str]) -> tuple[int, bytes]:
    """(tokens by count_completion_prompt_tokens' byte rule, the bytes its prefix blocks are cut
    from: b"" for token ids), encoding the text once. Errors as chat_prompt."""
    text = _prompt_text(prompt)
    if text is None:
        return count_completion_prompt_tokens(prompt), b""
    data = text.encode("utf-8")
    return max(1, -(-len(data) // BYTES_PER_TOKEN)), data


def prefix_bytes(payload: Mapping[str, Any], chat: bool) -> bytes:
    """The UTF-8 bytes a request's prefix blocks are cut from (b"" when it has none): a chat's
    `role:content\n` per message, with content by the rule the token count reads (one helper,
    so the count and the blocks come from the same text), or a completion prompt's text.
    A request the counts refuse (bad content, text that is not valid Unicode) has no blocks."""
    try:
        if chat:
            messages = payload.get("messages")
            if not isinstance(messages, list) or not all(isinstance(m, Mapping) for m in messages):
                return b""
            return chat_prompt(messages)[1]
        text = _prompt_text(payload.get("prompt"))
        return b"" if text is None else text.encode("utf-8")
    except (TypeError, UnicodeEncodeError):
        return b""


def prefix_text(payload: Mapping[str, Any], chat: bool) -> str:
    """prefix_bytes as text (for tests and tools; the hot paths hash the bytes)."""
    return prefix_bytes(payload, chat).decode("utf-8")


@lru_cache(maxsize=32)
def _blocks_of(count: int) -> Callable[[bytes], tuple[bytes, ...]]:
    """Cuts the first `count` blocks out of a bytes in one C call (struct: `count` 256-byte fields)."""
    return struct.Struct(f"{PREFIX_BLOCK_BYTES}s" * count).unpack_from


def prefix_block_hashes(text: str | bytes, max_blocks: int | None = None) -> tuple[int, ...]:
    """Chained ids of the full PREFIX_BLOCK_BYTES blocks of `text` (a str is UTF-8 encoded; at most
    `max_blocks`), each a non-negative 63-bit int (JSON- and protobuf-safe).

    Block i's id is the top 63 bits of h_i = XXH3-64(block i, seed=h_{i-1}), h_-1 = 0: a 64-bit
    chain, so an id names the whole prefix before it (two different prefixes share an id with
    probability ~2^-63). XXH3's output is specified and frozen (xxHash >= 0.8.0), the same on every
    platform and process. It is not a cryptographic hash: a client who crafts a collision only
    misleads routing hints and the simulator's cache, never what a real engine computes."""
    data = text.encode("utf-8", errors="replace") if isinstance(text, str) else text
    n = len(data) // PREFIX_BLOCK_BYTES
    if max_blocks is not None:
        n = min(n, max_blocks)
    # The router runs this on every request (64 blocks for a 4k-token prompt): the Python loop is
    # the cost, not the hash, so the blocks are cut in one C call and each step is one C call with
    # the seed carrying the chain (blake2b's update + digest per block cost ~4x as much).
    ids: list[int] = []
    append, xxh3 = ids.append, _xxh3_64
    h = 0
    for block in _blocks_of(n)(data) if n else ():
        h = xxh3(block, h)
        append(h >> 1)
    return tuple(ids)


def engine_block_ids(hashes: Sequence[int], block_size: int) -> tuple[tuple[int, ...], int]:
    """(ids, prompt tokens per id) for the engine's `add_request`: ids must cover a whole number
    of its KV blocks, so with blocks larger than PREFIX_BLOCK_TOKENS only every k-th id is kept
    (chained, it still names all the text before it)."""
    k = math.lcm(PREFIX_BLOCK_TOKENS, block_size) // PREFIX_BLOCK_TOKENS
    return tuple(hashes[k - 1::k]), PREFIX_BLOCK_TOKENS * k
