"""benchmarks/suite_cpu.py reads the kernel's accounting records and names what each process was."""
from __future__ import annotations

import struct

import pytest

from benchmarks import suite_cpu

pytestmark = pytest.mark.unit


def record(pid: int, comm: bytes, utime: int, stime: int, version: int = 3) -> bytes:
    head = struct.pack("<BBHIIIIIIfHH", 0, version, 0, 0, 0, 0, pid, 1, 0, 0.0, utime, stime)
    return head + bytes(48 - len(head)) + comm.ljust(16, b"\0")


def test_comp_t_is_a_13_bit_mantissa_and_a_base_8_exponent():
    assert suite_cpu.comp_t(250) == 250
    assert suite_cpu.comp_t((2 << 13) | 5) == 5 * 64


def test_records_give_each_exited_process_its_cpu_seconds():
    data = record(10, b"python3", 150, 50) + record(11, b"etcd", (1 << 13) | 1000, 0) + record(12, b"x", 1, 1, version=2)
    assert list(suite_cpu.records(data)) == [suite_cpu.Exited(10, "python3", 2.0), suite_cpu.Exited(11, "etcd", 80.0)]


def test_a_python_process_is_known_by_its_command_line_even_when_torch_renamed_it():
    commands = suite_cpu.command_lines([
        "10\t/usr/bin/python3 -m ddptrainer.warm_start /tmp/s",
        "11\t/usr/bin/python3 -u -m ddptrainer.main --model tiny-cnn",
        "12\t/venv/bin/python3 /venv/bin/ddptrain-pod --script x.py",
        "13\t/usr/local/bin/kube-apiserver --etcd-servers=x",
        "not a line",
    ])
    kinds = [suite_cpu.kind_of(suite_cpu.Exited(pid, comm, 1.0), commands)
             for pid, comm in ((10, "python3"), (11, "pt_elastic"), (12, "ddptrain-pod"), (13, "kube-apiserver"),
                               (14, "python3"), (15, "etcd"))]
    assert kinds == ["python: warm process", "python: ddptrainer.main worker", "python: pod entry point",
                     "kube-apiserver", "python: unseen", "etcd"]


def test_the_table_sums_by_kind_with_shares():
    data = record(1, b"etcd", 300, 100) + record(2, b"etcd", 100, 0) + record(3, b"go", 500, 0)
    text = suite_cpu.table(data, {})
    assert text.splitlines()[1].split() == ["5", "50.0%", "2", "etcd"]
    assert text.splitlines()[-1].split()[:2] == ["10", "total,"]
