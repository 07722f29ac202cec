"""Child processes of `tidegate up`: start, discover their port, watch, stop.

Every child runs in its own session (so one signal reaches its whole process
group) and asks the kernel to SIGTERM it when the launcher dies
(PR_SET_PDEATHSIG), so a killed launcher leaves no orphans. stdout and stderr
go to files in the run directory; a child started with port 0 announces its
bound port as one JSON line `{"event": "listening", "port": N}` on stdout.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

_PR_SET_PDEATHSIG = 1


class ChildStartError(RuntimeError):
    """A child process exited or did not announce its port in time."""


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def tidegate_argv(*args: str) -> list[str]:
    """argv that runs a `tidegate` subcommand with this interpreter."""
    return [sys.executable, "-m", "tidegate.cli.main", *args]


@dataclass
class Child:
    name: str
    argv: list[str]
    run_dir: Path
    env: dict[str, str] | None = None
    proc: subprocess.Popen[bytes] | None = None
    port: int | None = None
    reported_exit: bool = field(default=False)

    @property
    def stdout_path(self) -> Path:
        return self.run_dir / f"{self.name}.out"

    @property
    def log_path(self) -> Path:
        return self.run_dir / f"{self.name}.log"

    def start(self) -> None:
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        with open(self.stdout_path, "wb") as out, open(self.log_path, "ab") as err:
            self.proc = subprocess.Popen(
                self.argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )
        log.debug("child_started", child=self.name, pid=self.proc.pid)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_port(self, timeout_s: float = 30.0) -> int:
        """Wait for the child's `listening` line and return the port."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                for line in self.stdout_path.read_text().splitlines():
                    try:
                        msg = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(msg, dict) and msg.get("event") == "listening":
                        self.port = int(msg["port"])
                        return self.port
            except OSError:
                pass
            if not self.alive():
                raise ChildStartError(f"{self.name} exited (code {self.returncode()}) before listening; "
                                      f"last log lines:\n{self.log_tail()}")
            time.sleep(0.05)
        raise ChildStartError(f"{self.name} did not announce its port within {timeout_s:.0f}s; "
                              f"last log lines:\n{self.log_tail()}")

    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def signal(self, sig: int) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM the child's process group, then SIGKILL after the grace period."""
        if self.proc is None:
            return
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            log.warning("child_killed", child=self.name, pid=self.proc.pid)
            self.signal(signal.SIGKILL)
            self.proc.wait(timeout=5)
        # Stragglers in the child's group (it may have spawned helpers).
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def stop_all(children: list[Child], grace_s: float = 5.0) -> None:
    """Stop children in reverse start order: front doors first, etcd last."""
    for child in reversed(children):
        child.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for child in reversed(children):
        if child.proc is None:
            continue
        try:
            child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for child in reversed(children):
        child.stop(grace_s=1.0)
