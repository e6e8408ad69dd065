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


def test_version_says_the_release_and_the_api_it_speaks():
    """`ddpjob --version`, through the installed entry point's function, as kubectl's does."""
    import subprocess
    import sys

    from ddpjob import __version__

    done = subprocess.run([sys.executable, "-c", "import sys; from ddpjob.cli.main import main; sys.exit(main())",
                           "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"ddpjob {__version__} (API ddpjob.dev/v1alpha1)"
