"""The test trees' rule that import-linter cannot read (``unit_tests/`` is no package): a unit test
takes generated objects from ``e2e/generators/``, never from a suite or a bench (CONTRIBUTING.md,
"Where a new module's test goes"). Only the tests of the e2e tree itself (``unit_tests/e2e_tools/``)
import what they test there. The e2e tree's own order is import-linter's (``[tool.importlinter]``)."""

from __future__ import annotations

import ast
from pathlib import Path

UNIT_TESTS = Path(__file__).resolve().parent
E2E_TOOLS = UNIT_TESTS / "e2e_tools"
FORBIDDEN = ("e2e.bench", "e2e.suites")
# The Grafana dashboard's reader lives beside the suite that checks the live metrics against it.
ALLOWED = {("deploy/test_dashboard.py", "e2e.suites.dashboard")}


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")


def imported_modules(tree: ast.AST) -> set[str]:
    """Every module an import statement names, anywhere in the file (a function's own imports too);
    ``from e2e import bench`` names ``e2e.bench``."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def forbidden_imports(source: str, name: str) -> list[str]:
    """What the unit test ``name`` (its path under unit_tests/) imports of a bench or a suite."""
    return sorted(m for m in imported_modules(ast.parse(source, name))
                  if any(within(m, f) for f in FORBIDDEN) and not any(n == name and within(m, a) for n, a in ALLOWED))


def test_unit_tests_import_no_bench_and_no_suite() -> None:
    problems = []
    for path in sorted(UNIT_TESTS.rglob("*.py")):
        name = path.relative_to(UNIT_TESTS).as_posix()
        if E2E_TOOLS not in path.parents and (bad := forbidden_imports(path.read_text(), name)):
            problems.append(f"{name}: imports {', '.join(bad)}")
    assert not problems, "\n  ".join(["unit tests import a bench or a suite (take objects from e2e/generators/):",
                                      *problems])


def test_the_rule_reads_every_form_of_import() -> None:
    source = ("import e2e.bench.scale\nfrom e2e import suites\nfrom e2e.generators import fleet\n"
              "def f() -> None:\n    from e2e.bench.storemem import measure\n")
    assert forbidden_imports(source, "controller/test_x.py") == [
        "e2e.bench.scale", "e2e.bench.storemem", "e2e.bench.storemem.measure", "e2e.suites"]
    dashboard = "from e2e.suites.dashboard import DASHBOARD\n"
    assert forbidden_imports(dashboard, "deploy/test_dashboard.py") == []
    assert forbidden_imports(dashboard, "deploy/test_chart.py") == ["e2e.suites.dashboard", "e2e.suites.dashboard.DASHBOARD"]
