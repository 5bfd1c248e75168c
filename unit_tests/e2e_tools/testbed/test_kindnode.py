"""The offline kind node image's recipe (e2e/testbed/kindnode.py): the parts that need no Docker."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import yaml

from e2e.testbed import kindnode

DOCKERFILE = """\
RUN chmod 755 /kind /kind/bin && \\
    echo "Installing Packages ..." \\
    && DEBIAN_FRONTEND=noninteractive clean-install \\
      systemd \\
      conntrack iptables nftables \\
      bash ca-certificates curl jq procps \\
    && find /lib/systemd/system/sysinit.target.wants/ -name "systemd-tmpfiles-setup.service" -delete \\
    && ln -s /usr/lib/systemd/systemd /sbin/init
"""


def test_base_packages_are_the_clean_install_list_of_kinds_dockerfile() -> None:
    assert kindnode.base_packages(DOCKERFILE) == [
        "systemd", "conntrack", "iptables", "nftables", "bash", "ca-certificates", "curl", "jq", "procps"]


def test_file_capability_is_a_revision_2_effective_xattr() -> None:
    value = kindnode.file_capability(kindnode.CAP_NET_BIND_SERVICE)
    assert len(value) == 20
    assert int.from_bytes(value[0:4], "little") == 0x02000001
    assert int.from_bytes(value[4:8], "little") == 1 << 10  # permitted, low word
    assert value[8:] == bytes(12)


def test_minimal_rootfs_holds_binaries_users_caps_and_links(tmp_path: Path) -> None:
    binary = tmp_path / "coredns"
    binary.write_bytes(b"\x7fELF fake")
    component = kindnode.Component("coredns", ("registry.k8s.io/coredns/coredns:v1.14.6",), {"/coredns": binary},
                                   entrypoint=("/coredns",), user=kindnode.NONROOT,
                                   file_caps={"/coredns": kindnode.CAP_NET_BIND_SERVICE}, symlinks={"/bin/sh": "busybox"})
    with tarfile.open(fileobj=io.BytesIO(kindnode.minimal_rootfs(component))) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert members["tmp"].mode == 0o1777
        assert members["coredns"].mode == 0o755
        xattr = members["coredns"].pax_headers["SCHILY.xattr.security.capability"]
        assert xattr.encode("latin-1") == kindnode.file_capability(kindnode.CAP_NET_BIND_SERVICE)
        assert members["bin/sh"].issym() and members["bin/sh"].linkname == "busybox"
        passwd = tar.extractfile("etc/passwd")
        assert passwd is not None and b"nonroot:x:65532:" in passwd.read()


def test_cache_tag_follows_the_recipe(tmp_path: Path) -> None:
    def component(folder: str) -> kindnode.Component:
        return kindnode.Component("etcd", ("registry.k8s.io/etcd:3.7.0-0",), {"/usr/local/bin/etcd": tmp_path / folder / "etcd"},
                                  entrypoint=("/usr/local/bin/etcd",))
    assert component("a").cache_tag() == component("a").cache_tag()
    assert component("a").cache_tag() != component("b").cache_tag(), "a rebuilt binary (new gotools folder) is a new image"


def test_manifests_name_our_images_and_keep_kinds_markers() -> None:
    comps = [kindnode.Component(key, (f"dra-driver.local/kind/{key}:x",), {}, entrypoint=())
             for key in ("kindnetd", "local-path-provisioner", "local-path-helper")]
    out = kindnode.manifests(comps)
    cni, storage = out["default-cni.yaml"], out["default-storage.yaml"]
    assert "@KINDNETD_IMAGE@" not in cni
    assert "@LOCAL_PATH" not in storage
    # kind templates the pod subnet in and patches the API server's address in on these markers.
    assert "would you kindly template this file" in cni and "would you kindly patch this file" in cni
    docs = [d for d in yaml.safe_load_all(cni.replace("{{ .PodSubnet }}", "10.244.0.0/16")) if d]
    daemonset = next(d for d in docs if d["kind"] == "DaemonSet")
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "dra-driver.local/kind/kindnetd:x"
    assert isinstance(container["env"], list), "kind's patch appends to containers/0/env"
    storage_docs = [d for d in yaml.safe_load_all(storage) if d]
    storage_class = next(d for d in storage_docs if d["kind"] == "StorageClass")
    assert storage_class["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"] == "true"
    assert "dra-driver.local/kind/local-path-helper:x" in storage
