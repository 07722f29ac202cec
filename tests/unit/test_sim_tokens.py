from __future__ import annotations

import pytest

from tidegate.simulator.tokens import count_chat_tokens, count_completion_prompt_tokens, count_prompt_tokens


@pytest.mark.parametrize(
    ("text", "expected"),
    [("", 1), ("a", 1), ("abcd", 1), ("abcde", 2), ("x" * 4000, 1000), ("é" * 4, 2), ("日本", 2)],
)
def test_text_rule(text, expected):
    assert count_prompt_tokens(text) == expected


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ([], 2),
        ([{"role": "user", "content": "hi"}], 2 + 4 + 1),
        ([{"role": "system", "content": "abcdefgh"}, {"role": "user", "content": "abcd"}], 2 + 6 + 5),
        ([{"role": "assistant", "content": None}], 6),
        ([{"role": "user", "content": [{"type": "text", "text": "abcd"}, {"type": "image_url"}]}], 7),
        ([{"role": "user", "content": "", "name": "bobby"}], 2 + 4 + 2),
    ],
)
def test_chat_rule(messages, expected):
    assert count_chat_tokens(messages) == expected


def test_completion_prompt_forms():
    assert count_completion_prompt_tokens("abcdefgh") == 2
    assert count_completion_prompt_tokens([1, 2, 3]) == 3
    assert count_completion_prompt_tokens(["abcd", "efgh"]) == 2
    with pytest.raises(TypeError):
        count_completion_prompt_tokens([])
    with pytest.raises(TypeError):
        count_chat_tokens([{"role": "user", "content": 5}])
