"""Terminal output: the demo's table fits 120 columns, colour only on a terminal without NO_COLOR."""

from __future__ import annotations

import io
import re

from e2e.demo.run import HEADER, MIN_WIDTHS
from e2e.demo.terminal import Row, colour_enabled, fit_lines, render_table, truncate

ANSI = re.compile(r"\x1b\[[0-9;]*m")
UUID = "GPU-aa820218-33c8-5403-ae1e-cc1dd3eec934"
PENDING = ("why: cannot allocate: request gpu: not enough devices match; request gpu: 0 candidates, need 1 "
           "(request gpu selector #0 left 0) and then a good deal more text that no terminal line can hold")

ROWS = [
    Row(["single-gpu", "Running", "gpu-node-1/gpu-0", "H100 80GB HBM3", UUID], [None, "green", None, None, None]),
    Row(["two-pods-distinct-gpus-0", "Running", "gpu-node-2/gpu-3", "A100-SXM4-40GB", UUID]),
    Row(["same-numa-pair", "Running", "gpu-node-1/gpu-2", "H100 80GB HBM3", UUID]),
    Row(["", "", "gpu-node-1/gpu-3", "H100 80GB HBM3", UUID]),
    Row(["mig-1g", "Running", "gpu-node-2/gpu-0-mig-1-0", "A100-SXM4-40GB 1g.5gb", UUID.replace("GPU", "MIG")]),
    Row(["unsatisfiable", "Pending", "-", "-", "-"], [None, "yellow", None, None, None], [PENDING]),
]


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_demo_table_fits_120_columns_and_keeps_devices_and_uuids_whole() -> None:
    lines = render_table(HEADER, ROWS, minimum=MIN_WIDTHS)
    assert max(len(line) for line in lines) <= 120, [len(x) for x in lines]
    text = "\n".join(lines)
    assert "gpu-node-2/gpu-0-mig-1-0" in text and text.count(UUID) == 4, "device names and UUIDs are never cut"
    assert "two-pods-distinct-gpus-0 " in text, "pod names are kept whole"
    assert "A100-SXM4-40GB 1…" in text, "the model gives way, cut with …"
    pending = lines.index(next(x for x in lines if x.startswith("unsatisfiable")))
    assert lines[pending + 1].startswith("    why: cannot allocate"), "the reason goes on the lines below"
    assert "no terminal line can hold" in " ".join(x.strip() for x in lines[pending + 1:])


def test_colour_only_on_a_terminal_and_never_with_no_color() -> None:
    assert colour_enabled(Tty(), {}) is True
    assert colour_enabled(io.StringIO(), {}) is False
    assert colour_enabled(Tty(), {"NO_COLOR": "1"}) is False
    assert colour_enabled(Tty(), {"TERM": "dumb"}) is False
    coloured = render_table(HEADER, ROWS, minimum=MIN_WIDTHS, colour=True)
    assert any("\x1b[32mRunning" in x for x in coloured)
    assert max(len(ANSI.sub("", x)) for x in coloured) <= 120
    plain = render_table(HEADER, ROWS, minimum=MIN_WIDTHS, colour=False)
    assert not any("\x1b" in x for x in plain)
    assert [ANSI.sub("", x) for x in coloured] == plain


def test_truncate_and_fit_lines() -> None:
    assert truncate("abcdef", 4) == "abc…" and truncate("abc", 4) == "abc"
    long = "    closest gpu.dra-driver.io/gpu-node-1/gpu-0: " + "x " * 100
    out = fit_lines(f"short\n{long}")
    assert out[0] == "short" and all(len(x) <= 120 for x in out)
    assert out[1].startswith("    closest") and out[2].startswith("        ")
