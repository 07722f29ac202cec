"""Config resolution and validation: defaults < YAML < env < flags; errors name the field."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from pydantic import Field, ValidationError

from tidegate.config import ConfigBase, ConfigError, EtcdFields, add_flags, load, parse_endpoints


class SampleConfig(ConfigBase, EtcdFields):
    port: int = Field(8080, ge=0, le=65535, description="Port.")
    region: str = Field("local", description="Region.")
    verbose: bool = Field(False, description="Verbose.")


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_flags(p, SampleConfig)
    return p.parse_args(argv)


def test_defaults() -> None:
    cfg = load(SampleConfig, "sample", _parse([]), environ={})
    assert (cfg.port, cfg.region, cfg.verbose, cfg.etcd) == (8080, "local", False, ())


@pytest.mark.parametrize(
    ("yaml_text", "env", "argv", "expected_port"),
    [
        pytest.param("sample: {port: 1}", {}, [], 1, id="yaml"),
        pytest.param("sample: {port: 1}", {"TIDEGATE_PORT": "2"}, [], 2, id="env-over-yaml"),
        pytest.param("", {"TIDEGATE_PORT": "2", "TIDEGATE_SAMPLE_PORT": "3"}, [], 3, id="section-env-wins"),
        pytest.param("sample: {port: 1}", {"TIDEGATE_PORT": "2"}, ["--port", "4"], 4, id="flag-wins"),
    ],
)
def test_precedence(tmp_path: Path, yaml_text: str, env: dict[str, str], argv: list[str],
                    expected_port: int) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(yaml_text)
    cfg = load(SampleConfig, "sample", _parse(argv), config_file=f, environ=env)
    assert cfg.port == expected_port


def test_bad_value_names_field_and_source() -> None:
    with pytest.raises(ConfigError, match=r"sample\.port: .*\(from flag --port\)"):
        load(SampleConfig, "sample", _parse(["--port", "99999"]), environ={})
    with pytest.raises(ConfigError, match=r"sample\.port: .*\(from environment\)"):
        load(SampleConfig, "sample", _parse([]), environ={"TIDEGATE_PORT": "abc"})


def test_unknown_yaml_key(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("sample:\n  prot: 1\n")
    with pytest.raises(ConfigError, match=r"sample\.prot: unknown setting"):
        load(SampleConfig, "sample", _parse([]), config_file=f, environ={})


def test_yaml_not_mapping(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load(SampleConfig, "sample", _parse([]), config_file=f, environ={})


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load(SampleConfig, "sample", _parse([]), config_file=tmp_path / "nope.yaml", environ={})


def test_config_is_frozen() -> None:
    cfg = load(SampleConfig, "sample", _parse([]), environ={})
    with pytest.raises(ValidationError, match="frozen"):
        cfg.port = 1  # type: ignore[misc]


def test_bool_flag_and_log_level() -> None:
    cfg = load(SampleConfig, "sample", _parse(["--verbose", "--log-level", "DEBUG"]), environ={})
    assert cfg.verbose is True and cfg.log_level == "debug"
    with pytest.raises(ConfigError, match="log_level"):
        load(SampleConfig, "sample", _parse(["--log-level", "loud"]), environ={})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:2379", ("127.0.0.1:2379",)),
        ("a:1, b:2", ("a:1", "b:2")),
        ("http://a:1", ("a:1",)),
        ("", ()),
    ],
)
def test_parse_endpoints(text: str, expected: tuple[str, ...]) -> None:
    assert parse_endpoints(text) == expected


@pytest.mark.parametrize("bad", ["nohost", "a:", "a:0", "a:70000", ":5"])
def test_parse_endpoints_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="host:port"):
        parse_endpoints(bad)


def test_etcd_error_names_field() -> None:
    with pytest.raises(ConfigError, match=r"sample\.etcd"):
        load(SampleConfig, "sample", _parse(["--etcd", "bogus"]), environ={})
