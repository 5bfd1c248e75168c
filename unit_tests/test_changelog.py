"""CHANGELOG.md keeps Keep a Changelog's shape, so a user finds what changed where they expect it:
``[Unreleased]`` first, then dated releases, newest first; in each, Keep a Changelog's sections,
each at most once (lines added at the same time by several people end up under one heading); the
version the package declares has its section."""

from __future__ import annotations

import re
from datetime import date
from pathlib import Path

from dra_driver import __version__

CHANGELOG = Path(__file__).resolve().parents[1] / "CHANGELOG.md"
SECTIONS = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")
RELEASE = re.compile(r"^## \[(?P<version>[^\]]+)\](?: - (?P<date>\d{4}-\d{2}-\d{2}))?$")


def releases() -> list[tuple[str, str | None, int, list[tuple[int, str]]]]:
    """(version, date, line, [(line, section heading)]) per ``## [...]`` heading, in file order."""
    found: list[tuple[str, str | None, int, list[tuple[int, str]]]] = []
    for number, line in enumerate(CHANGELOG.read_text().splitlines(), 1):
        if line.startswith("## "):
            match = RELEASE.match(line)
            assert match, f"CHANGELOG.md:{number}: {line!r} is not '## [VERSION] - YYYY-MM-DD' or '## [Unreleased]'"
            found.append((match["version"], match["date"], number, []))
        elif line.startswith("### "):
            assert found, f"CHANGELOG.md:{number}: {line!r} comes before any release heading"
            found[-1][3].append((number, line[4:].strip()))
    return found


def test_unreleased_comes_first_then_dated_releases_newest_first() -> None:
    found = releases()
    assert found and found[0][0] == "Unreleased" and found[0][1] is None, \
        "CHANGELOG.md must start with '## [Unreleased]'"
    dates = []
    for version, day, number, _ in found[1:]:
        assert re.fullmatch(r"\d+\.\d+\.\d+", version), f"CHANGELOG.md:{number}: [{version}] is not a version"
        assert day is not None, f"CHANGELOG.md:{number}: [{version}] has no date (## [{version}] - YYYY-MM-DD)"
        dates.append(date.fromisoformat(day))
    assert dates == sorted(dates, reverse=True), "CHANGELOG.md: the releases are not newest first"


def test_each_release_uses_keep_a_changelog_sections_once() -> None:
    problems = []
    for version, _, _, sections in releases():
        seen: dict[str, int] = {}
        for number, title in sections:
            if title not in SECTIONS:
                problems.append(f"CHANGELOG.md:{number}: '### {title}' under [{version}] is not one of {', '.join(SECTIONS)}")
            elif title in seen:
                problems.append(f"CHANGELOG.md:{number}: a second '### {title}' under [{version}] "
                                f"(the first is line {seen[title]}): move its lines there")
            else:
                seen[title] = number
    assert not problems, "\n  ".join(problems)


def test_the_declared_version_has_its_section() -> None:
    versions = [version for version, *_ in releases()]
    assert __version__ in versions, f"dra_driver declares {__version__}; CHANGELOG.md has no '## [{__version__}]' section"
