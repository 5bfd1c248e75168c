"""Values as API fields take them: MicroTime, and text bounded in bytes (dra_driver.k8s.fields)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from dra_driver.k8s.fields import cut, micro_time, one_line


def test_micro_time_is_utc_with_microseconds() -> None:
    when = datetime(2025, 3, 1, 12, 0, 5, 42, tzinfo=timezone(timedelta(hours=2)))
    assert micro_time(when) == "2025-03-01T10:00:05.000042Z"
    assert micro_time(datetime(2025, 1, 1, tzinfo=UTC)) == "2025-01-01T00:00:00.000000Z"


def test_cut_counts_bytes_and_never_splits_a_character() -> None:
    assert cut("short", 10) == "short"
    text = "é" * 10  # 20 bytes
    for limit in range(4, 21):
        for mark in ("...", "…"):
            out = cut(text, limit, mark)
            assert len(out.encode()) <= limit and out.encode().decode() == out
            assert out == text or out.endswith(mark)
    assert cut("a\nb", 10) == "a\nb", "cut keeps the text's own lines"


def test_one_line_joins_whitespace_then_cuts() -> None:
    assert one_line("two\n  lines\t", 100) == "two lines"
    out = one_line("x" * 50 + "\n" + "y" * 50, 20, "…")
    assert "\n" not in out and len(out.encode()) <= 20 and out.endswith("…")
