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
block i's id is a hash of bytes 0..PREFIX_BLOCK_BYTES·(i+1), so equal ids mean an equal prefix
up to that block. Token-id prompts have no
text and get no blocks.

Pure functions: no I/O, no state.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

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


def count_completion_prompt_tokens(prompt: str | Sequence[int] | Sequence[str],
                                   prompt_tokens: Callable[[str], int] = count_prompt_tokens) -> int:
    """Tokens of a /v1/completions `prompt`: a string, a list of token ids, or a list of strings
    (counted as one prompt made of their concatenation). `prompt_tokens` counts a text prompt."""
    if isinstance(prompt, str):
        return prompt_tokens(prompt)
    items = list(prompt)
    if items and all(isinstance(x, int) and not isinstance(x, bool) for x in items):
        return len(items)
    if items and all(isinstance(x, str) for x in items):
        return prompt_tokens("".join(items))
    raise TypeError("prompt must be a string, a non-empty list of strings or a non-empty list of token ids")


def prefix_text(payload: Mapping[str, Any], chat: bool) -> str:
    """The text a request's prefix blocks are cut from ("" when it has none)."""
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


def prefix_block_hashes(text: str, max_blocks: int | None = None) -> tuple[int, ...]:
    """Chained ids of the full PREFIX_BLOCK_BYTES blocks of `text` (at most `max_blocks`), each a
    non-negative 63-bit int (JSON- and protobuf-safe)."""
    data = text.encode("utf-8", errors="replace")
    n = len(data) // PREFIX_BLOCK_BYTES
    if max_blocks is not None:
        n = min(n, max_blocks)
    # The router runs this on every request (64 blocks for a 4k-token prompt): the blocks are
    # memoryview slices (no copies), the methods are bound once, outside the loop, and digest()
    # is taken on the running hash itself (hashlib's digest() leaves the object as it was, so
    # updating it afterwards hashes the longer prefix: no copy per block).
    out: list[int] = []
    append, from_bytes = out.append, int.from_bytes
    h = hashlib.blake2b(digest_size=8)
    update, digest = h.update, h.digest
    view = memoryview(data)
    for start in range(0, n * PREFIX_BLOCK_BYTES, PREFIX_BLOCK_BYTES):
        update(view[start:start + PREFIX_BLOCK_BYTES])
        append(from_bytes(digest(), "big") >> 1)
    return tuple(out)


def engine_block_ids(hashes: Sequence[int], block_size: int) -> tuple[tuple[int, ...], int]:
    """(ids, prompt tokens per id) for the engine's `add_request`: ids must cover a whole number
    of its KV blocks, so with blocks larger than PREFIX_BLOCK_TOKENS only every k-th id is kept
    (chained, it still names all the text before it)."""
    k = math.lcm(PREFIX_BLOCK_TOKENS, block_size) // PREFIX_BLOCK_TOKENS
    return tuple(hashes[k - 1::k]), PREFIX_BLOCK_TOKENS * k
