"""Issue 34's measure of the state machine's code: a reconcile pass reads top-down, its walk
(tests/support/reconcile_walk.py defines it) under 40 stays and 25 returns."""
from __future__ import annotations

import pytest

from tests.support.reconcile_walk import Walk, walk_of, walks

pytestmark = pytest.mark.unit


def test_every_pass_reads_top_down_within_the_issues_bound():
    measured = walks()
    assert len(measured) == 3
    for name, walk in measured.items():
        assert walk.stays[0] == "controller/reconcile.py", name  # the walk starts where a reader does
        assert "controller/decide.py" in walk.stays and "controller/act.py" in walk.stays, name
        assert len(walk.stays) < 40 and walk.returns < 25, f"{name}: {walk}"


def test_the_walk_counts_stays_and_returns_as_defined():
    assert Walk(("a", "b", "a", "c", "b"), 5).returns == 2
    assert Walk(("a", "b", "a", "c", "b"), 5).files == 3


def test_the_walk_sees_the_calls_of_the_package_only_and_stops_at_its_window():
    from ddpjob.controller import plan

    def run():
        sorted([3, 1, 2])  # not the package: not counted
        for _ in range(5):
            plan.soonest(1.0, None)  # vocabulary: counted as a call, not walked

    assert walk_of(run).stays == () and walk_of(run).calls >= 5
    every = walk_of(run, every_call=True)
    assert every.stays == ("controller/plan.py",) and every.returns == 0
    assert walk_of(run, events=2, every_call=True).calls == 2


def test_no_function_of_the_state_machine_is_over_60_lines_and_decide_py_under_300():
    """Issue 34's other bounds on the controller's code (a policy grows by a helper, not a longer
    function)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "operator" / "ddpjob" / "controller"
    long = [f"{path.relative_to(root)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path in sorted(root.rglob("*.py"))
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 60]
    assert not long, long
    assert len((root / "decide.py").read_text().splitlines()) < 300
