"""The docs say what the code does: each table a user reads is held to the code it describes.

* the metrics table (docs/operating.md, or the README's) to the series the code registers (every ``Counter``,
  ``Gauge`` and ``Histogram`` built with a ``registry=`` under dra_driver/, read from the source);
* the Events table (docs/operating.md) to the reasons and types the code emits (every ``Occurrence(...)``
  with a literal reason, and the controller's verdict reasons, ``EVENT_REASON``);
* the flag tables (docs/configuration.md, and any other table row that starts with a flag) to the
  parsers ``dra-driver`` builds: flags, environment variables, defaults;
* the README's figures to the committed benchmark results (e2e/bench/results/);
* the README to its length, and every page's relative links and repository paths to files that exist.

A failure names the page, the table, what is missing or wrong, and where in the code it comes from.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dra_driver import cli
from dra_driver.flags import ENV_FLAGS, EnvFlag

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dra_driver"
README = ROOT / "README.md"
OPERATING = ROOT / "docs" / "operating.md"
CONFIGURATION = ROOT / "docs" / "configuration.md"
RESULTS = ROOT / "e2e" / "bench" / "results"
MAX_README_LINES = 300

METRIC_TYPES = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram"}
TICKED = re.compile(r"`([^`]+)`")


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def sources() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        if "_proto" not in path.parts:
            yield path, ast.parse(path.read_text(), str(path))


def module_strings(tree: ast.Module) -> dict[str, str]:
    """Module-level ``NAME = "text"`` assignments, to resolve ``f"{PREFIX}_x"``."""
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = node.value.value
    return found


def literal_text(node: ast.expr, names: dict[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            elif isinstance(value, ast.FormattedValue) and isinstance(value.value, ast.Name) and value.value.id in names:
                parts.append(names[value.value.id])
            else:
                return None
        return "".join(parts)
    return None


def call_name(node: ast.Call) -> str:
    return node.func.id if isinstance(node.func, ast.Name) else node.func.attr if isinstance(node.func, ast.Attribute) else ""


# --- the code's side ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Metric:
    name: str
    type: str
    labels: tuple[str, ...]
    where: str


def registered_metrics() -> dict[str, Metric]:
    metrics: dict[str, Metric] = {}
    for path, tree in sources():
        names = module_strings(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and call_name(node) in METRIC_TYPES
                    and any(k.arg == "registry" for k in node.keywords)):
                continue
            where = f"{rel(path)}:{node.lineno}"
            name = literal_text(node.args[0], names) if node.args else None
            assert name, f"{where}: a metric whose name this test cannot read; write it as a literal or f'{{PREFIX}}_...'"
            label_node = node.args[2] if len(node.args) > 2 else next(
                (k.value for k in node.keywords if k.arg == "labelnames"), None)
            labels: tuple[str, ...] = ()
            if label_node is not None:
                assert isinstance(label_node, (ast.List, ast.Tuple)), f"{where}: {name}'s labels are not a literal list"
                labels = tuple(str(e.value) for e in label_node.elts if isinstance(e, ast.Constant))
            metrics[name] = Metric(name, METRIC_TYPES[call_name(node)], labels, where)
    return metrics


def emitted_events() -> dict[str, tuple[str, set[str]]]:
    """Event reason -> (where the code emits it, the types it is written with: Normal, Warning)."""
    reasons: dict[str, tuple[str, set[str]]] = {}
    verdict_reasons: list[tuple[str, str]] = []
    for path, tree in sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and call_name(node) == "Occurrence" and len(node.args) >= 2:
                kind, reason = node.args[0], node.args[1]
                types = {kind.value} if isinstance(kind, ast.Constant) and isinstance(kind.value, str) else set()
                if isinstance(reason, ast.Constant) and isinstance(reason.value, str):
                    reasons.setdefault(reason.value, (f"{rel(path)}:{node.lineno}", set()))[1].update(types)
                elif "EVENT_REASON" in ast.unparse(reason) or isinstance(reason, ast.Name):
                    verdict_reasons.extend(("", t) for t in types)
            if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EVENT_REASON" for t in node.targets)
                    and isinstance(node.value, ast.Dict)):
                for value in node.value.values:
                    if isinstance(value, ast.Constant) and isinstance(value.value, str):
                        reasons.setdefault(value.value, (f"{rel(path)}:{node.lineno} (EVENT_REASON)", set()))
                        verdict_reasons.append((value.value, ""))
    # The verdict reasons are written through EVENT_REASON, with the types of those calls.
    verdict_types = {t for _, t in verdict_reasons if t}
    for reason, _ in verdict_reasons:
        if reason:
            reasons[reason][1].update(verdict_types)
    return reasons


@dataclass(frozen=True)
class Flag:
    options: tuple[str, ...]
    env: str | None
    default: Any


def command_flags() -> dict[str, dict[str, Flag]]:
    """``dra-driver <command>`` -> long option -> Flag: the variable and default of each flag declared
    with one (dra_driver.flags.add_env_argument), the parser's default of the others."""
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    commands: dict[str, dict[str, Flag]] = {}
    for command, subparser in sub.choices.items():
        declared: dict[str, EnvFlag] = {spec.dest: spec for spec in subparser.get_default(ENV_FLAGS) or ()}
        flags: dict[str, Flag] = {}
        for action in subparser._actions:
            if isinstance(action, argparse._HelpAction) or not action.option_strings or action.help == argparse.SUPPRESS:
                continue
            spec = declared.get(action.dest)
            flag = Flag(tuple(action.option_strings), spec.variable if spec else None,
                        spec.default if spec else action.default)
            for option in action.option_strings:
                if option.startswith("--"):
                    flags[option] = flag
        commands[command] = flags
    return commands


# --- the docs' side ----------------------------------------------------------------------------


def table_rows(text: str) -> Iterator[tuple[int, list[str]]]:
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("|") and not re.match(r"^\|[\s:|-]+\|$", line):
            yield number, [cell.strip() for cell in line.strip().strip("|").split("|")]


def section(path: Path, heading: str) -> tuple[str, int]:
    """The text under ``heading`` up to the next heading of its level or above, and its first line number."""
    lines = path.read_text().splitlines() if path.exists() else []
    level = len(heading) - len(heading.lstrip("#"))
    for start, line in enumerate(lines):
        if line.strip() == heading:
            end = next((i for i in range(start + 1, len(lines))
                        if lines[i].startswith("#") and len(lines[i]) - len(lines[i].lstrip("#")) <= level), len(lines))
            return "\n".join(lines[start + 1:end]), start + 2
    raise AssertionError(f"{rel(path)} has no heading {heading!r}")


def table_page(title: str) -> tuple[Path, str, int]:
    """Where a user reads the table of ``title``: docs/operating.md, or the README if it is kept there."""
    for path in (OPERATING, README):
        for level in ("##", "###"):
            try:
                return (path, *section(path, f"{level} {title}"))
            except AssertionError:
                pass
    raise AssertionError(f"neither {rel(OPERATING)} nor README.md has a section {title!r}")


def first_ticked(cell: str) -> str | None:
    found = TICKED.match(cell)
    return found.group(1) if found else None


# --- the tests ---------------------------------------------------------------------------------


def test_the_metrics_table_lists_every_registered_series_and_nothing_else() -> None:
    code = registered_metrics()
    assert len(code) >= 20, f"the test read only {sorted(code)} from dra_driver/: the metric parsing is broken"
    page, text, offset = table_page("Metrics")
    documented: dict[str, tuple[int, list[str]]] = {}
    problems = []
    for number, cells in table_rows(text):
        name = first_ticked(cells[0])
        if name and name.startswith("dra_driver_"):
            if name in documented:
                problems.append(f"line {offset + number - 1}: `{name}` is listed twice (first at line {documented[name][0]})")
            documented.setdefault(name, (offset + number - 1, cells))
    for name, metric in sorted(code.items()):
        if name not in documented:
            labels = ", ".join(f"`{label}`" for label in metric.labels) or "none"
            problems.append(f"missing row: `{name}` ({metric.type}, labels {labels}; registered at {metric.where})")
            continue
        line, cells = documented[name]
        if len(cells) < 3 or not cells[1].startswith(metric.type):
            problems.append(f"line {line}: `{name}` is a {metric.type} ({metric.where}); the table says {cells[1]!r}")
        # label names are ticked; ticked label values go in parentheses: `result` (`success`, `error`)
        doc_labels = set(TICKED.findall(re.sub(r"\([^)]*\)", "", cells[2]))) if len(cells) > 2 else set()
        if doc_labels != set(metric.labels):
            problems.append(f"line {line}: `{name}` has labels {sorted(metric.labels)} ({metric.where}); "
                            f"the table says {sorted(doc_labels)}")
    for name, (line, _) in sorted(documented.items()):
        if name not in code:
            problems.append(f"line {line}: `{name}` is listed, but no code under dra_driver/ registers it")
    assert not problems, f"{rel(page)}, the metrics table:\n  " + "\n  ".join(problems)


def test_the_events_table_lists_every_reason_the_code_emits_and_nothing_else() -> None:
    events = emitted_events()
    code = {reason: where for reason, (where, _) in events.items()}
    assert {"PrepareFailed", "Unsatisfiable"} <= set(code), f"the test read only {sorted(code)}: the parsing is broken"
    page, text, offset = table_page("Events")
    documented = {}
    problems = []
    for number, cells in table_rows(text):
        reason = first_ticked(cells[0])
        if reason and re.fullmatch(r"[A-Z][A-Za-z]+", reason):
            if reason in documented:
                problems.append(f"line {offset + number - 1}: `{reason}` is listed twice (first at line {documented[reason]})")
            documented.setdefault(reason, offset + number - 1)
            types = events.get(reason, ("", set()))[1]
            stated = set(re.findall(r"Normal|Warning", cells[1])) if len(cells) > 1 else set()
            if reason in events and types and stated != types:
                problems.append(f"line {offset + number - 1}: `{reason}` is written as {'/'.join(sorted(types))} "
                                f"({code[reason]}); the table says {'/'.join(sorted(stated)) or 'nothing'}")
    problems += [f"missing row: `{reason}` (emitted at {where})" for reason, where in sorted(code.items())
                 if reason not in documented]
    problems += [f"line {line}: `{reason}` is listed, but no code under dra_driver/ emits it"
                 for reason, line in sorted(documented.items()) if reason not in code]
    assert not problems, f"{rel(page)}, the Events table:\n  " + "\n  ".join(problems)


def documented_default(cell: str) -> str | None:
    """The default a cell states as a literal: its first backticked word, unless the cell says more first."""
    return first_ticked(cell) if cell.startswith("`") else None


def matches_default(text: str, default: Any) -> bool:
    if isinstance(default, bool):
        return text in (("on", "true") if default else ("off", "false"))
    if isinstance(default, (list, tuple)):
        return text == ",".join(map(str, default))
    return text == (default if isinstance(default, str) else f"{default:g}" if isinstance(default, float) else str(default))


def test_the_configuration_page_lists_every_flag_of_every_command() -> None:
    commands = command_flags()
    assert {"kubelet-plugin", "controller", "explain", "debug-bundle", "probe"} <= set(commands)
    problems = []
    for command, flags in sorted(commands.items()):
        heading = f"## `dra-driver {command}`"
        try:
            text, offset = section(CONFIGURATION, heading)
        except AssertionError as exc:
            problems.append(str(exc))
            continue
        documented: dict[str, tuple[int, list[str]]] = {}
        for number, cells in table_rows(text):
            for option in re.findall(r"`(--[a-z0-9-]+)`", cells[0]):
                if option in documented:
                    problems.append(f"line {offset + number - 1}: `{option}` is listed twice under {heading} "
                                    f"(first at line {documented[option][0]})")
                documented.setdefault(option, (offset + number - 1, cells))
        seen: set[int] = set()
        for _option, flag in sorted(flags.items()):
            if id(flag) in seen:
                continue
            seen.add(id(flag))
            longs = [o for o in flag.options if o.startswith("--")]
            rows = [documented[o] for o in longs if o in documented]
            if not rows:
                problems.append(f"{heading}: missing row: {' / '.join(f'`{o}`' for o in longs)}"
                                + (f" (`{flag.env}`)" if flag.env else ""))
                continue
            line, cells = rows[0]
            doc_env = set(re.findall(r"`([A-Z][A-Z0-9_]+)(?:=[^`]*)?`", cells[1] if len(cells) > 1 else ""))
            if doc_env != ({flag.env} if flag.env else set()):
                problems.append(f"line {line}: `{longs[0]}` reads {flag.env or 'no variable'}; the table says "
                                f"{sorted(doc_env) or 'none'}")
            stated = documented_default(cells[2]) if len(cells) > 2 else None
            # A default of None is one the command works out when it runs (from the environment or
            # another flag): the parser cannot say it, so the page's word stands.
            if stated is not None and flag.default is not None and not matches_default(stated, flag.default):
                problems.append(f"line {line}: `{longs[0]}` defaults to {flag.default!r}; the table says `{stated}`")
        for option, (line, _) in sorted(documented.items()):
            if option not in flags:
                problems.append(f"line {line}: `{option}` is listed under {heading}, but that command has no such flag")
    assert not problems, f"{rel(CONFIGURATION)}:\n  " + "\n  ".join(problems)


def doc_pages() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "deploy").rglob("README.md"))]


def test_every_flag_a_table_row_starts_with_exists_with_the_variable_it_names() -> None:
    flags: dict[str, Flag] = {}
    for command in command_flags().values():
        for option, flag in command.items():
            flags.setdefault(option, flag)
            flags.setdefault("--no-" + option[2:], flag)
    problems = []
    for page in doc_pages():
        if page in (CONFIGURATION, ROOT / "docs" / "history.md"):
            continue
        for number, cells in table_rows(page.read_text()):
            found = re.match(r"`(--[a-z0-9-]+)(?:[ =][^`]*)?`(?:\s*\(([^)]*)\))?", cells[0])
            if not found:
                continue
            option, aside = found.group(1), found.group(2) or ""
            flag = flags.get(option)
            if flag is None:
                problems.append(f"{rel(page)}:{number}: `{option}` is no flag of any dra-driver command")
                continue
            named = set(re.findall(r"`([A-Z][A-Z0-9_]+)(?:=[^`]*)?`", aside))
            if named and named != {flag.env}:
                problems.append(f"{rel(page)}:{number}: `{option}` reads {flag.env or 'no variable'}, "
                                f"the row says {sorted(named)}")
    assert not problems, "\n  ".join(["flag rows that do not match the parsers:", *problems])


def numbers_in(value: Any) -> Iterator[float]:
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        yield float(value)
    elif isinstance(value, str):
        for text in re.findall(r"-?\d[\d,]*(?:\.\d+)?", value):
            yield float(text.replace(",", ""))
    elif isinstance(value, dict):
        for item in value.values():
            yield from numbers_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from numbers_in(item)


def recorded(number: str, results: list[float]) -> bool:
    """``number`` as written (its decimals) is one of the results, rounded the same way."""
    decimals = len(number.split(".")[1]) if "." in number else 0
    value = float(number.replace(",", ""))
    return any(round(r, decimals) == value or (decimals == 0 and abs(r - value) < 0.5) for r in results)


def test_the_readme_figures_are_the_committed_results() -> None:
    text, offset = section(README, "## Figures")
    checked = 0
    problems = []
    for number, cells in table_rows(text):
        if len(cells) < 6:
            continue
        command = cells[4]
        bench = re.search(r"--only ([a-z_]+)", command)
        name = bench.group(1) if bench else "scale" if "bench-scale" in command else None
        if name is None:
            continue
        result = json.loads((RESULTS / f"{name}.json").read_text())
        values = list(numbers_in(result.get("figures", {}))) + list(numbers_in(result.get("targets", [])))
        figure = re.sub(r"\d{4}-\d{2}-\d{2}", "", cells[1])
        for written in re.findall(r"\d[\d,]*(?:\.\d+)?", figure):
            checked += 1
            if not recorded(written, values):
                problems.append(f"README.md:{offset + number - 1}: {written} ({cells[0][:60]}...) is not in "
                                f"{rel(RESULTS)}/{name}.json")
        date = str(result.get("date", ""))[:10]
        if date and date not in cells[3]:
            problems.append(f"README.md:{offset + number - 1}: measured {cells[3]!r}, {name}.json says {date}")
    assert checked >= 10, f"only {checked} figures were checked: the table's columns moved"
    assert not problems, "\n  ".join(["the README's figures and the committed results disagree:", *problems])


def test_the_readme_stays_short() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines (at most {MAX_README_LINES}): move detail to docs/"


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: rel(p))
def test_relative_links_point_at_files_that_exist(page: Path) -> None:
    missing = []
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
        if "://" in target or target.startswith("mailto:"):
            continue
        if not (page.parent / target).exists():
            missing.append(target)
    assert not missing, f"{rel(page)} links to files that do not exist: {missing}"


REPO_PATH = re.compile(r"`((?:dra_driver|e2e|unit_tests|deploy|api|scripts|docs)/[A-Za-z0-9_./-]*)`")


@pytest.mark.parametrize("page", [p for p in doc_pages() if p.name != "history.md"], ids=lambda p: rel(p))
def test_repository_paths_the_docs_name_exist(page: Path) -> None:
    """(docs/history.md names paths as they were then.)"""
    missing = sorted({path for path in REPO_PATH.findall(page.read_text())
                      if "foo" not in path and not (ROOT / path.rstrip("/")).exists()})
    assert not missing, f"{rel(page)} names files that do not exist: {missing}"


ARCHITECTURE = ROOT / "docs" / "architecture.md"
BULLET = re.compile(r"^(\s*)- (.*)$")


@dataclass
class MapEntry:
    """One bullet of the module map: the folder it describes (a bullet that starts with `x/`), its
    text with its continuation lines, and the bullets under it."""

    folder: str | None
    text: str
    indent: int
    children: list[MapEntry]

    def subtree_text(self) -> str:
        return " ".join([self.text, *(child.subtree_text() for child in self.children)])


def module_map(text: str) -> tuple[str, dict[str, MapEntry]]:
    """The module map's text (from "Module map" to the test trees) and its folder entries by path
    under dra_driver/ (``node/prepare``)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Module map"))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("The test trees"))
    section = lines[start:end]
    roots: list[MapEntry] = []
    stack: list[MapEntry] = []
    for line in section:
        bullet = BULLET.match(line)
        if bullet:
            indent, body = len(bullet.group(1)), bullet.group(2)
            first = re.match(r"`([A-Za-z0-9_]+/)`", body)
            entry = MapEntry(first.group(1).rstrip("/") if first else None, body, indent, [])
            while stack and stack[-1].indent >= indent:
                stack.pop()
            (stack[-1].children if stack else roots).append(entry)
            stack.append(entry)
        elif stack and line.strip():
            stack[-1].text += " " + line.strip()
    folders: dict[str, MapEntry] = {}

    def walk(entries: list[MapEntry], parent: str) -> None:
        for entry in entries:
            path = f"{parent}/{entry.folder}".lstrip("/") if entry.folder else parent
            if entry.folder:
                folders[path] = entry
            walk(entry.children, path)

    walk(roots, "")
    return "\n".join(section), folders


def unnamed_modules(text: str, modules: list[str]) -> list[str]:
    """The modules (paths under dra_driver/) the map does not name: each where the entry of its
    nearest folder with an entry of its own names it (the whole map for the top-level modules),
    as `name.py` or a path ending so. A package is named by its folder (`cel/`); its
    ``__init__.py`` need not be."""
    whole, folders = module_map(text)
    missing = []
    for module in modules:
        parts = module.split("/")
        name = parts[-1]
        if module == "__init__.py":
            continue
        scope = whole
        for depth in range(len(parts) - 1, 0, -1):
            if "/".join(parts[:depth]) in folders:
                scope = folders["/".join(parts[:depth])].subtree_text()
                break
        wanted = f"{parts[-2]}/" if name == "__init__.py" else name
        if not any(tick == wanted or tick.endswith(f"/{wanted}") for tick in TICKED.findall(scope)):
            missing.append(module)
    return missing


def package_modules() -> list[str]:
    """Every module and package under dra_driver/, as paths under it; the generated _proto/ as its folder."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        if module.startswith("_proto/"):
            module = "_proto/__init__.py"
        if module not in found:
            found.append(module)
    return found


def test_the_module_map_names_every_module() -> None:
    """docs/architecture.md's module map names every module of the package, in the entry of its folder."""
    missing = unnamed_modules(ARCHITECTURE.read_text(), package_modules())
    assert not missing, "\n  ".join(["docs/architecture.md's module map does not name (add each to its folder's entry):",
                                     *missing])


def test_the_module_map_check_reads_folders_and_nesting() -> None:
    page = "\n".join([
        "Module map (`dra_driver/`):", "",
        "- `cli.py`: the command.",
        "- `node/`: the plugin.",
        "  - `plugin.py` (wiring).",
        "  - `prepare/`: `state.py` with",
        "    `records.py`; `cel/` (`syntax.py`).",
        "- `k8s/`: `client.py`, `_proto/`.",
        "", "The test trees:", "- `e2e/`: `x.py`",
    ])
    modules = ["cli.py", "node/__init__.py", "node/plugin.py", "node/prepare/state.py", "node/prepare/records.py",
               "node/prepare/cel/syntax.py", "node/prepare/cel/__init__.py", "k8s/client.py", "_proto/__init__.py",
               # named, but in another folder's entry or only in the test trees
               "k8s/state.py", "node/client.py", "x.py", "node/publish/__init__.py"]
    assert unnamed_modules(page, modules) == ["k8s/state.py", "node/client.py", "x.py", "node/publish/__init__.py"]
