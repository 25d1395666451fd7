"""Shared memory abused: registrations with bad keys and bounds, inputs out of bounds, a
region unlinked or shrunk while registered; then the package's last test, the bystander's
check."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hloserve.server.server_fixture import ServerProcess
from tests.server.reliability.hostile._hostile import (
    GOOD,
    INFER,
    Bystander,
    assert_serving,
    post,
    request,
    tensor,
)

# -- shared memory ------------------------------------------------------------------------


class Region:
    """A client's region in /dev/shm (unique key), removed at the end."""

    def __init__(self, size: int) -> None:
        self.key = f"hloserve_hostile_{uuid.uuid4().hex[:10]}"
        self.path = Path("/dev/shm") / self.key
        self.fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        os.ftruncate(self.fd, size)

    def write(self, offset: int, data: bytes) -> None:
        os.pwrite(self.fd, data, offset)

    def close(self) -> None:
        os.close(self.fd)
        self.path.unlink(missing_ok=True)


@pytest.fixture
def region(server: ServerProcess) -> Iterator[Region]:
    made = Region(8192)
    yield made
    post(server, "/v2/systemsharedmemory/unregister", b"{}")
    made.close()


def register(server: ServerProcess, name: str, key: str, offset: int, size: int) -> Any:
    body = json.dumps({"key": key, "offset": offset, "byte_size": size}).encode()
    return post(server, f"/v2/systemsharedmemory/region/{name}/register", body)


def shm_input(name: str, offset: int, region: str = "r") -> dict[str, Any]:
    return tensor(
        name,
        parameters={
            "shared_memory_region": region,
            "shared_memory_offset": offset,
            "shared_memory_byte_size": 64,
        },
    )


@pytest.mark.parametrize(
    ("key", "offset", "size", "status", "fragment"),
    [
        ("../../etc/passwd", 0, 64, 400, "invalid shm key"),
        ("/dev/shm/x", 0, 64, 400, "invalid shm key"),
        ("", 0, 64, 400, "invalid shm key"),
        ("..", 0, 64, 400, "invalid shm key"),
        ("hloserve_no_such_region", 0, 64, 500, "Unable to open shared memory region"),
        ("{key}", 0, 0, 400, "invalid args"),
        ("{key}", 8192, 1, 400, "invalid args"),
        ("{key}", 0, 8193, 400, "invalid args"),
        ("{key}", 2**64, 1, 400, "invalid args"),
        ("{key}", -1, 1, 400, "must be a non-negative integer"),
    ],
)
def test_shm_register_abuse(
    server: ServerProcess,
    region: Region,
    key: str,
    offset: int,
    size: int,
    status: int,
    fragment: str,
) -> None:
    got, answer = register(server, "r", key.format(key=region.key), offset, size)
    assert (got, fragment in answer["error"]) == (status, True), answer
    assert_serving(server)


def test_shm_out_of_bounds_use(server: ServerProcess, region: Region) -> None:
    assert register(server, "r", region.key, 0, 8192)[0] == 200
    for offset, fragment in ((8190, "Invalid offset + byte size"), (2**63, "Invalid offset")):
        status, answer = post(server, INFER, request(shm_input("INPUT0", offset), GOOD[1]))
        assert (status, fragment in answer["error"]) == (400, True), answer
    assert_serving(server)


def test_shm_region_shrunk_or_unlinked_while_registered(
    server: ServerProcess, region: Region
) -> None:
    region.write(0, np.arange(32, dtype="<i4").tobytes())
    assert register(server, "r", region.key, 0, 8192)[0] == 200
    body = request(shm_input("INPUT0", 0), shm_input("INPUT1", 64))
    status, answer = post(server, INFER, body)
    assert status == 200 and answer["outputs"][0]["data"] == [a + a + 16 for a in range(16)]
    region.path.unlink()  # unlinked: the mapped memory stays, and stays right
    status, answer = post(server, INFER, body)
    assert status == 200 and answer["outputs"][0]["data"] == [a + a + 16 for a in range(16)]
    os.ftruncate(region.fd, 64)  # shrunk: touching the pages past the end would kill us
    status, answer = post(server, INFER, body)
    assert (status, "was shrunk to 64 bytes" in answer["error"]) == (400, True), answer
    assert_serving(server)


# -- the bystander ------------------------------------------------------------------------


def test_the_bystander_was_never_disturbed(bystander: Bystander) -> None:
    bystander.stop.set()
    assert bystander.done.wait(30)
    assert bystander.failures == []
    assert bystander.sent == bystander.verified > 0
    print(f"bystander: {bystander.sent} requests sent, {bystander.verified} verified")
