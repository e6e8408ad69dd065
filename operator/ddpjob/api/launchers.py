"""What a ``spec.command`` is: the pod entry point, a launcher that starts the pod's processes
itself, or a program of your own that runs once per pod.

Decided here, once, for the launcher rules of ``spec.py`` (so for ``ddpjob validate``, the
operator and ``ddpjob run``) and for the API server: each question has a Python answer and its
CEL twin, and tests/unit/test_crd.py checks the two agree.

Recognised launchers (they read the ``PET_*`` variables every pod gets, docs/contract.md, and so
start ``nprocPerNode`` processes with the job's rendezvous without a flag):

* ``torchrun`` at any path (``/usr/local/bin/torchrun``), with or without its own flags;
* ``python -m torch.distributed.run`` and ``python -m torch.distributed.launch``, with
  ``python``, ``python3``, ``python3.11`` at any path, and at most one group of flag letters
  before ``-m`` (``python -u -m torch.distributed.run``).

Anything else (``bash -c "torchrun ..."``, ``env python -m ...``) is not looked into: it runs
once per pod unless ``launcher: none`` says it starts the processes itself.
"""
from __future__ import annotations

import re
from typing import Optional, Sequence

from ddpjob import contract

# The pod entry point's program name: a command that runs it (at any path) is not "your own".
POD_ENTRY_PROGRAM = contract.DEFAULT_POD_COMMAND[0]
TORCHRUN = "torchrun"
LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")
# A Python interpreter at any path: python, python3, python3.11.
PYTHON_PATTERN = r"^(.*/)?python[0-9.]*$"
# Interpreter options without a value that may come before -m (-u, -B, -uB, ...).
PYTHON_FLAGS_PATTERN = r"^-[bBdEiIOqsSuvR]+$"


def _matches(pattern: str, text: str) -> bool:
    return re.search(pattern, text) is not None


def is_pod_entry(command: Optional[Sequence[str]]) -> bool:
    """No command, or the pod entry point at any path (``/opt/venv/bin/ddptrain-pod``)."""
    return not command or command[0].endswith(POD_ENTRY_PROGRAM)


def launcher_of(command: Optional[Sequence[str]]) -> Optional[str]:
    """The launcher a command runs (``torchrun``, ``torch.distributed.run``,
    ``torch.distributed.launch``), or None for any other command."""
    if not command:
        return None
    program = command[0]
    if program == TORCHRUN or program.endswith("/" + TORCHRUN):
        return TORCHRUN
    if not _matches(PYTHON_PATTERN, program):
        return None
    rest = list(command[1:])
    if rest and _matches(PYTHON_FLAGS_PATTERN, rest[0]):
        rest = rest[1:]
    if len(rest) >= 2 and rest[0] == "-m" and rest[1] in LAUNCHER_MODULES:
        return rest[1]
    return None


def starts_processes_itself(command: Optional[Sequence[str]]) -> bool:
    """Whether the command is a launcher that starts nprocPerNode processes (launcher_of)."""
    return launcher_of(command) is not None


def _module_at(index: int) -> str:
    modules = ", ".join(f"'{m}'" for m in LAUNCHER_MODULES)
    return (f"(size(self.command) > {index + 1} && self.command[{index}] == '-m' && "
            f"self.command[{index + 1}] in [{modules}])")


# The CEL twin of launcher_of(...) is not None (self = the DDPJobSpec).
LAUNCHER_CEL = (
    f"(has(self.command) && (self.command[0] == '{TORCHRUN}' || self.command[0].endsWith('/{TORCHRUN}') || "
    f"(self.command[0].matches('{PYTHON_PATTERN}') && ({_module_at(1)} || "
    f"(size(self.command) > 1 && self.command[1].matches('{PYTHON_FLAGS_PATTERN}') && {_module_at(2)})))))"
)
