"""Builds the `megatrain` Python client: `pip install client/python`.

The gRPC modules are generated from proto/megatrain.proto while the package is
built (never committed): megatrain/_proto/megatrain_pb2{,_grpc}.py. The code
generator is grpcio-tools when it understands proto3 `optional` (1.32 or newer),
else the system protoc with grpc_python_plugin (Debian 12's python3-grpc-tools
is 1.14, too old for this proto; protobuf-compiler and protobuf-compiler-grpc
generate code matching python3-protobuf 3.21 and python3-grpcio 1.51).
MEGATRAIN_PROTO names the .proto when the package is built outside a checkout.

No pyproject.toml on purpose: without one, pip builds with the setuptools
already installed, so the install works offline.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def proto_path():
    path = os.environ.get("MEGATRAIN_PROTO") or os.path.join(
        HERE, "..", "..", "proto", "megatrain.proto")
    if not os.path.isfile(path):
        sys.exit(f"megatrain setup: {path} not found; build from a checkout or set "
                 "MEGATRAIN_PROTO to proto/megatrain.proto")
    return os.path.abspath(path)


def grpc_tools_usable():
    """grpcio-tools 1.32+ bundles a protoc that accepts proto3 `optional`."""
    try:
        from importlib.metadata import version
        major, minor = (int(x) for x in version("grpcio-tools").split(".")[:2])
        import grpc_tools.protoc  # noqa: F401
    except Exception:  # not installed, or a version string we cannot read
        return False
    return (major, minor) >= (1, 32)


def run_codegen(proto, out_dir):
    include = os.path.dirname(proto)
    args = [f"-I{include}", f"--python_out={out_dir}", f"--grpc_python_out={out_dir}", proto]
    if grpc_tools_usable():
        import grpc_tools
        from grpc_tools import protoc
        well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
        if protoc.main(["grpc_tools.protoc", f"-I{well_known}"] + args) != 0:
            sys.exit("megatrain setup: grpc_tools.protoc failed on " + proto)
        return
    protoc_bin = shutil.which("protoc")
    plugin = shutil.which("grpc_python_plugin")
    if not protoc_bin or not plugin:
        sys.exit("megatrain setup: no code generator: install grpcio-tools>=1.32, or Debian's "
                 "protobuf-compiler and protobuf-compiler-grpc (scripts/setup does)")
    subprocess.run([protoc_bin, f"--plugin=protoc-gen-grpc_python={plugin}"] + args, check=True)


def generate(package_dir):
    """Writes megatrain_pb2.py and megatrain_pb2_grpc.py into package_dir/_proto."""
    out = os.path.join(package_dir, "_proto")
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        run_codegen(proto_path(), tmp)
        for name in ("megatrain_pb2.py", "megatrain_pb2_grpc.py"):
            with open(os.path.join(tmp, name)) as f:
                text = f.read()
            # The generated stub imports its messages as a top-level module; inside the
            # package it must be relative.
            text = re.sub(r"^import megatrain_pb2 as", "from . import megatrain_pb2 as", text,
                          flags=re.M)
            with open(os.path.join(out, name), "w") as f:
                f.write(text)
    with open(os.path.join(out, "__init__.py"), "w") as f:
        f.write('"""Generated from proto/megatrain.proto at build time."""\n')


class BuildPyWithProto(build_py):
    def run(self):
        super().run()
        generate(os.path.join(self.build_lib, "megatrain"))


setup(
    name="megatrain",
    version="0.1.0",
    description="Python client of megatraind, the megatrain training daemon",
    packages=["megatrain"],
    python_requires=">=3.9",
    # The daemon speaks gRPC 1.51 / protobuf 3.21; these are Debian 12's python3-grpcio and
    # python3-protobuf (which reports 4.21).
    install_requires=["grpcio>=1.51", "protobuf>=4.21"],
    cmdclass={"build_py": BuildPyWithProto},
)
