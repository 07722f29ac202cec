"""Typed, frozen configuration shared by every process.

Each process defines its own config model (a subclass of `ConfigBase`) in its
package. Values are resolved in this order, later wins:

    field defaults < YAML file section < TIDEGATE_<FIELD> < TIDEGATE_<SECTION>_<FIELD> < command-line flags

The YAML file (`--config FILE`) holds one mapping per subcommand, e.g.
``router: {port: 8080}``. Command-line flags are generated from the model's
fields (``listen_port`` -> ``--listen-port``) with the field's description as
help, so flags, YAML keys and environment variables cannot drift apart.
Errors name the section, the field and the source of the bad value.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tidegate.policy.admission import DEFAULT_MAX_QUEUE, AdmissionConfig, check_flag, config_from_text

if TYPE_CHECKING:
    from tidegate.store.etcdsec import EtcdSecurity

ENV_PREFIX = "TIDEGATE_"

C = TypeVar("C", bound="ConfigBase")


class ConfigError(ValueError):
    """Configuration is invalid; the message names the field and where it came from."""


class ConfigBase(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    log_level: str = Field("info", description="Log level: debug, info, warning, error.")
    log_json: bool | None = Field(
        None, description="Log JSON lines (default: JSON unless stderr is a terminal)."
    )

    @field_validator("log_level")
    @classmethod
    def _level(cls, v: str) -> str:
        if v.lower() not in {"debug", "info", "warning", "error"}:
            raise ValueError("must be one of debug, info, warning, error")
        return v.lower()


def parse_endpoints(value: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """'h1:p1,h2:p2' -> ('h1:p1', 'h2:p2'); validates host:port."""
    if value is None or value == "":
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    out = []
    for item in items:
        item = item.strip()
        if not item:
            continue
        if item.startswith("http://"):
            item = item[len("http://"):]
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not (0 < int(port) < 65536):
            raise ValueError(f"{item!r} is not host:port")
        out.append(item)
    return tuple(out)


class EtcdFields(BaseModel):
    """Fields of every process that talks to etcd (mixed into their config)."""

    etcd: tuple[str, ...] = Field(
        (), description="etcd endpoints, comma-separated host:port (e.g. 127.0.0.1:2379,10.0.0.2:2379)."
    )
    etcd_timeout_s: float = Field(2.0, gt=0, description="Timeout of each etcd call, seconds.")
    etcd_ca_file: str = Field("", description="CA certificate(s) that signed etcd's server certificate; "
                              "turns on TLS to etcd.")
    etcd_cert_file: str = Field("", description="Client certificate for etcd (etcd --client-cert-auth); with etcd "
                                "auth on and no --etcd-user, etcd takes its common name as the user.")
    etcd_key_file: str = Field("", description="Private key of --etcd-cert-file.")
    etcd_user: str = Field("", description="etcd user (etcd auth); its password comes from --etcd-password-file.")
    etcd_password_file: str = Field("", description="File holding the password of --etcd-user.")

    @field_validator("etcd", mode="before")
    @classmethod
    def _endpoints(cls, v: Any) -> tuple[str, ...]:
        return parse_endpoints(v)

    @field_validator("etcd_ca_file", "etcd_cert_file", "etcd_key_file", "etcd_password_file")
    @classmethod
    def _readable(cls, v: str) -> str:
        if v and not os.access(v, os.R_OK):
            raise ValueError(f"{v} is not a readable file")
        return v

    @model_validator(mode="after")
    def _etcd_pairs(self) -> EtcdFields:
        if bool(self.etcd_cert_file) != bool(self.etcd_key_file):
            raise ValueError("etcd_cert_file and etcd_key_file go together")
        if bool(self.etcd_user) != bool(self.etcd_password_file):
            raise ValueError("etcd_user and etcd_password_file go together")
        return self

    def etcd_security(self) -> EtcdSecurity | None:
        """How to reach etcd (TLS, client certificate, user); None for plain, unauthenticated etcd."""
        from tidegate.store.etcdsec import EtcdSecurity

        if not (self.etcd_ca_file or self.etcd_cert_file or self.etcd_user):
            return None
        password = Path(self.etcd_password_file).read_text().strip() if self.etcd_password_file else ""
        return EtcdSecurity(ca_file=self.etcd_ca_file, cert_file=self.etcd_cert_file, key_file=self.etcd_key_file,
                            user=self.etcd_user, password=password)

    def etcd_security_argv(self) -> list[str]:
        """The flags that pass this etcd security on to a child process (never the password itself)."""
        out: list[str] = []
        for name in ("etcd_ca_file", "etcd_cert_file", "etcd_key_file", "etcd_user", "etcd_password_file"):
            if getattr(self, name):
                out += [_flag(name), getattr(self, name)]
        return out



class AdmissionFields(BaseModel):
    """The router admission flags of `tidegate router` and `tidegate simulate` (mixed into their
    config): one definition, so the simulator runs what the router would be configured with."""

    admission: bool = Field(
        False, description="Admission for policies that predict latency (tidegate): hold requests no replica "
        "would serve within their SLO in a bounded queue per priority class, dispatch them in class order as "
        "capacity frees, and answer 429 with Retry-After and x-tidegate-reject-reason (queue_full, "
        "deadline_unmeetable, shed, queue_timeout) when they cannot make their deadline.")
    admission_queue: str = Field(str(DEFAULT_MAX_QUEUE),
                                 description="Admission: requests held per pool and class: one number for every "
                                             "class, or critical=N,standard=N,sheddable=N.")
    admission_max_wait: str = Field("30s", description="Admission: longest a request is held, per class: one "
                                                       "duration (30s, 500ms) or critical=30s,standard=10s,...")
    tpot_guard: bool = Field(True, description="Admission: hold requests that would take a replica's outstanding "
                                               "prefill past what its TPOT target allows (TPOT protection).")
    admission_decide: str = Field("50ms", description="Admission: a request held this long (a duration, e.g. 50ms, "
                                                     "or 'off') is committed: served, late if it must, and never "
                                                     "rejected for its deadline after it, so every 429 but a "
                                                     "max-wait timeout comes within this of arrival (costs "
                                                     "goodput under overload: docs/OPERATIONS.md).")
    admission_ttft_margin: str = Field("0.95", description="Admission: every deadline test adds the error of "
                                                           "this router's latest TTFT predictions at this quantile "
                                                           "(a number in (0, 1)), so requests it would serve late "
                                                           "are rejected instead; 'off': none.")

    @field_validator("admission_queue", "admission_max_wait", "admission_decide", "admission_ttft_margin")
    @classmethod
    def _admission_values(cls, v: str, info: Any) -> str:
        return check_flag(info.field_name, v)

    def admission_config(self, peer_report_s: float | None = None) -> AdmissionConfig | None:
        """The queue's config; None without --admission. `peer_report_s`: how stale peer routers'
        held reports may be when they arrive (AdmissionConfig.peer_report_s; None: its default)."""
        if not self.admission:
            return None
        cfg = config_from_text(self.admission_queue, self.admission_max_wait, self.tpot_guard,
                               self.admission_decide, self.admission_ttft_margin)
        return cfg if peer_report_s is None else dataclasses.replace(cfg, peer_report_s=peer_report_s)


# ---------------------------------------------------------------- argparse glue


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _base_type(annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _base_type(args[0]) if len(args) == 1 else str
    return annotation


def add_flags(parser: argparse.ArgumentParser, cls: type[ConfigBase], skip: set[str] | None = None) -> None:
    """Add one flag per config field. Defaults are suppressed so that only flags the
    user gave override the YAML file and the environment."""
    skip = skip or set()
    parser.add_argument(
        "--config", type=Path, default=None, metavar="FILE",
        help="YAML config file; its section for this subcommand sets any flag below.",
    )
    for name, field in cls.model_fields.items():
        if name in skip:
            continue
        ann = _base_type(field.annotation)
        default = field.default if field.default is not None else "none"
        if callable(field.default_factory):  # pragma: no cover - no such fields today
            default = "computed"
        if isinstance(default, tuple):
            default = ",".join(str(x) for x in default) or "none"
        helptext = f"{field.description or ''} [env TIDEGATE_{name.upper()}; default: {default}]"
        kwargs: dict[str, Any] = {"default": argparse.SUPPRESS, "help": helptext, "dest": name}
        if ann is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["metavar"] = name.upper()
        parser.add_argument(_flag(name), **kwargs)


def _env_values(cls: type[ConfigBase], section: str, environ: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in cls.model_fields:
        for key in (f"{ENV_PREFIX}{name.upper()}", f"{ENV_PREFIX}{section.upper()}_{name.upper()}"):
            if key in environ:
                out[name] = environ[key]
    return out


def _read_yaml(path: Path, section: str) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path}: top level must be a mapping of subcommand sections")
    body = raw.get(section, {}) or {}
    if not isinstance(body, dict):
        raise ConfigError(f"config file {path}: section {section!r} must be a mapping")
    return {str(k).replace("-", "_"): v for k, v in body.items()}


def load(
    cls: type[C],
    section: str,
    flags: Mapping[str, Any] | argparse.Namespace | None = None,
    config_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> C:
    """Resolve a config model from defaults, YAML, environment and flags."""
    environ = os.environ if environ is None else environ
    if isinstance(flags, argparse.Namespace):
        flags = {k: v for k, v in vars(flags).items() if k in cls.model_fields}
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    if config_file is not None:
        for k, v in _read_yaml(config_file, section).items():
            values[k] = v
            sources[k] = f"config file {config_file}"
    for k, v in _env_values(cls, section, environ).items():
        values[k] = v
        sources[k] = "environment"
    for k, v in (flags or {}).items():
        values[k] = v
        sources[k] = f"flag {_flag(k)}"
    try:
        return cls.model_validate(values)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"]) or "(config)"
            field = str(err["loc"][0]) if err["loc"] else ""
            src = sources.get(field, "default")
            msg = err["msg"]
            if err["type"] == "extra_forbidden":
                msg = "unknown setting"
            problems.append(f"{section}.{loc}: {msg} (from {src})")
        raise ConfigError("invalid configuration: " + "; ".join(problems)) from None
