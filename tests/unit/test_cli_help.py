"""`tidegate --help` and every subcommand's --help work and explain every flag."""

from __future__ import annotations

import argparse

import pytest

from tidegate.cli.main import COMMANDS, build_parser, main


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _undocumented(parser: argparse.ArgumentParser, path: str) -> list[str]:
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                missing += _undocumented(child, f"{path} {name}")
            continue
        if action.dest == "help":
            continue
        if not (action.help or "").strip() or action.help == argparse.SUPPRESS:
            missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    return missing


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_flag_has_help(command: str) -> None:
    parser = _subparser(build_parser(only=command), command)
    assert _undocumented(parser, f"tidegate {command}") == []


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_subcommand_help_exits_zero(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    assert "usage: tidegate " + command in capsys.readouterr().out


def test_top_level_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS)


def test_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["frobnicate"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
