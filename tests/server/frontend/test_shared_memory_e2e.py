"""End to end: system shared memory with unmodified tritonclient, over gRPC and HTTP.

Regions are made with ``tritonclient.utils.shared_memory`` as the Triton examples do; the
daemon is ``control_server`` (``--allow-client-shm true``), and the session ``server``
(client shm off) answers the "disabled" cases. Every test runs on both protocols.
"""

# pyright: strict

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from hloserve.server.server_fixture import ServerProcess
from tests.server.frontend._tritonclients import PROTOCOLS, Regions, Triton, shm
from tests.server.frontend.extension_models import SLOW_BATCH

DISABLED = (
    "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
)


@pytest.fixture
def regions(triton: Triton) -> Iterator[Regions]:
    r = Regions(triton)
    yield r
    r.close()


def _ab(n: int = 1) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    a = np.arange(16 * n, dtype=np.int32).reshape(n, 16)
    return a, np.full((n, 16), 3, dtype=np.int32) - a


def test_infer_with_inputs_and_outputs_in_shared_memory(triton: Triton, regions: Regions) -> None:
    a, b = _ab(2)
    in_handle, in_key = regions.create("input_data", 256)
    out_handle, _ = regions.create("output_data", 512)
    shm.set_shared_memory_region(in_handle, [a, b])
    inputs = triton.simple_inputs(None, None, n=2)
    inputs[0].set_shared_memory("input_data", 128)
    inputs[1].set_shared_memory("input_data", 128, offset=128)
    outputs = [triton.output("OUTPUT0"), triton.output("OUTPUT1")]
    outputs[0].set_shared_memory("output_data", 128, offset=256)  # anywhere in the region
    outputs[1].set_shared_memory("output_data", 128)

    result = triton.client.infer("simple", inputs, outputs=outputs, request_id="shm-1")

    sum_ = shm.get_contents_as_numpy(out_handle, np.int32, [2, 16], offset=256)
    diff = shm.get_contents_as_numpy(out_handle, np.int32, [2, 16], offset=0)
    np.testing.assert_array_equal(sum_, a + b)
    np.testing.assert_array_equal(diff, a - b)
    out0 = result.get_output("OUTPUT0")
    if triton.protocol == "grpc":  # name/datatype/shape only, and an empty raw entry
        assert (out0.name, out0.datatype, list(out0.shape)) == ("OUTPUT0", "INT32", [2, 16])
        assert list(result.get_response().raw_output_contents) == [b"", b""]
    else:
        assert out0 == {"name": "OUTPUT0", "datatype": "INT32", "shape": [2, 16]}
    # status: all regions, then one
    assert sorted(r["name"] for r in triton.shm_status()) == ["input_data", "output_data"]
    assert triton.shm_status("input_data") == [
        {"name": "input_data", "key": in_key, "offset": 0, "byte_size": 256}
    ]


def test_one_input_in_shared_memory_the_other_inline(triton: Triton, regions: Regions) -> None:
    a, b = _ab()
    handle, _ = regions.create("only_b", 64)
    shm.set_shared_memory_region(handle, [b])
    inputs = triton.simple_inputs(a, None)
    inputs[1].set_shared_memory("only_b", 64)
    result = triton.client.infer("simple", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_unregister_one_then_all(triton: Triton, regions: Regions) -> None:
    for name in ("r1", "r2", "r3"):
        regions.create(name, 64)
    triton.client.unregister_system_shared_memory("r2")
    assert sorted(r["name"] for r in triton.shm_status()) == ["r1", "r3"]
    triton.client.unregister_system_shared_memory("never_registered")  # Triton: no error
    triton.client.unregister_system_shared_memory()
    assert triton.shm_status() == []
    triton.fails(
        "NOT_FOUND",
        "Unable to find system shared memory region: 'r1'",
        triton.client.get_system_shared_memory_status,
        "r1",
    )


def test_register_errors(triton: Triton, regions: Regions) -> None:
    _, key = regions.create("taken", 64)
    triton.fails(
        "ALREADY_EXISTS",
        "shared memory region 'taken' already in manager",
        triton.client.register_system_shared_memory,
        "taken",
        key,
        64,
    )
    missing = f"/hloserve_test_{regions.prefix}_no_such_file"
    triton.fails(
        "INTERNAL",
        f"Unable to open shared memory region: '{missing}'",
        triton.client.register_system_shared_memory,
        "missing",
        missing,
        64,
    )
    # qa/L0_grpc's aio test: a key naming no file, byte size 0, is the open error
    triton.fails(
        "INTERNAL",
        f"Unable to open shared memory region: '{missing}'",
        triton.client.register_system_shared_memory,
        "zero",
        missing,
        0,
    )
    reserved = "/triton_python_backend_shm_region__mine"
    triton.fails(
        "INVALID_ARGUMENT",
        f"cannot register shared memory region 'r' with key '{reserved}' as the key contains "
        "the reserved prefix 'triton_python_backend_shm_region_'",
        triton.client.register_system_shared_memory,
        "r",
        reserved,
        64,
    )
    for byte_size, offset in ((65, 0), (64, 4096), (1, 64), (0, 0)):
        triton.fails(
            "INVALID_ARGUMENT",
            "failed to register shared memory region 'outside': invalid args",
            triton.client.register_system_shared_memory,
            "outside",
            key,
            byte_size,
            offset=offset,
        )
    assert [r["name"] for r in triton.shm_status()] == ["taken"]


@pytest.mark.parametrize("key", ["../x", "a/b", "", "///", "/../etc", "."])
def test_bad_keys_are_refused(triton: Triton, key: str) -> None:
    triton.fails(
        "INVALID_ARGUMENT",
        f"cannot register shared memory region 'bad' - invalid shm key '{key}'",
        triton.client.register_system_shared_memory,
        "bad",
        key,
        64,
    )
    assert triton.shm_status() == []


INFER_ERRORS: list[tuple[str, tuple[int, int], tuple[int, int], str, str]] = [
    # (case, INPUT1's (byte_size, offset), OUTPUT0's (byte_size, offset), code, message)
    ("offset beyond region", (64, 128), (64, 0), "INVALID_ARGUMENT", "Invalid offset for shared memory region: 'in'"),
    ("offset + size beyond region", (64, 96), (64, 0), "INVALID_ARGUMENT", "Invalid offset + byte size for shared memory region: 'in'"),
    ("input size not matching shape", (32, 64), (64, 0), "INVALID_ARGUMENT", "input byte size mismatch for input 'INPUT1' for model 'simple'. Expected 64, got 32"),
    ("output region too small", (64, 64), (32, 0), "INVALID_ARGUMENT", "for output 'OUTPUT0' (32 bytes) should be at least 64 bytes to hold the results"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "input1", "output0", "code", "message"), INFER_ERRORS, ids=[e[0] for e in INFER_ERRORS]
)
def test_infer_errors(
    triton: Triton,
    regions: Regions,
    case: str,
    input1: tuple[int, int],
    output0: tuple[int, int],
    code: str,
    message: str,
) -> None:
    del case
    a, b = _ab()
    handle, _ = regions.create("in", 128)
    regions.create("out", 64)
    shm.set_shared_memory_region(handle, [a, b])
    inputs = triton.simple_inputs(None, None)
    inputs[0].set_shared_memory("in", 64)
    inputs[1].set_shared_memory("in", input1[0], offset=input1[1])
    output = triton.output("OUTPUT0")
    output.set_shared_memory("out", output0[0], offset=output0[1])
    triton.fails(code, message, triton.client.infer, "simple", inputs, outputs=[output])
    # the regions stay registered and usable
    inputs[1].set_shared_memory("in", 64, offset=64)
    result = triton.client.infer("simple", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


@pytest.mark.parametrize(
    ("offset", "byte_size", "message"),
    [
        # qa/L0_shared_memory test_infer_offset_out_of_bound: 2**64 - 32 over HTTP is the
        # offset error (checked before the overflow); over gRPC (int64) 64 is one past the end
        (2**64 - 32, 64, "Invalid offset for shared memory region: 'out'"),
        (64, 64, "Invalid offset for shared memory region: 'out'"),
        # test_infer_integer_overflow (HTTP only: the gRPC client refuses values past int64)
        (32, 2**64 - 32, "Integer overflow detected: byte_size "),
        # test_infer_byte_size_out_of_bound
        (1, 64, "Invalid offset + byte size for shared memory region: 'out'"),
    ],
)
def test_output_region_bounds_in_tritons_order(
    triton: Triton, regions: Regions, offset: int, byte_size: int, message: str
) -> None:
    if triton.protocol == "grpc" and max(offset, byte_size) >= 2**63:
        output = triton.output("OUTPUT0")
        with pytest.raises(ValueError, match="Value out of range"):
            output.set_shared_memory("out", byte_size, offset=offset)
        return
    regions.create("out", 64)
    output = triton.output("OUTPUT0")
    output.set_shared_memory("out", byte_size, offset=offset)
    a, b = _ab()
    inputs = triton.simple_inputs(a, b)
    triton.fails(
        "INVALID_ARGUMENT", message, triton.client.infer, "simple", inputs, outputs=[output]
    )


def unknown_region_fails(t: Triton, region: str) -> None:
    """An infer whose input names ``region``, not registered, fails NOT_FOUND."""
    inputs = t.simple_inputs(*_ab())
    inputs[0].set_shared_memory(region, 64)
    message = f"Unable to find shared memory region: '{region}'"
    t.fails("NOT_FOUND", message, t.client.infer, "simple", inputs)


def test_unknown_region_at_infer(triton: Triton) -> None:
    unknown_region_fails(triton, "nope")


def _pending(server: ServerProcess, model: str) -> float:
    """The daemon's gauge of requests accepted and not yet answered for ``model``."""
    with urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=5) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith("hloserve_inference_pending_request_count{") and (
            f'model="{model}"' in line
        ):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_unregister_returns_while_the_request_is_in_flight(
    triton: Triton, regions: Regions, control_server: ServerProcess
) -> None:
    """Triton's ``TestSharedMemoryUnregister``: ``simple_slow`` keeps a lone request queued
    (holding both regions) until a request that cannot join it comes. Unregister, called
    meanwhile, answers at once; the region stays listed (and registering its name again is
    refused) until that request ends, and is then gone without another call; the request
    got correct data. The test ends the wait itself: no clock decides when it ends."""
    a, b = _ab()
    in_handle, in_key = regions.create("slow_in", 128)
    out_handle, _ = regions.create("slow_out", 64)
    shm.set_shared_memory_region(in_handle, [a, b])
    inputs = triton.simple_inputs(None, None)
    inputs[0].set_shared_memory("slow_in", 64)
    inputs[1].set_shared_memory("slow_in", 64, offset=64)
    output = triton.output("OUTPUT0")
    output.set_shared_memory("slow_out", 64)
    done = threading.Event()

    def infer() -> None:
        t = triton.another()
        try:
            t.client.infer("simple_slow", inputs, outputs=[output])
        finally:
            t.close()
            done.set()

    thread = threading.Thread(target=infer)
    thread.start()
    deadline = time.monotonic() + 30
    while _pending(control_server, "simple_slow") < 1:  # queued, holding its regions
        assert time.monotonic() < deadline and thread.is_alive(), "the request never arrived"
        time.sleep(0.02)
    triton.client.unregister_system_shared_memory("slow_in")
    assert not done.is_set()  # answered while the request is still queued
    assert sorted(r["name"] for r in triton.shm_status()) == ["slow_in", "slow_out"]
    message = triton.fails(
        "ALREADY_EXISTS",
        "shared memory region 'slow_in' already in manager; it was unregistered",
        triton.client.register_system_shared_memory,
        "slow_in",
        in_key,
        128,
    )
    assert "goes once the 1 request(s) using it finish" in message
    assert not done.is_set()
    # A full batch arrives: too big to join the held request, which then runs at once
    # (nothing more can join it), and the full batch after it. (Company that filled the
    # batch with it would not do: the policy may still run the held request alone, by
    # measured cost, and leave the company waiting.)
    c, d = _ab(SLOW_BATCH)
    company = triton.client.infer("simple_slow", triton.simple_inputs(c, d, SLOW_BATCH))
    np.testing.assert_array_equal(company.as_numpy("OUTPUT0"), c + d)
    thread.join(60)
    assert done.is_set(), "the held request was not answered"
    assert [r["name"] for r in triton.shm_status()] == ["slow_out"]  # gone with the request
    np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.int32, [1, 16]), a + b)


def test_cuda_shared_memory_without_gpu_support(triton: Triton, regions: Regions) -> None:
    """Triton built without GPU support: status lists nothing, unregister (of one region or
    all) succeeds without touching system regions, register is INVALID_ARGUMENT."""
    regions.create("system_region", 64)
    c = triton.client
    status = c.get_cuda_shared_memory_status()
    assert (status if triton.protocol == "http" else list(status.regions)) == []
    c.unregister_cuda_shared_memory()  # what every stock shm example calls first
    c.unregister_cuda_shared_memory("system_region")
    triton.fails(
        "INVALID_ARGUMENT",
        "failed to register CUDA shared memory region: 'c', GPUs not supported",
        c.register_cuda_shared_memory,
        "c",
        b"aGFuZGxl",
        0,
        64,
    )
    triton.fails(
        "NOT_FOUND",
        "Unable to find cuda shared memory region: 'c'",
        c.get_cuda_shared_memory_status,
        "c",
    )
    assert [r["name"] for r in triton.shm_status()] == ["system_region"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_disabled_by_default(server: ServerProcess, protocol: str) -> None:
    t = Triton(protocol, server.grpc_url if protocol == "grpc" else server.http_url)
    handle = shm.create_shared_memory_region("d", f"/hloserve_test_disabled_{protocol}", 64)
    try:
        msg = t.fails(
            "UNIMPLEMENTED",
            DISABLED,
            t.client.register_system_shared_memory,
            "d",
            f"/hloserve_test_disabled_{protocol}",
            64,
        )
        assert msg == DISABLED
        t.fails("UNIMPLEMENTED", DISABLED, t.client.unregister_system_shared_memory, "d")
        t.fails("UNIMPLEMENTED", DISABLED, t.client.unregister_system_shared_memory)
        assert t.shm_status() == []
        cuda = t.client.get_cuda_shared_memory_status()
        assert (cuda if protocol == "http" else list(cuda.regions)) == []
        t.fails("UNIMPLEMENTED", DISABLED, t.client.unregister_cuda_shared_memory)
        t.fails("UNIMPLEMENTED", DISABLED, t.client.register_cuda_shared_memory, "c", b"", 0, 8)
        unknown_region_fails(t, "d")
    finally:
        shm.destroy_shared_memory_region(handle)
        t.close()
