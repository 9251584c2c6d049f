"""``context-assembly --help`` and each command's ``--help``: plain text, every option explained."""

from __future__ import annotations

import argparse
import re

import pytest

from context_assembly.cli import _parser


def _commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as stop:
        _parser().parse_args([*argv, "--help"])
    assert stop.value.code == 0
    return capsys.readouterr().out


def test_every_command_is_listed_with_a_summary(capsys: pytest.CaptureFixture[str]) -> None:
    text = _help([], capsys)
    assert set(_commands()) == {"assemble", "serve", "replay"}
    for name in _commands():
        assert re.search(rf"^\s+{name}\s+\S", text, re.MULTILINE), name


@pytest.mark.parametrize("command", ["assemble", "serve", "replay"])
def test_every_option_of_a_command_is_explained(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = _commands()[command]
    text = _help([command], capsys)
    assert parser.description and parser.description.strip() in text
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help and len(action.help.split()) >= 5, action.dest
        name = action.option_strings[0] if action.option_strings else str(action.metavar)
        assert name in text
    # Plain text: no Markdown or reStructuredText markup, no line wider than a terminal.
    assert not re.search(r"`|\*\*|::", text)
    assert max(len(line) for line in text.splitlines()) <= 100
