"""CDI spec validation and resolution as the emulated container runtime does it.

The peer restates the CDI library's rules in Python; each case here is also put to the reference
library (``cdi-validate``, :mod:`e2e.testbed.cdicheck`), so where the two part ways a test fails.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.kubelet_peer import cdi
from e2e.testbed import cdicheck


def spec(version: str = "0.5.0", kind: str = "nvidia.com/gpu", **extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "cdiVersion": version,
        "kind": kind,
        "containerEdits": {"env": ["NVIDIA_CTK=1"]},
        "devices": [
            {
                "name": "gpu-0",
                "containerEdits": {
                    "env": ["NVIDIA_VISIBLE_DEVICES=GPU-aaa"],
                    "deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/dev/nvidia0"}],
                },
            },
            {
                "name": "gpu-1",
                "containerEdits": {
                    "env": ["NVIDIA_VISIBLE_DEVICES=GPU-bbb"],
                    "deviceNodes": [{"path": "/dev/nvidia1"}],
                    "mounts": [{"hostPath": "/usr/lib/x", "containerPath": "/usr/lib/x", "options": ["ro"]}],
                },
            },
        ],
    }
    doc.update(extra)
    return doc


def write(d: Path, name: str, doc: Any) -> Path:
    p = d / name
    p.write_text(json.dumps(doc) if name.endswith(".json") else yaml.safe_dump(doc))
    return p


def library_error(path: Path) -> str:
    """The reference library's error loading this spec file alone; empty when it loads it."""
    [spec, *_] = cdicheck.check([path])
    return spec.error


def test_good_spec_resolves_with_spec_edits_first(tmp_path: Path) -> None:
    write(tmp_path, "nvidia.yaml", spec())
    reg = cdi.Registry.load(tmp_path)
    assert reg.errors == {}
    res = reg.resolve(["nvidia.com/gpu=gpu-0", "nvidia.com/gpu=gpu-1"])
    assert res.env == {"NVIDIA_CTK": "1", "NVIDIA_VISIBLE_DEVICES": "GPU-bbb"}
    assert res.devices == [
        {"path": "/dev/nvidia0", "hostPath": "/dev/nvidia0"},
        {"path": "/dev/nvidia1", "hostPath": "/dev/nvidia1"},
    ]
    assert res.mounts == [{"hostPath": "/usr/lib/x", "containerPath": "/usr/lib/x", "options": ["ro"]}]
    assert res.cdi_devices == ["nvidia.com/gpu=gpu-0", "nvidia.com/gpu=gpu-1"]
    verdicts = cdicheck.check([tmp_path])
    assert cdicheck.problems(verdicts) == [] and len(verdicts) == 3


def test_leading_v_version_and_json(tmp_path: Path) -> None:
    write(tmp_path, "a.json", spec(version="v0.6.0", annotations={"example.com/a": "b"}))
    assert cdi.Registry.load(tmp_path).resolve(["nvidia.com/gpu=gpu-0"]).env["NVIDIA_VISIBLE_DEVICES"] == "GPU-aaa"
    assert library_error(tmp_path / "a.json") == ""


def test_resolve_merges_into_base_env(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", spec())
    base = cdi.ContainerEditsResult(env={"FOO": "bar", "NVIDIA_VISIBLE_DEVICES": "void"})
    res = cdi.Registry.load(tmp_path).resolve(["nvidia.com/gpu=gpu-0"], into=base)
    assert res.env == {"FOO": "bar", "NVIDIA_CTK": "1", "NVIDIA_VISIBLE_DEVICES": "GPU-aaa"}


def test_unknown_id_is_an_error(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", spec())
    with pytest.raises(cdi.CDIError, match=r"unresolvable CDI devices nvidia.com/gpu=gpu-9"):
        cdi.Registry.load(tmp_path).resolve(["nvidia.com/gpu=gpu-9"])


def test_malformed_qualified_name(tmp_path: Path) -> None:
    with pytest.raises(cdi.CDIError, match="invalid CDI device name"):
        cdi.Registry.load(tmp_path).resolve(["nvidia.com-gpu-0"])


def test_only_json_and_yaml_files_no_recursion(tmp_path: Path) -> None:
    write(tmp_path, "a.yml", spec())
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub", "a.yaml", spec())
    reg = cdi.Registry.load(tmp_path)
    assert reg.devices == {}
    with pytest.raises(cdi.CDIError):
        reg.resolve(["nvidia.com/gpu=gpu-0"])
    assert cdicheck.check([tmp_path]) == [], "the library's directory scan reads neither"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(cdiVersion="0.9.0"), "invalid version"),
        (lambda d: d.update(cdiVersion="0.2.0"), "unsupported version"),
        (lambda d: d.update(kind="nvidia.com"), "invalid kind"),
        (lambda d: d.update(kind="1nvidia.com/gpu"), "invalid vendor"),
        (lambda d: d.update(devices=[]), "no devices"),
        (lambda d: d["devices"].append(d["devices"][0]), 'multiple device "gpu-0"'),
        (lambda d: d["devices"][0].update(name="-bad"), "invalid device name"),
        (lambda d: d["devices"][0].update(containerEdits={}), "empty container edits"),
        (lambda d: d["devices"][0]["containerEdits"].update(env=["=x"]), "invalid environment variable"),
        (lambda d: d["devices"][0]["containerEdits"].update(env=["NOVALUE"]), "invalid environment variable"),
        (lambda d: d.update(unknownField=1), 'unknown field "unknownField"'),
        (lambda d: d["devices"][0]["containerEdits"].update(bogus=[]), 'unknown field "bogus"'),
        (lambda d: d["devices"][0]["containerEdits"]["deviceNodes"][0].update(type="x"), "invalid type"),
        (lambda d: d["devices"][0]["containerEdits"].update(mounts=[{"hostPath": "/a"}]), "missing containerPath"),
        (lambda d: d["devices"][0]["containerEdits"].update(hooks=[{"hookName": "x", "path": "/b"}]), "hook name"),
        (lambda d: d.update(cdiVersion=0.5), "expected str"),
    ],
)
def test_malformed_spec_makes_devices_unusable(tmp_path: Path, mutate: Any, message: str) -> None:
    doc = spec()
    mutate(doc)
    bad = write(tmp_path, "bad.json", doc)
    write(tmp_path, "other.yaml", spec(kind="example.com/other"))
    reg = cdi.Registry.load(tmp_path)
    errs = reg.errors[str(tmp_path / "bad.json")]
    assert any(message in e for e in errs), errs
    assert library_error(bad), "the reference library loads a spec the peer refuses"
    with pytest.raises(cdi.CDIError) as exc:
        reg.resolve(["nvidia.com/gpu=gpu-0"])
    assert "bad.json" in str(exc.value)
    # Other, valid specs stay usable.
    assert reg.resolve(["example.com/other=gpu-0"]).cdi_devices == ["example.com/other=gpu-0"]


@pytest.mark.parametrize(
    ("feature", "need"),
    [
        (lambda d: d["containerEdits"].update(mounts=[{"hostPath": "/a", "containerPath": "/a", "type": "bind"}]), "0.4.0"),
        (lambda d: d["devices"][1]["containerEdits"]["deviceNodes"][0].update(hostPath="/dev/x"), "0.5.0"),
        (lambda d: d["devices"][0].update(name="0gpu"), "0.5.0"),
        (lambda d: d.update(annotations={"a": "b"}), "0.6.0"),
        (lambda d: d["devices"][1].update(annotations={"a": "b"}), "0.6.0"),
        (lambda d: d.update(kind="nvidia.com/gpu.mig"), "0.6.0"),
        (lambda d: d["containerEdits"].update(additionalGids=[44]), "0.7.0"),
        (lambda d: d["containerEdits"].update(intelRdt={"closID": "c"}), "0.7.0"),
        (lambda d: d["containerEdits"].update(intelRdt={"enableMonitoring": True}), "1.1.0"),
        (lambda d: d["devices"][0]["containerEdits"].update(netDevices=[{"hostInterfaceName": "a", "name": "b"}]), "1.1.0"),
    ],
)
def test_version_too_low_for_feature(tmp_path: Path, feature: Any, need: str) -> None:
    doc = spec(version="0.3.0")
    del doc["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"]
    assert cdi.minimum_required_version(doc) == (0, 3, 0)
    feature(doc)
    assert cdi.fmt_version(cdi.minimum_required_version(doc)) == need
    with pytest.raises(cdi.SpecError, match=f"at least v{need}"):
        cdi.validate_spec(doc)
    assert f"the spec version must be at least v{need}" in library_error(write(tmp_path, "low.json", doc))
    doc["cdiVersion"] = need
    cdi.validate_spec(doc)
    [loaded] = [v for v in cdicheck.check([write(tmp_path, "ok.json", doc)]) if not v.device]
    assert loaded.ok and loaded.minimum_version == need, loaded


def test_duplicate_device_across_files_is_a_conflict(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", spec())
    dup = spec()
    dup["devices"] = [dup["devices"][0]]
    write(tmp_path, "b.json", dup)
    reg = cdi.Registry.load(tmp_path)
    assert "nvidia.com/gpu=gpu-0" in reg.conflicts
    assert any("conflicting device" in e for e in reg.errors[str(tmp_path / "a.yaml")])
    with pytest.raises(cdi.CDIError, match="several specs"):
        reg.resolve(["nvidia.com/gpu=gpu-0"])
    # The non-conflicting device of a.yaml is still fine.
    assert reg.resolve(["nvidia.com/gpu=gpu-1"]).env["NVIDIA_VISIBLE_DEVICES"] == "GPU-bbb"
    unresolved = {(Path(v.spec).name, v.device) for v in cdicheck.check([tmp_path]) if not v.ok}
    assert unresolved == {("a.yaml", "nvidia.com/gpu=gpu-0"), ("b.json", "nvidia.com/gpu=gpu-0")}


def test_field_names_match_exactly_as_the_library_decodes_them(tmp_path: Path) -> None:
    doc = spec()
    doc["CDIVersion"] = doc.pop("cdiVersion")
    with pytest.raises(cdi.SpecError, match='unknown field "CDIVersion"'):
        cdi.validate_spec(doc)
    assert "field CDIVersion not found" in library_error(write(tmp_path, "a.json", doc))


def edited(edit: Any, version: str = "0.5.0") -> str:
    doc = spec(version=version)
    edit(doc)
    return json.dumps(doc)


YAML_SPEC = "cdiVersion: 0.6.0\nkind: a.com/b\ndevices:\n- name: x\n  containerEdits:\n    env: [A=1]\n"


AGREEMENT_CASES = [
    # Where the peer and the library once parted ways (found by this test).
    ("yaml-duplicate-key.yaml", YAML_SPEC.replace("kind: a.com/b\n", "kind: a.com/b\nkind: a.com/c\n")),
    ("annotation-key.json", edited(lambda d: d.update(annotations={"Not A Key!": "x"}), "0.6.0")),
    ("hook-timeout.json", edited(lambda d: d["containerEdits"].update(
        hooks=[{"hookName": "prestart", "path": "/x", "timeout": 0}]))),
    ("rdt-closid.json", edited(lambda d: d["containerEdits"].update(intelRdt={"closID": ".."}), "0.7.0")),
    # Edges of names, types and versions.
    ("yaml.yaml", YAML_SPEC),
    ("colon-in-name.json", edited(lambda d: d["devices"][0].update(name="a:b"))),
    ("underscores.json", edited(lambda d: d.update(kind="a_b.com/g_b"))),
    ("no-permissions.json", edited(lambda d: d["containerEdits"].update(
        deviceNodes=[{"path": "/dev/x", "permissions": "none"}]))),
    ("negative-gid.json", edited(lambda d: d["containerEdits"].update(additionalGids=[-1]), "0.7.0")),
    ("version-0.1.0.json", edited(lambda d: d.update(cdiVersion="0.1.0"))),
    ("unicode-name.json", edited(lambda d: d["devices"][0].update(name="gpu-é"))),
    ("net-devices.json", edited(lambda d: d["devices"][0]["containerEdits"].update(
        netDevices=[{"hostInterfaceName": "a", "name": "b"}]), "1.1.0")),
]


@pytest.mark.parametrize(("name", "text"), AGREEMENT_CASES, ids=[name for name, _ in AGREEMENT_CASES])
def test_the_peer_loads_what_the_library_loads(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    try:
        cdi.load_spec_file(path)
        peer = ""
    except cdi.SpecError as e:
        peer = str(e)
    library = library_error(path)
    assert bool(peer) == bool(library), f"peer: {peer or 'loads it'}; library: {library or 'loads it'}"


def test_duplicate_json_keys_rejected(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text('{"cdiVersion": "0.5.0", "cdiVersion": "0.6.0", "kind": "a/b", "devices": []}')
    reg = cdi.Registry.load(tmp_path)
    assert any("duplicate field" in e for e in reg.errors[str(tmp_path / "a.json")])
    assert "already defined" in library_error(tmp_path / "a.json")
