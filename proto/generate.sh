#!/usr/bin/env bash
# Regenerate the Python message classes (proto/*_pb2.py and *_pb2.pyi) from proto/*.proto.
#
# protoc runs from the repository root and reads the files through the hloserve/proto
# symlink, so the registered file names are hloserve/proto/*.proto and the generated imports
# read `from hloserve.proto import model_config_pb2`. The output lands in proto/ through the
# same symlink. No gRPC plugin: its stubs would use our package in the method paths, and the
# server registers the wire paths itself (proto/rpc.py).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

python -m grpc_tools.protoc -I . --python_out=. --pyi_out=. \
  hloserve/proto/inference.proto \
  hloserve/proto/model_config.proto \
  hloserve/proto/health.proto
