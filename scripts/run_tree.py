"""Run `tidegate` from another source tree with this venv's packages: A/B benchmarks of two
commits without a second install (e.g. `bench_router.py --baseline-cmd "python scripts/run_tree.py
/tmp/old"` where /tmp/old is `git archive OLD | tar -x -C /tmp/old`).

    .venv/bin/python scripts/run_tree.py TREE router --etcd ...
    .venv/bin/python scripts/run_tree.py TREE scripts/peer_view_probe.py ...   # a script on TREE's packages

Maps every package of TREE's pyproject `[tool.setuptools.package-dir]` onto TREE's folders before
anything imports them, so the editable install's own mapping (this checkout) never applies.
"""

from __future__ import annotations

import importlib.util
import runpy
import sys
import tomllib
from pathlib import Path


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = Path(sys.argv.pop(1)).resolve()
    mapping = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for name in sorted(mapping, key=lambda n: n.count(".")):  # parents first
        path = root / mapping[name]
        spec = importlib.util.spec_from_file_location(name, path / "__init__.py",
                                                      submodule_search_locations=[str(path)])
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)
    if len(sys.argv) > 1 and sys.argv[1].endswith(".py"):  # a script of this checkout, on TREE's packages
        script = sys.argv.pop(1)
        sys.argv[0] = script
        runpy.run_path(script, run_name="__main__")
        return 0
    from tidegate.cli.main import main as tidegate_main
    return int(tidegate_main() or 0)


if __name__ == "__main__":
    sys.exit(main())
