"""`python -m tidegate.simulator`: the same as `tidegate sim`, without loading the other subcommands."""

from __future__ import annotations

import argparse
import sys

from tidegate.simulator import main as sim_main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tidegate sim", description="Run the engine simulator.")
    sim_main.configure_parser(parser)
    return sim_main.run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
