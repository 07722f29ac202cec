"""The layering contracts (pyproject.toml [tool.importlinter]) hold, and they can fail.

import-linter runs on the tree as the wheel installs it (scripts/lint_imports.py stages it); the
failing cases plant one import that breaks a rule in a staged copy and check that it is named.
"""

from __future__ import annotations

import runpy
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = SimpleNamespace(**runpy.run_path(str(ROOT / "scripts" / "lint_imports.py")))


def _contract(contract_id: str) -> dict:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    return next(c for c in contracts if c["id"] == contract_id)


def test_the_contracts_hold(tmp_path: Path) -> None:
    result = LINT.lint(LINT.stage(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 broken." in result.stdout, result.stdout


def test_the_layers_name_every_top_level_package_and_module_that_exists() -> None:
    """exhaustive=true catches a module missing from the layers; this catches a layer that names a
    module which no longer exists (a rename would silently drop it from the check)."""
    layered = {name.strip() for layer in _contract("layers")["layers"] for name in layer.replace("|", ":").split(":")}
    existing = set()
    for package in LINT.package_dirs():
        parts = package.split(".")
        if len(parts) == 2:
            existing.add(parts[1])
    existing |= {p.stem for p in (ROOT / "tidegate").glob("*.py") if p.name != "__init__.py"}
    assert layered == existing


def _plant(staged: Path, module: str, line: str) -> None:
    path = staged.joinpath(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    path.write_text(path.read_text() + f"\n{line}\n")


@pytest.mark.parametrize(("importer", "planted", "expected"), [
    # the core imports a process
    ("tidegate.codec", "import tidegate.router.parse", "tidegate.codec -> tidegate.router.parse"),
    # a process imports another process
    ("tidegate.router.tables", "from tidegate.agent import rates", "tidegate.router.tables -> tidegate.agent.rates"),
    # a process imports a tool
    ("tidegate.simulator.engine", "import tidegate.fleetsim.workload",
     "tidegate.simulator.engine -> tidegate.fleetsim.workload"),
    # a pure policy imports the store
    ("tidegate.policy.weights", "import tidegate.store.api", "tidegate.policy.weights -> tidegate.store.api"),
])
def test_a_forbidden_import_breaks_a_contract(tmp_path: Path, importer: str, planted: str, expected: str) -> None:
    staged = LINT.stage(tmp_path)
    _plant(staged, importer, planted)
    result = LINT.lint(staged)
    assert result.returncode != 0
    assert expected in result.stdout, result.stdout


def test_a_new_top_level_module_must_be_given_a_layer(tmp_path: Path) -> None:
    staged = LINT.stage(tmp_path)
    (staged / "tidegate" / "unplaced.py").write_text('"""A module no layer names."""\n')
    result = LINT.lint(staged)
    assert result.returncode != 0
    assert "tidegate.unplaced" in result.stdout, result.stdout


def test_staging_follows_the_package_dir_mapping() -> None:
    dirs = LINT.package_dirs()
    assert dirs["tidegate.router"] == ROOT / "router"
    assert dirs["tidegate.ops.commands"] == ROOT / "tidegate" / "ops" / "commands"
    assert dirs["tidegate"] == ROOT / "tidegate"
