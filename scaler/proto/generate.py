"""Generate the Python stubs of ``externalscaler.proto`` with grpcio-tools (a test dependency).

The stubs are committed next to the ``.proto`` so that installing tidegate needs no code
generation; ``tests/unit/scaler/test_proto.py`` regenerates them and fails when they drift.
The ``.proto`` is compiled as ``tidegate/scaler/proto/externalscaler.proto`` so the generated
``_pb2_grpc`` imports ``tidegate.scaler.proto.externalscaler_pb2`` (never a bare module name).

Run: ``python -m tidegate.scaler.proto.generate`` (rewrites the stubs in place).
"""

import pathlib
import re
import shutil
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
PROTO = HERE / "externalscaler.proto"
OUTPUTS = ("externalscaler_pb2.py", "externalscaler_pb2.pyi", "externalscaler_pb2_grpc.py")
_VERSION_LINES = re.compile(r"(Protobuf Python Version|GRPC_GENERATED_VERSION = |_runtime_version\.|^\s+\d+,\s*$)")


def generate() -> dict[str, str]:
    """Compile the ``.proto``; returns ``{file name: text}`` for :data:`OUTPUTS`.

    Raises RuntimeError when protoc fails (its exit code in the message).
    """
    from grpc_tools import protoc  # test/build dependency only

    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        pkg = root / "tidegate" / "scaler" / "proto"
        pkg.mkdir(parents=True)
        shutil.copy(PROTO, pkg / PROTO.name)
        rel = f"tidegate/scaler/proto/{PROTO.name}"
        include = pathlib.Path(protoc.__file__).parent / "_proto"
        rc = protoc.main(
            [
                "protoc",
                f"-I{root}",
                f"-I{include}",
                f"--python_out={root}",
                f"--pyi_out={root}",
                f"--grpc_python_out={root}",
                rel,
            ]
        )
        if rc != 0:
            raise RuntimeError(f"protoc failed with exit code {rc}")
        return {name: (pkg / name).read_text() for name in OUTPUTS}


def comparable(text: str) -> str:
    """Generated text without the lines that only name the generator's versions."""
    return "\n".join(line for line in text.splitlines() if not _VERSION_LINES.search(line))


def main() -> None:
    for name, text in generate().items():
        (HERE / name).write_text(text)
        print(f"wrote {HERE / name}")


if __name__ == "__main__":
    main()
