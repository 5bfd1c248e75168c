"""Regenerate dra_driver/_proto from api/proto (run: make proto).

With --check, generate into a temporary directory and fail if the committed code differs.
"""

from __future__ import annotations

import filecmp
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "api" / "proto"
PACKAGE = "dra_driver/_proto"


def generate(out: Path) -> None:
    protos = sorted(p.relative_to(PROTO_ROOT).as_posix() for p in PROTO_ROOT.rglob("*.proto"))
    # Mapping the proto root onto the package path makes the generated imports absolute
    # (dra_driver._proto....) so the code works without touching sys.path.
    args = [
        "protoc",
        f"-I{PACKAGE}={PROTO_ROOT}",
        f"-I{protoc_include()}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *[f"{PACKAGE}/{p}" for p in protos],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    for directory in [out / PACKAGE, *(d for d in (out / PACKAGE).rglob("*") if d.is_dir())]:
        (directory / "__init__.py").touch()


def protoc_include() -> str:
    import grpc_tools

    return str(Path(grpc_tools.__file__).parent / "_proto")


def tree(root: Path) -> dict[str, Path]:
    return {p.relative_to(root).as_posix(): p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def main() -> int:
    check = "--check" in sys.argv[1:]
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        fresh = tree(Path(tmp) / PACKAGE)
        committed_root = ROOT / PACKAGE
        if check:
            committed = tree(committed_root)
            stale = sorted(set(fresh) ^ set(committed))
            stale += [n for n in sorted(set(fresh) & set(committed)) if not filecmp.cmp(fresh[n], committed[n], shallow=False)]
            if stale:
                print(f"generated protobuf code is out of date ({', '.join(stale)}); run: make proto", file=sys.stderr)
                return 1
            return 0
        for name, src in fresh.items():
            dst = committed_root / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(src.read_bytes())
        for name in set(tree(committed_root)) - set(fresh):
            (committed_root / name).unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
