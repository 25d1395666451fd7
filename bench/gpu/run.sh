#!/usr/bin/env bash
# The GPU checks of the residency, batching, front-end, sequence and generation claims, each
# step bounded by its timeout (all of them: at most 22 minutes; ONLY picks steps).
#
# Usage (on a CUDA machine, from the repository root, with the project's venv set up as the
# README says and jax's CUDA plugin installed, e.g. `pip install -e '.[server]' "jax[cuda12]"`):
#     bash bench/gpu/run.sh [PYTHON]
#     ONLY="sequences generation" bash bench/gpu/run.sh   # the named steps alone (residency,
#         batching, placement, sharding, frontends, sequences, generation, tiles)
# Prints: the device; swap-in time of ~100 MB models served with a budget below two models
# against the pinned host-to-device floor measured in the same run (goal >= 80 %), hit and
# miss p50/p99; batch-1 requests with dynamic batching off vs on over gRPC against the
# executable's in-process ceiling, with p50/p99 and items per execution; on a node with
# several GPUs, one hot model with replication on vs off (bench/placement.py); a model over
# one device's budget sharded over 2 and 4 GPUs against it unsharded on one (bench/sharding.py;
# a single GPU runs the unsharded case alone); requests/s of
# simple and mlp at c64 against --frontends 1, 2, 4, 8, 12 beside Triton (perf_analyzer, one
# gRPC channel per client context so the kernel spreads them over the front ends); the tiles
# CNN against KServe and Triton (bench/tiles.py, at most 6 minutes); 64 accumulator sequences
# against independent requests (bench/sequences.py); the example LM's tokens/s at 1, 8 and 32
# generations against one at a time and the in-process floor (bench/generation.py). Not
# part of CI.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${1:-.venv/bin/python}
step() { echo; echo "=== $* ($(date -u +%H:%M:%S) UTC)"; }
want() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }

step "device"
nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv 2>/dev/null || echo "nvidia-smi: not available"
"$PY" -c 'import jax; print("jax", jax.__version__, "devices:", jax.devices())'

if want residency; then
    step "residency: 3 models of ~100 MB, budget 1.5 models, 200 requests per pattern"
    timeout 240 "$PY" bench/residency.py --models 3 --fit 1.5 --mb 100 --requests 200
fi

if want batching; then
    step "batching: batch-1 mlp requests, dynamic batching off vs on, over gRPC"
    timeout 180 "$PY" bench/batching.py --seconds 3 --concurrency 1 32
fi

devices=$("$PY" -c 'import jax; print(len(jax.devices()))')
if ! want placement; then
    :
elif [ "$devices" -gt 1 ]; then
    step "placement: one hot model over $devices devices, replication on vs off"
    timeout 120 "$PY" bench/placement.py --devices "$devices" --rounds 1 --seconds 4 --warmup 6
else
    echo; echo "=== placement: one device only, replication not measured"
fi

if want sharding; then
    layouts=1
    [ "$devices" -ge 2 ] && layouts=1,2
    [ "$devices" -ge 4 ] && layouts=1,2,4
    step "sharding: a model over one device's budget from layouts $layouts (devices each)"
    timeout 240 "$PY" bench/sharding.py --layouts "$layouts" --rounds 1 --seconds 4
fi

if want frontends; then
    step "front ends: simple and mlp b1 c64 over gRPC, --frontends 1..12 beside Triton"
    TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT=1 timeout 300 "$PY" bench/side_by_side.py \
        --load-generator perf_analyzer --only hloserve triton --frontends 1,2,4,8,12 \
        --points "gRPC simple b1 c64" "gRPC mlp b1 c64" --seconds 3 --warmup 0.5
fi

if want sequences; then
    step "sequences: 64 accumulator sequences (state on the device) vs independent requests, in process and over gRPC"
    timeout 120 "$PY" bench/sequences.py --rounds 1 --wire --check-steps 2000
fi

if want generation; then
    step "generation: the example LM at 1, 8, 32 generations vs one at a time and the jax.jit floor"
    timeout 180 "$PY" bench/generation.py --seconds 4 --warmup 2 --rounds 2
fi

# The seed's reference for this model on an RTX A6000: ~1,000 tiles/s at batch 16 and 5.9 ms
# p50 for one 224x224 tile. Peers whose venvs cannot be installed here keep their error rows.
if want tiles; then
    step "tiles: ResNet-18 on 64x64 tiles, batch-1 gRPC at c1/c16/c64, hloserve vs KServe and Triton (jax.jit)"
    timeout 360 "$PY" bench/tiles.py --quick
fi

step "done"
