"""A prepared claim's files are what this version writes: a spec or metadata file with other content
(an earlier version wrote it, or someone changed it) is re-written on re-prepare and at start-up; a
file that is right is left alone (same inode, same mtime)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from nodefix import DRIVER, make_claim
from test_metadata import MetaEnv

from dra_driver.node.prepare.cdispec import SPEC_MODE


def identity(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_ino, st.st_mtime_ns


def test_re_prepare_rewrites_a_changed_spec_and_leaves_a_right_one(tmp_path: Path) -> None:
    env = MetaEnv(tmp_path)
    ref = env.reader.add(make_claim("c", [("gpu", "gpu-0")]))
    first = env.state.prepare([ref])[ref.uid]
    assert first.ok
    spec = env.cdi_root / f"k8s.{DRIVER}-claim_{ref.uid}.json"
    meta = env.host_dir / f"{ref.uid}_gpu.json"
    meta_spec = env.meta_spec_path(ref.uid, "gpu")
    right = {p: (p.read_bytes(), identity(p)) for p in (spec, meta, meta_spec)}
    # Unchanged: nothing is written.
    assert env.state.prepare([ref])[ref.uid] == first
    assert {p: (p.read_bytes(), identity(p)) for p in right} == right
    # An earlier version's spec (other edits), a changed metadata file: both replaced, atomically.
    old = json.loads(spec.read_bytes())
    old["containerEdits"]["env"] = ["WRITTEN_BY=an-earlier-version"]
    spec.write_text(json.dumps(old))
    meta.write_text("tampered")
    again = env.state.prepare([ref])[ref.uid]
    assert again == first
    assert spec.read_bytes() == right[spec][0] and meta.read_bytes() == right[meta][0]
    assert spec.stat().st_ino != right[spec][1][0], "replaced by rename, not written in place"
    assert os.stat(spec).st_mode & 0o777 == SPEC_MODE
    assert identity(meta_spec) == right[meta_spec][1], "the file that was right is left alone"


def test_start_up_rewrites_specs_an_earlier_version_wrote(tmp_path: Path) -> None:
    env = MetaEnv(tmp_path)
    ref = env.reader.add(make_claim("c", [("gpu", "gpu-1")]))
    assert env.state.prepare([ref])[ref.uid].ok
    spec = env.cdi_root / f"k8s.{DRIVER}-claim_{ref.uid}.json"
    right = spec.read_bytes()
    spec.write_bytes(right.replace(b"gpu-1", b"gpu-one"))
    env.state.close()
    env.state = env.new_state()
    assert spec.read_bytes() == right
    unchanged = identity(spec)
    env.state.close()
    env.state = env.new_state()
    assert identity(spec) == unchanged
