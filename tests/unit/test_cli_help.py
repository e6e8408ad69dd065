"""The help texts say what each command does for the user, not how the code is organised."""
from __future__ import annotations

import pytest

from ddpjob.cli.main import build_parser

pytestmark = pytest.mark.unit


def _subparsers(parser):
    action = next(a for a in parser._actions if a.dest == "command")
    return action.choices


def test_top_level_help_lists_what_each_command_is_for():
    text = build_parser().format_help()
    for command in _subparsers(build_parser()):
        assert f"ddpjob {command}" in text or f"  {command} " in text, command
    assert "module" not in text.lower() and "kubectl-ddpjob" in text


@pytest.mark.parametrize("name", list(_subparsers(build_parser())))
def test_every_command_help_speaks_of_the_user_not_the_code(name):
    text = _subparsers(build_parser())[name].format_help()
    for word in ("module", "subcommand lives", "ddpjob.controller", "ddpjob.api"):
        assert word not in text, (name, word)
