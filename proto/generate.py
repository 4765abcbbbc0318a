"""Regenerate the committed protobuf/gRPC Python modules from proto/*.proto.

Usage (the one documented command)::

    python -m proto.generate          # rewrite proto/*_pb2.py, *_pb2_grpc.py
    python -m proto.generate --check  # exit 1 if the committed code is stale

The generated modules use package-relative imports (``from . import x_pb2``)
so they work as ``proto.x_pb2`` without touching ``sys.path``.
"""
from __future__ import annotations

import argparse
import pathlib
import re
import sys
import tempfile

PROTO_DIR = pathlib.Path(__file__).resolve().parent


def _generate(out_dir: pathlib.Path) -> None:
    from grpc_tools import protoc  # imported lazily: only needed to regenerate

    import grpc_tools

    include = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    sources = sorted(p.name for p in PROTO_DIR.glob("*.proto"))
    args = ["protoc", f"-I{PROTO_DIR}", f"-I{include}", f"--python_out={out_dir}",
            f"--grpc_python_out={out_dir}", *sources]
    rc = protoc.main(args)
    if rc != 0:
        raise SystemExit(f"protoc failed with exit code {rc}")
    for path in out_dir.glob("*_pb2*.py"):
        text = path.read_text()
        text = re.sub(r"^import (\w+_pb2) as", r"from . import \1 as", text, flags=re.M)
        path.write_text(text)


def generated_files(out_dir: pathlib.Path) -> dict[str, str]:
    """File name -> text of every generated module (``*_pb2*.py``) in ``out_dir``."""
    return {p.name: p.read_text() for p in sorted(out_dir.glob("*_pb2*.py"))}


def main(argv: list[str] | None = None) -> int:
    """``python -m proto.generate [--check]``: regenerate into a temporary dir, then rewrite
    the committed modules (stale ones removed), or with ``--check`` compare only. Returns
    the exit status (1: committed code is stale); SystemExit when protoc fails."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only check that the committed code is fresh")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        tmp_dir = pathlib.Path(tmp)
        _generate(tmp_dir)
        fresh = generated_files(tmp_dir)
        if args.check:
            committed = generated_files(PROTO_DIR)
            stale = sorted(n for n in fresh.keys() | committed.keys() if fresh.get(n) != committed.get(n))
            if stale:
                print("stale generated code: " + ", ".join(stale) + "; run: python -m proto.generate")
                return 1
            print("generated code is fresh")
            return 0
        for old in PROTO_DIR.glob("*_pb2*.py"):
            if old.name not in fresh:
                old.unlink()
        for name, text in fresh.items():
            (PROTO_DIR / name).write_text(text)
        print(f"wrote {len(fresh)} modules to {PROTO_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
