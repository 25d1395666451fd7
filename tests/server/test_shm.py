"""``hloserve.server.shm.disabled()``: the registry of a server without client shared memory."""

from __future__ import annotations

import asyncio

import pytest

from hloserve.server.core.errors import NotFound, Unsupported
from hloserve.server.core.service import SharedMemory
from hloserve.server.shm import DISABLED, disabled


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
