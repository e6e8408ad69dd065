"""`ddpjob completion bash|zsh`: a shell completion script for ddpjob (and kubectl-ddpjob).

  source <(ddpjob completion bash)            # this shell; add it to ~/.bashrc to keep it
  ddpjob completion zsh > "${fpath[1]}/_ddpjob"

It completes the commands and their flags (taken from ddpjob's own parser, so they never drift)
and, after a command that takes a JOB, the DDPJobs of the namespace given with -n, as
`ddpjob list -o name` reads them from your cluster.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any, Optional, TextIO

SHELLS = ("bash", "zsh")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "completion", help="print a shell completion script (bash, zsh)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shell", choices=SHELLS, help="the shell to complete in")
    parser.set_defaults(handler=run_completion)
    return parser


def commands(parser: argparse.ArgumentParser) -> dict[str, tuple[list[str], bool]]:
    """Each command (and alias) -> (its flags, whether it takes a JOB)."""
    found: dict[str, tuple[list[str], bool]] = {}
    for action in parser._actions:  # argparse has no public walk of its subcommands
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                flags = sorted(opt for a in sub._actions for opt in a.option_strings if opt.startswith("--"))
                takes_job = any(a.metavar == "JOB" for a in sub._actions if not a.option_strings)
                found[name] = (flags, takes_job)
    return found


def bash_script(parser: argparse.ArgumentParser) -> str:
    table = commands(parser)
    cases = "\n".join(
        f"    {shlex.quote(name)}) flags={shlex.quote(' '.join(flags))}; takes_job={int(job)} ;;"
        for name, (flags, job) in table.items())
    names = " ".join(table)
    return f'''# ddpjob shell completion (ddpjob completion bash)
_ddpjob_complete() {{
  local cur="${{COMP_WORDS[COMP_CWORD]}}" command="" namespace="" flags="" takes_job=0 i
  for ((i = 1; i < COMP_CWORD; i++)); do
    case "${{COMP_WORDS[i]}}" in
      -n|--namespace) namespace="${{COMP_WORDS[i+1]}}"; ((i++)) ;;
      -*) ;;
      *) [[ -z "$command" ]] && command="${{COMP_WORDS[i]}}" ;;
    esac
  done
  if [[ -z "$command" ]]; then
    COMPREPLY=($(compgen -W "{names} --help --version" -- "$cur"))
    return
  fi
  case "$command" in
{cases}
    *) return ;;
  esac
  if [[ "$cur" == -* ]]; then
    COMPREPLY=($(compgen -W "$flags -n -h" -- "$cur"))
  elif ((takes_job)); then
    local jobs
    jobs="$(${{DDPJOB_COMPLETION_COMMAND:-ddpjob}} list -o name ${{namespace:+-n "$namespace"}} 2>/dev/null)"
    COMPREPLY=($(compgen -W "${{jobs//ddpjob.ddpjob.dev\\//}}" -- "$cur"))
  else
    COMPREPLY=($(compgen -f -- "$cur"))
  fi
}}
complete -o default -F _ddpjob_complete ddpjob kubectl-ddpjob
'''


def zsh_script(parser: argparse.ArgumentParser) -> str:
    return "#compdef ddpjob kubectl-ddpjob\nautoload -U +X bashcompinit && bashcompinit\n" + bash_script(parser)


def run_completion(args: argparse.Namespace, out: Optional[TextIO] = None, err: Optional[TextIO] = None) -> int:
    out = out or sys.stdout
    parser = args.root_parser  # set by main.build_parser (importing main here would be a cycle)
    out.write(bash_script(parser) if args.shell == "bash" else zsh_script(parser))
    return 0
