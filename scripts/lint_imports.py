#!/usr/bin/env python3
"""Check the layering contracts in pyproject.toml (`[tool.importlinter]`) with import-linter.

import-linter's graph builder (grimp) finds a package's modules by walking the package's own folder, so it
cannot see the process packages that setuptools maps into the `tidegate` namespace from top-level folders
(`router/` installs as `tidegate.router`). This script lays the sources out as the wheel installs them, one
`tidegate/` tree built from `[tool.setuptools]` packages and package-dir, in a temporary folder, and runs
`lint-imports` there. Exit status: lint-imports' own (0 when every contract is kept).

    .venv/bin/python scripts/lint_imports.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"


def package_dirs(pyproject: Path = PYPROJECT) -> dict[str, Path]:
    """Each installed package -> the source folder setuptools takes it from (package-dir's rule: the longest
    mapped prefix, then the rest of the dotted name as folders)."""
    setuptools = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]
    mapping: dict[str, str] = setuptools.get("package-dir", {})
    dirs = {}
    for package in setuptools["packages"]:
        parts = package.split(".")
        for cut in range(len(parts), -1, -1):
            prefix = ".".join(parts[:cut])
            if prefix in mapping or cut == 0:
                base = Path(mapping.get(prefix, ""))
                dirs[package] = pyproject.parent / base.joinpath(*parts[cut:])
                break
    return dirs


def stage(dest: Path, pyproject: Path = PYPROJECT) -> Path:
    """Copy every package's modules into `dest` at their installed paths; return `dest`."""
    for package, source in package_dirs(pyproject).items():
        if not (source / "__init__.py").is_file():
            raise SystemExit(f"lint_imports: package {package} has no {source / '__init__.py'}")
        target = dest.joinpath(*package.split("."))
        target.mkdir(parents=True, exist_ok=True)
        for module in source.glob("*.py"):
            shutil.copy2(module, target / module.name)
    return dest


def lint(staged: Path, pyproject: Path = PYPROJECT) -> subprocess.CompletedProcess[str]:
    """Run lint-imports on a staged tree. lint-imports puts its working folder first on sys.path, so the
    staged `tidegate` is the one analysed, not an editable install's."""
    lint_imports = Path(sys.executable).with_name("lint-imports")
    if not lint_imports.exists():
        raise SystemExit(f"lint_imports: {lint_imports} not found; install the test extra: pip install -e '.[test]'")
    return subprocess.run([str(lint_imports), "--no-cache", str(pyproject)], cwd=staged,
                          capture_output=True, text=True, check=False)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="tidegate-layers-") as tmp:
        result = lint(stage(Path(tmp)))
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    return result.returncode


if __name__ == "__main__":
    raise SystemExit(main())
