"""docs/contract.md documents every variable and exit code of ddpjob.contract."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from ddpjob import contract

pytestmark = pytest.mark.unit

PAGE = Path(__file__).resolve().parents[2] / "docs" / "contract.md"


def page() -> str:
    return PAGE.read_text(encoding="utf-8")


def env_names() -> set[str]:
    """Every environment variable name the contract defines: the module's constants whose value
    is their own name (PET_NNODES = "PET_NNODES"), and whatever node_environment() returns."""
    names = {value for key, value in vars(contract).items() if isinstance(value, str) and key == value}
    names |= set(contract.node_environment(
        job_name="j", namespace="n", master_addr="a", master_port=1, nnodes=2, nproc_per_node=1,
        node_rank=0, restart_attempt=0, device="cpu", rendezvous_timeout_seconds=1))
    names |= set(contract.RESERVED_ENV_NAMES)
    return names


def exit_codes() -> set[int]:
    return (set(contract.EXIT_CODE_MEANINGS) | {int(c) for c in contract.ExitCode}
            | set(contract.DEFAULT_PERMANENT_EXIT_CODES))


def table_rows(text: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in text.splitlines() if line.startswith("|")]


def test_the_module_defines_what_this_test_expects():
    assert "PET_NNODES" in env_names() and "DDPJOB_TERMINATION_LOG" in env_names()
    assert {0, 1, 2, 3, 12, 13, 126, 127, 137, 143} <= exit_codes()


@pytest.mark.parametrize("name", sorted(env_names()))
def test_every_variable_is_on_the_page(name):
    assert f"`{name}`" in page(), f"docs/contract.md does not document {name}"


def test_every_variable_of_a_pod_has_a_row_with_its_meaning():
    rows = {row[0].strip("`"): row for row in table_rows(page()) if row and row[0].startswith("`")}
    for name in contract.node_environment(
            job_name="j", namespace="n", master_addr="a", master_port=1, nnodes=2, nproc_per_node=1,
            node_rank=0, restart_attempt=0, device="cpu", rendezvous_timeout_seconds=1):
        assert name in rows and rows[name][-1], f"no table row explaining {name}"


@pytest.mark.parametrize("code", sorted(exit_codes()))
def test_every_exit_code_has_a_row(code):
    codes = {row[0] for row in table_rows(page())}
    assert str(code) in codes, f"docs/contract.md has no exit-code row for {code}"


def test_the_exit_code_rows_say_what_the_operator_does():
    rows = {row[0]: row for row in table_rows(page()) if re.fullmatch(r"\d+", row[0])}
    for code in exit_codes() - {0}:
        verdict = rows[str(code)][-1]
        expected = "fail" if code in contract.DEFAULT_PERMANENT_EXIT_CODES else "retry"
        assert expected in verdict, f"exit {code}: the page says {verdict!r}"


def test_exit_code_names_match_the_enum():
    rows = {row[0]: row for row in table_rows(page()) if re.fullmatch(r"\d+", row[0])}
    for member in contract.ExitCode:
        assert f"`{member.name}`" in rows[str(int(member))][1]


ROOT = Path(__file__).resolve().parents[2]
# A run of exit codes as the docs write them: "2, 3, 4, 126, 127", "2/3/4/126/127", "2,3,4,126,127".
_CODE_RUN = re.compile(r"\b\d{1,3}(?:(?:, ?|/)\d{1,3}){2,}\b")


def test_every_page_states_the_default_permanent_exit_codes_of_the_code():
    """Each line of the docs, the README and the examples that gives permanent exit codes with
    126/127 among them (the defaults) gives exactly contract.DEFAULT_PERMANENT_EXIT_CODES."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "examples").rglob("*.yaml"))]
    wrong, found = [], 0
    for path in pages:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "permanent" not in line.lower() and "final" not in line.lower():
                continue
            for run in _CODE_RUN.findall(line):
                codes = tuple(int(c) for c in re.split(r", ?|/", run))
                if 126 in codes or 127 in codes:
                    found += 1
                    if codes != contract.DEFAULT_PERMANENT_EXIT_CODES:
                        wrong.append(f"{path.relative_to(ROOT)}:{number}: {run}")
    assert found >= 5, "the pages that state the defaults were not found"
    assert not wrong, f"not the defaults {contract.DEFAULT_PERMANENT_EXIT_CODES}: {wrong}"


def test_the_entry_points_transitions_are_the_table_the_page_shows():
    rows = set(re.findall(r"^\| `(\w+)` \| `(\w+)` \| `(\w+)` \|", page(), re.MULTILINE))
    assert rows == {(state, event, after) for (state, event), after in contract.ENTRY_TRANSITIONS.items()}
    assert {s for s, _ in contract.ENTRY_TRANSITIONS} | set(contract.ENTRY_TRANSITIONS.values()) \
        == set(contract.ENTRY_STATES)
