"""Protobuf JSON encoding of etcd values, so `etcdctl get` shows readable records."""

from __future__ import annotations

from typing import TypeVar

from google.protobuf import json_format
from google.protobuf.message import Message

M = TypeVar("M", bound=Message)


class DecodeError(ValueError):
    """A stored value is not valid JSON for the expected record."""


def encode(msg: Message) -> bytes:
    return json_format.MessageToJson(msg, indent=None, sort_keys=True).encode()


def decode(data: bytes, cls: type[M]) -> M:
    try:
        return json_format.Parse(data.decode(), cls(), ignore_unknown_fields=True)
    except (json_format.ParseError, UnicodeDecodeError) as exc:
        raise DecodeError(f"cannot decode {cls.__name__}: {exc}") from exc
