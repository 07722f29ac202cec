"""Telemetry credentials, endpoint networks and replica-id claims (controlplane.telemetry_auth): tables."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from tidegate.config import ConfigError
from tidegate.controlplane.telemetry_auth import (
    ANONYMOUS,
    AgentIdentity,
    AllowedNetworks,
    CredentialsFile,
    ReplicaClaims,
    StaticCredentials,
    TelemetryAccess,
    authorize,
    identify,
    parse_credentials,
    token_digest,
)
from tidegate.errors import PermissionDeniedError, ReplicaHeldError, UnauthenticatedError
from tidegate.fleet.up import write_agent_credentials

TOKEN_A, TOKEN_B = "token-of-node-a", "token-of-node-b"
CREDS_TEXT = f"""# identity,sha256,patterns
node-a,{token_digest(TOKEN_A)},replica-0 replica-1
node-b,sha256:{token_digest(TOKEN_B).upper()},pool-b-*
"""
CREDS = parse_credentials(CREDS_TEXT)
LOOPBACK = AllowedNetworks.parse(["127.0.0.0/8", "::1/128", "localhost"])
NETS = AllowedNetworks.parse(["10.0.0.0/8", "fd00::/8", "*.svc.cluster.local", "sim-?"])


def test_digest_is_sha256_hex() -> None:
    assert token_digest("abc") == hashlib.sha256(b"abc").hexdigest()


def test_parse_credentials() -> None:
    assert CREDS[token_digest(TOKEN_A)] == AgentIdentity("node-a", ("replica-0", "replica-1"))
    assert CREDS[token_digest(TOKEN_B)] == AgentIdentity("node-b", ("pool-b-*",))
    # One identity may hold several tokens (rotation).
    two = parse_credentials(f"a,{token_digest('x')},r1\na,{token_digest('y')},r1\n")
    assert {i.name for i in two.values()} == {"a"} and len(two) == 2


@pytest.mark.parametrize(("text", "error"), [
    pytest.param("node-a,abc\n", "line 1: expected 'identity,sha256,patterns', got 2 fields", id="fields"),
    pytest.param(f"# c\nnode a,{'0' * 64},r\n", "line 2: identity 'node a'", id="identity-space"),
    pytest.param(f",{'0' * 64},r\n", "line 1: identity ''", id="identity-empty"),
    pytest.param("node-a,my-plain-token,r\n", "line 1: the second field must be the SHA-256", id="token-not-hash"),
    pytest.param(f"node-a,{'0' * 63},r\n", "SHA-256 of the token", id="short-hash"),
    pytest.param(f"node-a,{'0' * 64},\n", "line 1: identity 'node-a' has no replica-id patterns", id="no-patterns"),
    pytest.param(f"node-a,{'0' * 64},r;rm\n", "pattern 'r;rm'", id="bad-pattern"),
    pytest.param(f"a,{'0' * 64},r\nb,{'0' * 64},s\n", "line 2: duplicate token digest", id="duplicate"),
    pytest.param("# only a comment\n\n", "no credentials", id="empty"),
])
def test_malformed_credentials_give_a_clear_error(text: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error) as err:
        parse_credentials(text, source="creds.csv")
    assert "creds.csv" in str(err.value)
    assert "my-plain-token" not in str(err.value)  # a pasted token is never echoed


@pytest.mark.parametrize(("token", "replica_id", "endpoint", "error"), [
    pytest.param(TOKEN_A, "replica-0", "http://127.0.0.1:8000", None, id="match"),
    pytest.param(TOKEN_A, "replica-1", "http://localhost:8000", None, id="second-pattern-localhost"),
    pytest.param(TOKEN_B, "pool-b-17", "https://[::1]:8443", None, id="glob-ipv6"),
    pytest.param(None, "replica-0", "http://127.0.0.1:8000", UnauthenticatedError, id="no-token"),
    pytest.param("", "replica-0", "http://127.0.0.1:8000", UnauthenticatedError, id="empty-token"),
    pytest.param("wrong", "replica-0", "http://127.0.0.1:8000", UnauthenticatedError, id="wrong-token"),
    pytest.param(TOKEN_A.upper(), "replica-0", "http://127.0.0.1:8000", UnauthenticatedError, id="case-matters"),
    pytest.param(TOKEN_A, "replica-2", "http://127.0.0.1:8000", PermissionDeniedError, id="pattern-mismatch"),
    pytest.param(TOKEN_A, "replica-0x", "http://127.0.0.1:8000", PermissionDeniedError, id="no-prefix-match"),
    pytest.param(TOKEN_B, "replica-0", "http://127.0.0.1:8000", PermissionDeniedError, id="other-identity-id"),
    pytest.param(TOKEN_A, "replica-0", "http://203.0.113.9:8000", PermissionDeniedError, id="outside-networks"),
    pytest.param(TOKEN_A, "replica-0", "http://evil.example:8000", PermissionDeniedError, id="hostname-not-allowed"),
    pytest.param(TOKEN_A, "replica-0", "http://127.1:8000", PermissionDeniedError, id="short-ip-is-a-hostname"),
    pytest.param(TOKEN_A, "replica-0", "http://[::ffff:203.0.113.9]:80", PermissionDeniedError, id="mapped-v6"),
    pytest.param(TOKEN_A, "replica-0", "ftp://127.0.0.1/", PermissionDeniedError, id="scheme"),
    pytest.param(TOKEN_A, "replica-0", "http://u:p@127.0.0.1:8000", PermissionDeniedError, id="userinfo"),
    pytest.param(TOKEN_A, "replica-0", "http://127.0.0.1:99999", PermissionDeniedError, id="bad-port"),
    pytest.param(TOKEN_A, "replica-0", "", PermissionDeniedError, id="no-endpoint"),
])
def test_identify_and_authorize(token: str | None, replica_id: str, endpoint: str,
                                error: type[Exception] | None) -> None:
    def check() -> None:
        authorize(identify(CREDS, token), replica_id, endpoint, LOOPBACK)

    if error is None:
        check()
        return
    with pytest.raises(error) as err:
        check()
    if token:
        assert token not in str(err.value)  # never echo a credential


def test_refusal_messages_say_what_to_do() -> None:
    with pytest.raises(UnauthenticatedError, match="--telemetry-credentials-file"):
        identify({}, TOKEN_A)
    with pytest.raises(UnauthenticatedError, match="--telemetry-token-file"):
        identify(CREDS, None)
    with pytest.raises(PermissionDeniedError, match=r"outside the allowed networks \(127.0.0.0/8,::1/128,"
                       r"localhost\).*--telemetry-allowed-networks"):
        LOOPBACK.check("http://10.1.2.3:8000")
    with pytest.raises(PermissionDeniedError, match="may not speak for replica id 'replica-9'"):
        authorize(identify(CREDS, TOKEN_A), "replica-9", "http://127.0.0.1:1", LOOPBACK)


@pytest.mark.parametrize(("endpoint", "allowed"), [
    ("http://10.3.4.5:8000", True),
    ("http://11.0.0.1:8000", False),
    ("http://[fd00::5]:8000", True),
    ("http://vllm-0.ns.svc.cluster.local:8000", True),
    ("http://VLLM-0.NS.SVC.CLUSTER.LOCAL:8000", True),
    ("http://svc.cluster.local.evil.example:8000", False),
    ("http://sim-0:8000", True),
    ("http://sim-10:8000", False),
    ("http://127.0.0.1:8000", False),
])
def test_allowed_networks(endpoint: str, allowed: bool) -> None:
    if allowed:
        NETS.check(endpoint)
    else:
        with pytest.raises(PermissionDeniedError):
            NETS.check(endpoint)


@pytest.mark.parametrize(("entries", "error"), [
    (["10.0.0.0/33"], "'10.0.0.0/33' is not a network"),
    (["10.0.0.1/8"], "'10.0.0.1/8' is not a network"),
    (["300.1.1.1"], "'300.1.1.1' is not a network"),
    (["bad host!"], "neither a CIDR nor a host-name glob"),
    ([" ", ""], "no allowed networks"),
])
def test_allowed_networks_errors(entries: list[str], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        AllowedNetworks.parse(entries)


def test_claims_bind_a_replica_id_to_one_identity() -> None:
    c = ReplicaClaims()
    assert c.claim("r1", "node-a", 1, remembered=False) is None
    # Another identity is refused while node-a's stream is open, remembered or not.
    with pytest.raises(ReplicaHeldError):
        c.claim("r1", "node-b", 2, remembered=True)
    with pytest.raises(ReplicaHeldError):
        c.claim("r1", "node-b", 2, remembered=False)
    assert c.holds("r1", 1)
    # The same identity (a restarted agent) takes over and supersedes stream 1.
    assert c.claim("r1", "node-a", 3, remembered=True) == 1
    assert not c.holds("r1", 1) and c.holds("r1", 3)
    assert not c.release("r1", 1)  # the superseded stream does not release the claim
    assert c.release("r1", 3)
    # Closed, but the fleet still remembers r1: only node-a may register it again.
    with pytest.raises(PermissionDeniedError) as err:
        c.claim("r1", "node-b", 4, remembered=True)
    assert not isinstance(err.value, ReplicaHeldError)
    assert c.claim("r1", "node-a", 5, remembered=True) is None
    assert c.release("r1", 5)
    # Once the fleet forgot r1, another permitted identity may register it.
    assert c.claim("r1", "node-b", 6, remembered=False) is None
    with pytest.raises(ReplicaHeldError):
        c.claim("r1", "node-a", 7, remembered=True)


def test_access_insecure_and_unconfigured() -> None:
    insecure = TelemetryAccess(None, LOOPBACK)
    assert insecure.identify(None) is ANONYMOUS
    with pytest.raises(PermissionDeniedError):  # endpoints are checked even then
        insecure.authorize(ANONYMOUS, "any", "http://203.0.113.1:80")
    with pytest.raises(UnauthenticatedError):
        TelemetryAccess(StaticCredentials({}), LOOPBACK).identify(TOKEN_A)


def test_credentials_file_reloads_and_keeps_the_last_good(tmp_path: Path) -> None:
    path = tmp_path / "creds.csv"
    path.write_text(CREDS_TEXT)
    f = CredentialsFile(path, check_every_s=0)
    assert identify(f.current(), TOKEN_A).name == "node-a"
    # Rotation: node-a gets a new token, the old one is revoked.
    new = CREDS_TEXT.replace(token_digest(TOKEN_A), token_digest("rotated-a"))
    path.write_text(new)
    os.utime(path, ns=(1, 1))  # a changed stamp even within one clock tick
    assert identify(f.current(), "rotated-a").name == "node-a"
    with pytest.raises(UnauthenticatedError):
        identify(f.current(), TOKEN_A)
    with capture_logs() as logs:
        path.write_text("garbage\n")
        os.utime(path, ns=(2, 2))
        assert identify(f.current(), "rotated-a").name == "node-a"
        f.current()
    assert [e["event"] for e in logs] == ["telemetry_credentials_invalid"]  # once per change


def test_credentials_file_is_looked_at_once_per_interval(tmp_path: Path) -> None:
    path = tmp_path / "creds.csv"
    path.write_text(CREDS_TEXT)
    now = [100.0]
    access = TelemetryAccess(CredentialsFile(path, clock=lambda: now[0], check_every_s=1.0), LOOPBACK)
    assert not access.revoked(TOKEN_A) and access.revoked("not-issued") and access.revoked(None)
    path.write_text(CREDS_TEXT.replace(token_digest(TOKEN_A), token_digest("rotated-a")))
    os.utime(path, ns=(1, 1))
    now[0] += 0.5
    assert not access.revoked(TOKEN_A)  # not looked at yet
    now[0] += 0.5
    assert access.revoked(TOKEN_A) and not access.revoked("rotated-a")
    assert not TelemetryAccess(None, LOOPBACK).revoked(None)  # insecure: nothing to revoke


def test_credentials_file_missing_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="telemetry credentials file .*nope.csv"):
        CredentialsFile(tmp_path / "nope.csv")


def test_up_writes_one_bound_token_per_agent(tmp_path: Path) -> None:
    paths, creds = write_agent_credentials(tmp_path, ["replica-0", "replica-1"])
    parsed = parse_credentials(creds.read_text())
    tokens = {rid: Path(p).read_text().strip() for rid, p in paths.items()}
    assert tokens["replica-0"] != tokens["replica-1"]
    assert identify(parsed, tokens["replica-0"]) == AgentIdentity("agent-replica-0", ("replica-0",))
    assert tokens["replica-0"] not in creds.read_text()  # the file holds digests only
    for p in (*map(Path, paths.values()), creds):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "agent-tokens").stat().st_mode) == 0o700
