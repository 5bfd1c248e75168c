"""What the plugin's CDI spec files share: the lowest cdiVersion a spec's content needs, and its bytes."""

from __future__ import annotations

import json

from dra_driver.node.prepare.cdispec import minimum_cdi_version, spec_bytes


def test_minimum_version_table() -> None:
    base = {"kind": "a.b/c", "devices": [{"name": "x", "containerEdits": {"env": ["A=1"]}}]}
    assert minimum_cdi_version(base) == "0.3.0"
    assert minimum_cdi_version({**base, "annotations": {"a": "b"}}) == "0.6.0"
    assert minimum_cdi_version({**base, "kind": "a.b/c.d"}) == "0.6.0"
    assert minimum_cdi_version({**base, "containerEdits": {"mounts": [{"type": "bind"}]}}) == "0.4.0"
    assert minimum_cdi_version({**base, "containerEdits": {"additionalGids": [5]}}) == "0.7.0"
    assert minimum_cdi_version({**base, "containerEdits": {"netDevices": []}}) == "1.1.0"


def test_spec_bytes_are_one_line_of_compact_json() -> None:
    spec = {"cdiVersion": "0.3.0", "kind": "a.b/c", "devices": [{"name": "x"}]}
    data = spec_bytes(spec)
    assert data.endswith(b"\n") and data.count(b"\n") == 1 and b", " not in data and b": " not in data
    assert json.loads(data) == spec
