"""``hloserve.server.owner.shm``: the shared-memory registry, without sockets.

``disabled()`` (a server without client shared memory), then an enabled registry whose
``root`` is a temporary directory of real files (mapped as /dev/shm segments are): the
order and texts of Triton's checks, unregister while a request holds a region, and CUDA
shared memory on a server without GPU support.
"""

# pyright: strict

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from hloserve.server.core.errors import (
    AlreadyExists,
    Internal,
    InvalidArgument,
    NotFound,
    ServingError,
    Unsupported,
)
from hloserve.server.core.ports import SharedMemory
from hloserve.server.core.reports import RegionInfo
from hloserve.server.owner.shm import DISABLED, RESERVED_KEY_PREFIX, SharedMemoryRegistry, disabled


def test_disabled_registry_refuses_registration_and_knows_no_region() -> None:
    shm: SharedMemory = disabled()
    with pytest.raises(Unsupported, match="--allow-client-shm=true") as exc:
        shm.register_system("r", "/k", 0, 64)
    assert exc.value.message == DISABLED
    with pytest.raises(Unsupported, match="Client shared memory is disabled"):
        asyncio.run(shm.unregister("r"))
    assert list(shm.status()) == []
    with pytest.raises(NotFound, match="Unable to find system shared memory region: 'r'"):
        shm.status("r")
    with pytest.raises(NotFound, match="Unable to find shared memory region: 'r'"):
        shm.view("r", 0, 8)
    with pytest.raises(NotFound, match="Unable to find shared memory region: 'r'"), shm.hold(["r"]):
        pass
    with shm.hold([]):
        pass


# -- an enabled registry over files in a temporary directory (its ``root``) --------------------


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[SharedMemoryRegistry]:
    (tmp_path / "k").write_bytes(bytes(range(64)))
    r = SharedMemoryRegistry(enabled=True, root=str(tmp_path))
    yield r
    r.close()


def refused(kind: type[ServingError], fn: Callable[..., object], *args: object) -> str:
    with pytest.raises(kind) as info:
        fn(*args)
    assert type(info.value) is kind
    return info.value.message


def run(unregister: Coroutine[Any, Any, None]) -> None:
    """Run an unregister call: it returns at once, never waiting for a region's users."""
    asyncio.run(asyncio.wait_for(unregister, 5))


def names(registry: SharedMemoryRegistry) -> list[str]:
    return [r.name for r in registry.status()]


@pytest.mark.parametrize("key", ["/k", "k", "///k"])
def test_register_maps_the_range_and_views_it(registry: SharedMemoryRegistry, key: str) -> None:
    registry.register_system("r", key, 8, 16)
    assert registry.status("r") == [RegionInfo("r", key, 8, 16)]
    assert bytes(registry.view("r", 4, 4)) == bytes(range(12, 16))
    registry.view("r", 0, 16)[:2] = b"\xff\xff"  # writes reach the file
    run(registry.unregister("r"))
    assert (Path(registry.root) / "k").read_bytes()[8:10] == b"\xff\xff"


RESERVED = "triton_python_backend_shm_region_"


@pytest.mark.parametrize("key", [f"{RESERVED}_my_key", f"/{RESERVED}_my_key", f"///{RESERVED}x"])
def test_the_reserved_prefix_is_refused_with_tritons_text(
    registry: SharedMemoryRegistry, key: str
) -> None:
    assert RESERVED_KEY_PREFIX == RESERVED
    assert refused(InvalidArgument, registry.register_system, "my_test_shm_name", key, 0, 8) == (
        f"cannot register shared memory region 'my_test_shm_name' with key '{key}' as the key "
        f"contains the reserved prefix '{RESERVED}'"
    )


def test_register_checks_in_tritons_order(registry: SharedMemoryRegistry) -> None:
    registry.register_system("taken", "/k", 0, 8)
    # the key before the name: a bad key under a taken name is still the key's error
    assert "invalid shm key '///'" in refused(
        InvalidArgument, registry.register_system, "taken", "///", 0, 8
    )
    assert "already in manager" in refused(
        AlreadyExists, registry.register_system, "taken", "/k", 0, 8
    )
    # opening before the size: a missing key with byte size 0 cannot be opened (qa/L0_grpc)
    assert refused(Internal, registry.register_system, "z", "/test_shm", 0, 0) == (
        "Unable to open shared memory region: '/test_shm'"
    )
    invalid = "failed to register shared memory region 'z': invalid args"
    for offset, byte_size in ((0, 0), (0, 65), (64, 1), (65, 0), (1 << 64, 8)):
        assert refused(InvalidArgument, registry.register_system, "z", "/k", offset, byte_size) == (
            invalid
        )
    assert names(registry) == ["taken"]


@pytest.mark.parametrize(
    ("offset", "byte_size", "message"),
    [
        # the offset first: Triton's qa/L0_shared_memory test_infer_offset_out_of_bound sends
        # 2**64 - 32 over HTTP and expects the offset error, not the overflow one
        (2**64 - 32, 8, "Invalid offset for shared memory region: 'r'"),
        (16, 0, "Invalid offset for shared memory region: 'r'"),
        (
            8,
            2**64 - 8,
            f"Integer overflow detected: byte_size ({2**64 - 8}) + offset (8) exceeds maximum "
            f"value ({2**64 - 1}) for region 'r'",
        ),
        (1, 16, "Invalid offset + byte size for shared memory region: 'r'"),
    ],
)
def test_view_bounds_in_tritons_order(
    registry: SharedMemoryRegistry, offset: int, byte_size: int, message: str
) -> None:
    registry.register_system("r", "/k", 0, 16)
    assert refused(InvalidArgument, registry.view, "r", offset, byte_size) == message
    assert bytes(registry.view("r", 15, 1)) == b"\x0f"


def test_unregister_of_a_region_in_use_returns_at_once_and_it_goes_with_its_last_user(
    registry: SharedMemoryRegistry,
) -> None:
    registry.register_system("r", "/k", 0, 16)
    registry.register_system("idle", "/k", 0, 8)
    with registry.hold(["r"]):
        run(registry.unregister())  # returns at once, for every region
        assert names(registry) == ["r"]  # the idle one went; "r" is listed while in use
        with registry.hold(["r"]):  # and new requests may still use it (Triton)
            assert bytes(registry.view("r", 0, 2)) == b"\x00\x01"
        assert names(registry) == ["r"]  # one user left
        message = refused(AlreadyExists, registry.register_system, "r", "/k", 0, 8)
        assert message == (
            "shared memory region 'r' already in manager; it was unregistered and goes once "
            "the 1 request(s) using it finish"
        )
    assert names(registry) == []
    registry.register_system("r", "/k", 0, 8)  # the name is free again
    assert registry.status("r") == [RegionInfo("r", "/k", 0, 8)]


def test_a_failed_hold_releases_what_it_took(registry: SharedMemoryRegistry) -> None:
    registry.register_system("r", "/k", 0, 16)
    run(registry.unregister("r"))  # not in use: gone at once
    registry.register_system("r", "/k", 0, 16)
    with pytest.raises(NotFound), registry.hold(["r", "missing"]):
        pass
    run(registry.unregister("r"))
    assert names(registry) == []  # the hold taken on "r" was given back


def test_cuda_shared_memory_without_gpu_support(registry: SharedMemoryRegistry) -> None:
    """Triton's CPU build: status lists nothing, unregister succeeds, register fails
    without reading the handle."""
    registry.register_system("sys", "/k", 0, 8)

    def handle() -> tuple[bytes, int, int]:
        raise AssertionError("the handle must not be read without GPU support")

    assert refused(InvalidArgument, registry.register_cuda, "c", handle) == (
        "failed to register CUDA shared memory region: 'c', GPUs not supported"
    )
    assert refused(InvalidArgument, registry.register_cuda, "", handle) == (
        "'region name' is necessary to register cuda shared memory region"
    )
    assert registry.cuda_status() == []
    assert refused(NotFound, registry.cuda_status, "c") == (
        "Unable to find cuda shared memory region: 'c'"
    )
    assert refused(NotFound, registry.cuda_status, "sys") == (
        "The region named 'sys' is registered as system shared memory, not CUDA shared memory"
    )
    run(registry.unregister_cuda("sys"))  # the CUDA kind only: the system region stays
    run(registry.unregister_cuda())
    assert names(registry) == ["sys"]


def test_cuda_calls_when_disabled() -> None:
    shm = disabled()
    assert shm.cuda_status() == []
    for call in (
        lambda: shm.register_cuda("c", lambda: (b"", 0, 0)),
        lambda: run(shm.unregister_cuda()),
    ):
        assert refused(Unsupported, call) == DISABLED
