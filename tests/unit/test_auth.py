"""Admin token file parsing and role checks (controlplane.auth)."""

from __future__ import annotations

import pytest

from tidegate.config import ConfigError
from tidegate.controlplane.auth import Authenticator, Principal, parse_tokens


def test_parse_tokens_comments_and_roles() -> None:
    tokens = parse_tokens("# token,name,role\n\nabc,alice,operator\n  def , bob , viewer \n")
    assert tokens == {"abc": Principal("alice", "operator"), "def": Principal("bob", "viewer")}
    assert tokens["abc"].actor == "sre:alice"


@pytest.mark.parametrize(("text", "error"), [
    ("abc,alice\n", "line 1: expected 'token,name,role', got 2 fields"),
    ("# c\nabc,alice,admin\n", "line 2: role 'admin'"),
    ("abc,alice,viewer\nabc,bob,viewer\n", "line 2: duplicate token"),
    (",alice,viewer\n", "line 1: token and name must not be empty"),
    ("a b,alice,viewer\n", "line 1: the token contains whitespace"),
])
def test_parse_tokens_errors_name_the_line(text: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error) as err:
        parse_tokens(text, source="t.csv")
    assert "t.csv" in str(err.value)


def test_identify() -> None:
    auth = Authenticator({"abc": Principal("alice", "operator")})
    assert auth.identify((("authorization", "Bearer abc"),)) == Principal("alice", "operator")
    assert auth.identify((("authorization", "bearer abc"),)) == Principal("alice", "operator")
    assert auth.identify((("authorization", "Bearer nope"),)) == "unknown token"
    assert "missing" in str(auth.identify(()))
    assert "no tokens configured" in str(Authenticator({}).identify((("authorization", "Bearer abc"),)))
