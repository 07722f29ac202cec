"""Deterministic prompt token counts without a tokenizer.

The simulator and the router's prompt-size estimate share these rules, so that both agree:

- text: ``max(1, ceil(len(text.encode("utf-8")) / 4))`` -- about 4 bytes per token, the usual
  rule of thumb for English with BPE tokenizers (Llama 3: ~4.2 characters per token);
- chat: for each message, the tokens of its content (the text rule; 0 for empty content) plus 4
  for the role and the template's delimiters; plus 2 for the assistant-turn header that the chat
  template appends. Content given as a list of parts counts the ``text`` of each text part; a
  ``name`` field is counted as text too; other parts (images) count nothing.
- a prompt given as token ids counts one token per id.

Pure functions: no I/O, no state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

BYTES_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 4
TOKENS_PER_REPLY = 2


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
