"""Build the archive the krew manifest (deploy/krew/dra.yaml) points at, byte for byte the same on
every machine (fixed owner, mode and time), so its sha256 in the manifest can be checked here.

    python deploy/krew/archive.py [OUT.tar.gz]   # prints the archive's sha256

Nothing is published: the manifest's uri is where a release would upload the archive, and
``kubectl krew install --manifest=deploy/krew/dra.yaml --archive=OUT.tar.gz`` installs it from here.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
FILES = (("kubectl-dra", HERE / "kubectl-dra", 0o755), ("LICENSE", HERE.parent.parent / "LICENSE", 0o644))


def archive() -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, path, mode in FILES:
            data = path.read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime, info.uname, info.gname = len(data), mode, 0, "root", "root"
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)


def main(argv: list[str]) -> int:
    data = archive()
    if len(argv) > 1:
        Path(argv[1]).write_bytes(data)
    print(hashlib.sha256(data).hexdigest())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
