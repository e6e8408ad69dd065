"""The rooms of the code and the arrows allowed between them (docs/DESIGN-NOTES.md, Architecture).

Read from the source with ``ast``, so that an import anywhere in a module counts, a late one
inside a function too. A failure names the module, the import and the rule it breaks.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_ROOTS = {"ddpjob": ROOT / "operator" / "ddpjob", "ddptrainer": ROOT / "trainer" / "ddptrainer"}

# room -> the rooms of this repository it may import (besides itself)
ALLOWED_ROOMS = {
    "ddpjob.contract": set(),
    "ddpjob.restart_orders": {"ddpjob.contract"},
    "ddpjob.api": {"ddpjob.contract"},
    "ddpjob.controller": {"ddpjob.contract", "ddpjob.api", "ddpjob.restart_orders"},
    "ddpjob.local": {"ddpjob.contract", "ddpjob.api", "ddpjob.restart_orders"},
    "ddpjob.client": {"ddpjob.contract", "ddpjob.api"},
    "ddpjob.cli": {"ddpjob.contract", "ddpjob.api", "ddpjob.controller", "ddpjob.local", "ddpjob.client"},
    "ddptrainer": {"ddpjob.contract"},
}
# third-party packages a room must never import
FORBIDDEN = {
    "ddpjob.contract": {"torch", "torchvision", "kopf", "kubernetes", "yaml"},  # standard library only
    "ddpjob.restart_orders": {"torch", "torchvision", "kopf", "kubernetes", "yaml"},  # likewise
    "ddpjob.api": {"torch", "torchvision", "kopf", "kubernetes"},
    "ddpjob.controller": {"torch", "torchvision"},
    "ddpjob.local": {"torch", "torchvision", "kopf", "kubernetes"},
    "ddpjob.client": {"torch", "torchvision", "kopf"},
    "ddpjob.cli": {"torch", "torchvision", "kopf", "kubernetes"},
    "ddptrainer": {"kopf", "kubernetes"},
}
# Within the controller only these modules may talk to kopf / the Kubernetes client: the rest is
# pure (decide, builders, kueue) or kopf-free (reconcile, workqueue, settings).
KOPF_MODULES = {"ddpjob.controller.handlers"}
# ... and outside it, the user's side of a cluster (`ddpjob submit/logs/status`): client/cluster.py.
KUBERNETES_CLIENT_MODULES = {"ddpjob.controller.kube", "ddpjob.client.cluster"}


def _modules() -> list[tuple[str, Path]]:
    out = []
    for package, folder in PACKAGE_ROOTS.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out.append((".".join((package, *parts)), path))
    return out


def _room(module: str) -> str:
    if module == "ddpjob" or module.startswith("ddpjob.__"):
        return "ddpjob"
    if module.startswith("ddptrainer"):
        return "ddptrainer"
    parts = module.split(".")
    return ".".join(parts[:2])


def _imports(module: str, path: Path) -> list[str]:
    """Absolute names of everything ``path`` imports (relative imports resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names.append(target)
            # `from ddpjob.api import spec` imports the module ddpjob.api.spec
            names += [f"{target}.{alias.name}" for alias in node.names]
    return names


MODULES = _modules()


def test_every_module_belongs_to_a_room():
    rooms = {_room(m) for m, _ in MODULES}
    assert rooms - {"ddpjob"} <= set(ALLOWED_ROOMS), rooms
    top_level = sorted(m for m, _ in MODULES if m.count(".") == 1 and m.startswith("ddpjob.")
                       and m not in ALLOWED_ROOMS and _room(m) not in ALLOWED_ROOMS)
    assert not top_level, f"modules outside the rooms: {top_level}"


@pytest.mark.parametrize("module, path", MODULES, ids=[m for m, _ in MODULES])
def test_imports_follow_the_allowed_arrows(module, path):
    room = _room(module)
    if room == "ddpjob":  # the package's __init__: nothing to import
        assert not [n for n in _imports(module, path) if n.startswith(("ddpjob.", "ddptrainer"))]
        return
    problems = []
    for name in _imports(module, path):
        top = name.split(".")[0]
        if top in FORBIDDEN[room]:
            problems.append(f"{module} imports {name}: {room} never imports {top}")
        if top in ("ddpjob", "ddptrainer") and name not in ("ddpjob", "ddptrainer"):
            target = _room(name)
            if target not in ({room} | ALLOWED_ROOMS[room]) and target != "ddpjob":
                problems.append(f"{module} imports {name}: {room} may import only "
                                f"{sorted(ALLOWED_ROOMS[room]) or 'itself'}")
        if top == "kopf" and module not in KOPF_MODULES:
            problems.append(f"{module} imports kopf: only {sorted(KOPF_MODULES)} may")
        if top == "kubernetes" and module not in KUBERNETES_CLIENT_MODULES:
            problems.append(f"{module} imports kubernetes: only {sorted(KUBERNETES_CLIENT_MODULES)} may")
    assert not problems, "\n".join(problems)


def test_no_import_cycles_between_modules():
    known = {m for m, _ in MODULES}
    graph = {m: {n for n in _imports(m, p) if n in known and n != m} for m, p in MODULES}
    # drop package -> its own submodule edges (`from ddpjob.cli.main import ...` in cli/__init__)
    graph = {m: {n for n in deps if not n.startswith(m + ".")} for m, deps in graph.items()}
    cycles = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append(" -> ".join(stack[stack.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_no_package_named_operator_shadows_the_standard_module():
    assert not (ROOT / "operator" / "__init__.py").exists()
    import operator

    assert hasattr(operator, "itemgetter")


def test_the_tests_share_helpers_through_packages_not_path_edits():
    offenders = [str(p.relative_to(ROOT)) for folder in ("tests", "benchmarks")
                 for p in (ROOT / folder).rglob("*.py")
                 if "sys.path.insert" in p.read_text() or "sys.path.append" in p.read_text()]
    offenders.remove("tests/unit/test_boundaries.py")  # the strings above
    assert not offenders, offenders


def _test_modules() -> list[tuple[str, Path]]:
    """Every ``test_*.py`` of the test tiers and the benchmarks, with its dotted name."""
    paths = sorted(p for folder in ("tests", "benchmarks") for p in (ROOT / folder).rglob("test_*.py"))
    return [(".".join(p.relative_to(ROOT).with_suffix("").parts), p) for p in paths]


TEST_MODULES = _test_modules()


def test_no_test_module_imports_another():
    """A test module's helpers change with its tests, and importing one runs its module code in
    another's collection: what two test modules share lives in tests/support/ (or tests/testbed/,
    or a tier's *_support.py), never in a test_*.py."""
    test_names = {name for name, _ in TEST_MODULES}
    problems = []
    for module, path in TEST_MODULES:
        parts = module.split(".")
        for name in _imports(module, path):
            # `import test_x` from a sibling, as pytest's rootdir-relative imports allow
            sibling = ".".join(parts[:-1] + [name])
            hit = {name, sibling} & test_names or {n for n in test_names if name.startswith(n + ".")}
            hit.discard(module)
            problems += [f"{module} imports {target}: move what it shares to tests/support/"
                         for target in sorted(hit)]
    assert not problems, "\n".join(sorted(set(problems)))


# --- docs/DESIGN-NOTES.md says what this file enforces ------------------------------------------
DESIGN_NOTES = ROOT / "docs" / "DESIGN-NOTES.md"


def _design_notes_arrows() -> dict[str, set[str]]:
    """The page's "room / may import" table."""
    text = DESIGN_NOTES.read_text()
    block = text[text.index("room               may import"):]
    block = block[:block.index("```")]
    table = {}
    for line in block.splitlines()[1:]:
        if line.strip():
            room, _, allowed = line.strip().partition(" ")
            allowed = allowed.strip()
            table[room] = set() if allowed == "-" else {a.strip() for a in allowed.split(",")}
    return table


def test_the_design_notes_arrows_are_the_enforced_ones():
    assert _design_notes_arrows() == ALLOWED_ROOMS


def test_the_design_notes_name_every_module_of_the_operator():
    """Each module file of the package appears in the page's tree (a new room or module is
    written down where the next person looks)."""
    text = DESIGN_NOTES.read_text()
    missing = [str(path.relative_to(ROOT)) for module, path in MODULES
               if module.startswith("ddpjob.") and not path.name.startswith("__")
               and path.name not in text]
    assert not missing, f"docs/DESIGN-NOTES.md does not name: {missing}"


def test_the_design_notes_list_the_phases_conditions_and_columns():
    from ddpjob.api import crd, status

    text = " ".join(DESIGN_NOTES.read_text().split())
    phases = text[text.index("Phases: "):].split(". ")[0]
    assert all(p in phases for p in status.PHASES), phases
    conditions = text[text.index("Condition types: "):].split(". ")[0]
    assert all(c in conditions for c in status.CONDITION_TYPES), conditions
    columns = text[text.index("Printer columns: "):].split(". ")[0]
    assert all(c["name"] in columns for c in crd.printer_columns()), columns
