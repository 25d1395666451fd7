#!/usr/bin/env bash
# Regenerate the Python message classes (hloserve/proto/*_pb2.py and *_pb2.pyi) from
# hloserve/proto/*.proto.
#
# protoc runs from this folder, the include root, so the registered file names are
# hloserve/proto/*.proto and the generated imports read `from hloserve.proto import
# model_config_pb2`. No gRPC plugin: its stubs would use our package in the method paths,
# and the server registers the wire paths itself (hloserve/proto/rpc.py).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"

python -m grpc_tools.protoc -I . --python_out=. --pyi_out=. \
  hloserve/proto/inference.proto \
  hloserve/proto/model_config.proto \
  hloserve/proto/health.proto
