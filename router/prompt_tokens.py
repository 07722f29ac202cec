"""How the router counts a request's prompt tokens: the shared estimate, or a real tokenizer.

Default (`ESTIMATE`): tidegate/tokens.py's rule, ceil(UTF-8 bytes / 4) per text, plus 4 tokens
per chat message and 2 for the reply header. Its error on real text is measured in
docs/BENCHMARKS.md ("Prompt token estimate").

With `--tokenizer PATH` (`TokenizerCounter.from_file`): the model's own `tokenizer.json`, loaded
through Hugging Face `tokenizers` from a local file (never from the hub). Completion prompts are
then exact, special tokens included (as the engines count them); chat prompts count each
message's content and name exactly, while the chat template's framing stays the estimate's
4 per message + 2 (rendering the template would need the model's Jinja template, not the
tokenizer). Pure once loaded: `count` is a function of the text.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tidegate.config import ConfigError
from tidegate.tokens import chat_prompt, completion_prompt, count_chat_tokens, count_completion_prompt_tokens


@dataclass(frozen=True)
class PromptCounter:
    """text -> tokens, for chat content (no special tokens) and for a whole prompt (with them);
    None: the estimate's rule."""

    text_tokens: Callable[[str], int] | None = None
    prompt_tokens: Callable[[str], int] | None = None
    source: str = "estimate"  # or the tokenizer's path, for logs

    def chat(self, messages: Sequence[Mapping[str, Any]]) -> int:
        if self.text_tokens is None:
            return count_chat_tokens(messages)
        return count_chat_tokens(messages, self.text_tokens)

    def completion(self, prompt: str | Sequence[int] | Sequence[str]) -> int:
        if self.prompt_tokens is None:
            return count_completion_prompt_tokens(prompt)
        return count_completion_prompt_tokens(prompt, self.prompt_tokens)

    # With the estimate, the count encodes the prompt's text anyway: these also give the bytes
    # its prefix blocks are cut from (tidegate.tokens.prefix_bytes), so the text is encoded once
    # per request. None: a tokenizer counted, and the bytes are made only if a policy wants them.

    def chat_and_prefix(self, messages: Sequence[Mapping[str, Any]]) -> tuple[int, bytes | None]:
        if self.text_tokens is None:
            return chat_prompt(messages)
        return count_chat_tokens(messages, self.text_tokens), None

    def completion_and_prefix(self, prompt: str | Sequence[int] | Sequence[str]) -> tuple[int, bytes | None]:
        if self.prompt_tokens is None:
            return completion_prompt(prompt)
        return count_completion_prompt_tokens(prompt, self.prompt_tokens), None


ESTIMATE = PromptCounter()


def from_file(path: str) -> PromptCounter:
    """Load a tokenizer.json. ConfigError when `tokenizers` is missing or the file is unusable."""
    try:
        from tokenizers import Tokenizer  # optional dependency: only routers given --tokenizer need it
    except ImportError:
        raise ConfigError("--tokenizer needs the 'tokenizers' package: pip install 'tidegate[tokenizer]'") from None
    try:
        tok = Tokenizer.from_file(path)
    except Exception as exc:  # tokenizers raises plain Exception for unreadable and malformed files
        raise ConfigError(f"--tokenizer {path}: not a readable tokenizer.json ({exc})") from None

    def text_tokens(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False).ids) if text else 0

    def prompt_tokens(text: str) -> int:
        return max(1, len(tok.encode(text, add_special_tokens=True).ids))

    return PromptCounter(text_tokens, prompt_tokens, path)
