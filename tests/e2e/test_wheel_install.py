"""A clean install as a user gets it: build a wheel from a copy of the tracked sources, install it
(with its dependencies, from the package index or pip's cache) into a fresh virtual environment
outside the source tree, and run `tidegate demo --duration 10` from there.

What it guards: everything installs under the `tidegate` namespace (nothing generic such as
`router` or `agent` lands in site-packages), the wheel carries every module and data file the
processes load (profiles, calibration, the sample trace), and the console script works without
the source tree on the path."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
GENERIC = ("agent", "router", "controlplane", "simulator", "fleetsim")


def _run(argv: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None) -> str:
    out = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert out.returncode == 0, f"{argv[:4]} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


def _tracked_copy(dst: Path) -> None:
    """The files git tracks, so build leftovers and the developer's venv stay out of the wheel."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs a git checkout to know which files are tracked")
    names = _run(["git", "ls-files", "-z"], REPO, 60).split("\0")
    for name in filter(None, names):
        src = REPO / name
        if src.is_file():
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / name)


def test_wheel_installs_under_the_namespace_and_runs_the_demo(tmp_path: Path) -> None:
    src, dist, home = tmp_path / "src", tmp_path / "dist", tmp_path / "home"
    src.mkdir(), dist.mkdir(), home.mkdir()
    _tracked_copy(src)
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(dist), str(src)],
         tmp_path, 600)
    (wheel,) = dist.glob("tidegate-*.whl")

    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    tops = {n.split("/", 1)[0] for n in names}
    assert tops == {"tidegate", next(t for t in tops if t.endswith(".dist-info"))}, tops
    for pkg in GENERIC:
        assert f"tidegate/{pkg}/__init__.py" in names, f"{pkg} is missing from the wheel"
    assert "tidegate/simulator/profiles/profiles.yaml" in names
    assert any(n.startswith("tidegate/simulator/calibration/") and n.endswith(".csv") for n in names)
    assert "tidegate/data/azure_conv_sample.csv" in names

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path, 300)
    py = venv / "bin" / "python"
    _run([str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(wheel)], tmp_path, 900)

    # Nothing generic is importable, and tidegate comes from the fresh venv, not from the source tree.
    probe = ("import importlib.util, tidegate, tidegate.router.main; "
             f"print(tidegate.__file__); print([m for m in {GENERIC!r} if importlib.util.find_spec(m)])")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["HOME"] = str(home)
    lines = _run([str(py), "-c", probe], home, 60, env).splitlines()
    assert lines[0].startswith(str(venv)), lines
    assert lines[1] == "[]", f"generic top-level modules installed: {lines[1]}"

    proc = subprocess.Popen(
        [str(venv / "bin" / "tidegate"), "demo", "--duration", "10", "--replicas", "2",
         "--run-dir", str(tmp_path / "run"), "--endpoints-file", str(tmp_path / "endpoints.json"),
         "--log-level", "warning"],
        cwd=home, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out[-4000:]
    assert any(line.startswith("SLO ") and "% of requests" in line for line in out.splitlines()), out[-4000:]
    completed = next(line for line in out.splitlines() if line.startswith("requests "))
    assert " failed 0 " in completed and " completed 0 " not in completed, completed
