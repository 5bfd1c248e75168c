"""Control characters from objects never reach a terminal as such."""

from __future__ import annotations

import io

from ctrlfix import add_claim, claim, cluster

from dra_driver.tools.explain import command as explain
from dra_driver.tools.terminal import printable


def test_printable_escapes_controls_and_keeps_the_layout() -> None:
    assert printable("a\tb\nc") == "a\tb\nc"
    assert printable("\x1b]0;owned\x07\x1b[2J") == "\\x1b]0;owned\\x07\\x1b[2J"
    assert printable("x\ry\x7f\x9b") == "x\\x0dy\\x7f\\x9b"
    assert printable("admin\u202egnp.exe\u2066") == "admin\\u202egnp.exe\\u2066"
    assert printable("GPU 80Gi ≥ 40Gi, ü") == "GPU 80Gi ≥ 40Gi, ü"


def test_explain_escapes_a_selector_with_terminal_controls() -> None:
    kube = cluster(gpus=1)
    hostile = 'device.driver == "\x1b[2J\x1b]0;pwned\x07\u202e"'  # false: explain prints it
    add_claim(kube, claim(selectors=[{"cel": {"expression": hostile}}]))
    out, err = io.StringIO(), io.StringIO()
    assert explain.main("default/c1", api=kube, out=out, err=err) == 0  # type: ignore[arg-type]
    text = out.getvalue()
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
    assert "\\x1b[2J" in text, text
