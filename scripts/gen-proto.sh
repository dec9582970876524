#!/usr/bin/env bash
# Regenerate shardgate/api/grpc/shardgate_pb2.py, shardgate_pb2.pyi and
# shardgate_pb2_grpc.py from shardgate/api/grpc/shardgate.proto with grpc_tools
# (pip install -e '.[dev]'). Run from anywhere; commit the result.
#
# The generated modules are committed so that installing shardgate needs no
# protoc. After regenerating, check that the `protobuf>=` lower bound in
# pyproject.toml is at least the gencode version the new shardgate_pb2.py
# checks (see its ValidateProtobufRuntimeVersion call).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-"$ROOT/.venv/bin/python"}
[ -x "$PYTHON" ] || PYTHON=python3

cd "$ROOT"
# Generating from the repository root with the package path as the import path
# makes protoc write `from shardgate.api.grpc import shardgate_pb2` in the _grpc
# module, so the generated code imports as a package without edits.
"$PYTHON" -m grpc_tools.protoc \
  --proto_path=. \
  --python_out=. \
  --pyi_out=. \
  --grpc_python_out=. \
  shardgate/api/grpc/shardgate.proto

grep -o "ValidateProtobufRuntimeVersion([^)]*)" -z shardgate/api/grpc/shardgate_pb2.py | tr -d '\n\0 ' \
  | sed 's/^/generated: /' && echo
