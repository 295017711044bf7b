"""Generate the Python gRPC stubs from ``protos/`` with the pinned grpcio-tools.

``make protos`` writes them into ``services/``; the contract test writes them into a temporary
directory and byte-compares with the checked-in files (the docs: stubs must come from
the pinned tools because they embed a protobuf runtime-version check).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PROTO_ROOT = ROOT / "protos"
DEFAULT_OUT = ROOT / "services"
#: The FileDescriptorSet of every proto file with source info (comments), relative to the output directory.
DESCRIPTOR_SET = Path("mascot/api/descriptors.binpb")


def proto_files(proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Return every ``.proto`` file under ``proto_root``, sorted for a stable order."""
    return sorted(proto_root.rglob("*.proto"))


def generate(out_dir: Path = DEFAULT_OUT, proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Run ``grpc_tools.protoc`` on every proto file, writing ``*_pb2.py``, ``*_pb2.pyi``, ``*_pb2_grpc.py`` and the
    descriptor set :data:`DESCRIPTOR_SET` (with comments, for gRPC reflection).

    Args:
        out_dir: Directory that receives the ``mascot/api/...`` tree.
        proto_root: Include root holding ``mascot/api/<domain>/v1/*.proto``.

    Returns:
        The generated files, relative to ``out_dir``.

    Raises:
        RuntimeError: protoc reported an error (its exit status is in the message).
    """
    from grpc_tools import protoc
    import grpc_tools

    wkt = Path(grpc_tools.__file__).parent / "_proto"
    files = [str(p.relative_to(proto_root)) for p in proto_files(proto_root)]
    (out_dir / DESCRIPTOR_SET).parent.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{proto_root}",
        f"-I{wkt}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        # the descriptors with their comments, served by gRPC reflection (grpcurl describe shows the docs)
        f"--descriptor_set_out={out_dir / DESCRIPTOR_SET}",
        "--include_imports",
        "--include_source_info",
        *files,
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise RuntimeError(f"protoc failed with exit status {rc}")
    generated = [DESCRIPTOR_SET]
    for f in files:
        stem = f[: -len(".proto")]
        generated += [Path(stem + "_pb2.py"), Path(stem + "_pb2.pyi"), Path(stem + "_pb2_grpc.py")]
    return generated


def main() -> None:
    """Entry point of ``make protos``."""
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT
    for p in generate(out):
        print(p)


if __name__ == "__main__":
    main()
