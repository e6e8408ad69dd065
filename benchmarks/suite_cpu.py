"""Where a command's CPU goes, by kind of process: the test suite's budget, measured.

    python -m benchmarks.suite_cpu -- bash .ci/run          # needs root (process accounting)
    python -m benchmarks.suite_cpu --report ACCT PSMAP       # the table of an earlier run

The kernel's process accounting (acct(2), BSD v3 records) writes one record per process that
exits, with its user and system CPU time, whatever it was (a pod's process, a kind node's
kubelet, a Go compile). Its name is cut to 15 characters ("python3"), so a sampler next to it
records every process's command line once a second, and each Python process is put in a kind
by its command line (``KINDS``). A process that lived under a second is "python: unseen".
Processes still alive when accounting stops (none, after a whole `.ci/run`) are not counted;
workers forked by a warm process carry its command line, so they count as "warm process".

docs/testing.md ("Where the CPU goes") has the figures of a CI run and what they changed.
"""
from __future__ import annotations

import argparse
import collections
import ctypes
import os
import re
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterable, Iterator, Mapping, NamedTuple

#: (kind, pattern of the command line), first match wins.
KINDS = [
    ("warm process", r"ddptrainer\.warm_start "),
    ("ddptrainer.main worker", r"ddptrainer\.main|ddptrainer/main"),
    ("torchrun launcher", r"torch\.distributed\.run|torchrun"),
    ("pod entry point", r"ddptrain-pod|ddptrainer\.pod_entry"),
    ("ddpjob validate", r"ddpjob validate"),
    ("ddpjob CLI", r"ddpjob\.cli|bin/ddpjob "),
    ("operator", r"ddpjob-operator|ddpjob\.operator"),
    ("node agent", r"node_agent"),
    ("pytest", r"pytest"),
    # Test programs (most import torch), multiprocessing's spawned workers.
    ("other Python script", r"\.py\b|\s-c\s|spawn_main"),
]
_V3 = struct.Struct("<BBHIIIIIIfHH")  # flag .. etime, utime, stime (comp_t): the first 36 bytes
RECORD_BYTES = 64
AHZ = 100


class Exited(NamedTuple):
    pid: int
    comm: str
    cpu_seconds: float


def comp_t(value: int) -> int:
    """acct's 16-bit float: 13 bits of mantissa, 3 of base-8 exponent."""
    return (value & 0x1FFF) << (3 * (value >> 13))


def records(data: bytes) -> Iterator[Exited]:
    for offset in range(0, len(data) - RECORD_BYTES + 1, RECORD_BYTES):
        raw = data[offset:offset + RECORD_BYTES]
        fields = _V3.unpack(raw[:_V3.size])
        if fields[1] != 3:  # ac_version: only v3 records are read
            continue
        comm = raw[48:64].split(b"\0")[0].decode(errors="replace")
        yield Exited(pid=fields[6], comm=comm, cpu_seconds=(comp_t(fields[10]) + comp_t(fields[11])) / AHZ)


def command_lines(lines: Iterable[str]) -> dict[int, str]:
    seen: dict[int, list[str]] = {}
    for line in lines:
        pid, _, args = line.rstrip("\n").partition("\t")
        if pid.strip().isdigit():
            seen.setdefault(int(pid), []).append(args)
    return {pid: " ".join(args) for pid, args in seen.items()}


_PYTHON = re.compile(r"^(\S*/)?python[0-9.]*(\s|$)")


def kind_of(exited: Exited, commands: Mapping[int, str]) -> str:
    """The kind of an exited process. A Python process is known by its command line: its name
    may be a thread's that torch renamed (pt_elastic, pt_gloo_runloop) or its script's."""
    line = commands.get(exited.pid)
    if line is None or not (_PYTHON.match(line) or "/bin/ddp" in line.split(" ", 1)[0]):
        return "python: unseen" if line is None and exited.comm.startswith("python") else exited.comm
    return "python: " + next((kind for kind, pattern in KINDS if re.search(pattern, line)), "other")


def table(data: bytes, commands: Mapping[int, str], top: int = 30) -> str:
    cpu: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for exited in records(data):
        kind = kind_of(exited, commands)
        cpu[kind] += exited.cpu_seconds
        count[kind] += 1
    total = sum(cpu.values()) or 1.0
    rows = [f"{'CPU s':>8} {'share':>6} {'processes':>9}  kind",
            *(f"{seconds:8.0f} {100 * seconds / total:5.1f}% {count[kind]:9d}  {kind}"
              for kind, seconds in cpu.most_common(top))]
    return "\n".join(rows + [f"{total:8.0f}  total, {sum(count.values())} processes"])


def _sample(path: Path, stop: threading.Event) -> None:
    seen: dict[int, str] = {}
    with open(path, "w") as out:
        while not stop.is_set():
            listing = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
            for line in listing.splitlines():
                pid, _, args = line.strip().partition(" ")
                if pid.isdigit() and seen.get(int(pid)) != args:
                    seen[int(pid)] = args
                    out.write(f"{pid}\t{args[:300]}\n")
            out.flush()
            stop.wait(1.0)


def measure(command: list[str], folder: Path) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    acct, psmap = folder / "acct", folder / "psmap.tsv"
    acct.touch()
    if libc.acct(str(acct).encode()) != 0:
        raise SystemExit(f"suite_cpu: acct(2) refused: {os.strerror(ctypes.get_errno())} (root is needed)")
    stop = threading.Event()
    sampler = threading.Thread(target=_sample, args=(psmap, stop), daemon=True)
    sampler.start()
    started = time.monotonic()
    try:
        code = subprocess.call(command)
    finally:
        libc.acct(None)
        stop.set()
        sampler.join(timeout=5)
    print(f"suite_cpu: {' '.join(command)} exited {code} after {time.monotonic() - started:.0f} s; "
          f"records in {folder}", file=sys.stderr)
    print(table(acct.read_bytes(), command_lines(psmap.read_text(errors="replace").splitlines())))
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", nargs=2, metavar=("ACCT", "PSMAP"), help="print the table of an earlier run")
    parser.add_argument("command", nargs="*", help="the command to measure (after --)")
    args = parser.parse_args(argv)
    if args.report:
        acct, psmap = map(Path, args.report)
        print(table(acct.read_bytes(), command_lines(psmap.read_text(errors="replace").splitlines())))
        return 0
    if not args.command:
        parser.error("give a command to measure (after --), or --report ACCT PSMAP")
    return measure(args.command, Path(tempfile.mkdtemp(prefix="suite-cpu-")))


if __name__ == "__main__":
    sys.exit(main())
