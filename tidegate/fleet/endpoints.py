"""The endpoints file that `tidegate up` writes and the CLI and tests read."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def default_path(environ: Mapping[str, str] | None = None) -> Path:
    """$TIDEGATE_HOME/endpoints.json, else $XDG_STATE_HOME/tidegate/endpoints.json,
    else ~/.local/state/tidegate/endpoints.json."""
    env = os.environ if environ is None else environ
    if env.get("TIDEGATE_HOME"):
        return Path(env["TIDEGATE_HOME"]) / "endpoints.json"
    state = Path(env["XDG_STATE_HOME"]) if env.get("XDG_STATE_HOME") else Path.home() / ".local" / "state"
    return state / "tidegate" / "endpoints.json"


def write(path: Path, data: Mapping[str, Any]) -> None:
    """Atomic write, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"no endpoints file at {path}: is `tidegate up` running?") from None
    if not isinstance(data, dict):
        raise ValueError(f"endpoints file {path} is not a JSON object")
    return data
