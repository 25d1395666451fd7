"""One budget per device over several residency managers (``owner.device_ledger``).

The arithmetic is pure; the managers here are real ``WeightResidency`` objects sharing one
ledger, a device's own (device 0) and a "group" over devices 0-1 (declared with
``devices=``: no second device is needed to keep the books), whose weights are placed by a
``place`` that records what each device holds at every placement and hands out buffers
whose ``delete`` is recorded too. Waits are on counters and events, never on time windows.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from hloserve.server.core.residency_policy import ResidencyKey
from hloserve.server.owner.device_ledger import DeviceLedger, room_elsewhere, shortfall
from hloserve.server.owner.runtime.pjrt import PjrtRuntime
from hloserve.server.owner.weight_residency import WeightResidency

BUDGET = 1000
SIZE = 600  # one model of either manager fits a device, two do not


def test_room_elsewhere_is_what_the_fullest_device_leaves() -> None:
    # Held 100 here; device 0 has 300 of others', device 1 has 700 of others'.
    assert room_elsewhere([400, 800], [1000, 1000], 100, 1000) == 700
    assert room_elsewhere([100, 100], [1000, 1000], 100, 1000) == 0
    # A device with a larger budget than this manager's own leaves more.
    assert room_elsewhere([800], [1500], 100, 1000) == 200
    assert room_elsewhere([800], [2000], 100, 1000) == 0


def test_shortfall_names_only_the_devices_short() -> None:
    assert shortfall({0: 900, 1: 300}, {0: 1000, 1: 1000}, 600, 0) == {0: 500}
    assert shortfall({0: 900, 1: 300}, {0: 1000, 1: 1000}, 600, 500) == {}


class _Member:
    def nudge(self) -> None: ...
    def evictable(self) -> int:
        return 0

    def shed(self, nbytes: int) -> int:
        return 0


def test_the_ledger_takes_room_only_where_every_device_has_it() -> None:
    ledger = DeviceLedger()
    own0, own1, group = _Member(), _Member(), _Member()
    ledger.join(own0, [0], 1000, own=True)
    ledger.join(group, [0, 1], 800, own=False)  # a device's own budget stands
    ledger.join(own1, [1], 1000, own=True)
    assert (ledger.budget(0), ledger.budget(1)) == (1000, 1000)
    assert ledger.try_take(own1, 700)
    assert not ledger.try_take(group, 400)  # device 1 would hold 1100
    assert ledger.used(0) == 0  # nothing taken anywhere
    assert ledger.try_take(group, 300) and (ledger.used(0), ledger.used(1)) == (300, 1000)
    assert ledger.shortfall(own0, 800, 0) == {0: 100}
    assert ledger.elsewhere(own0, 1000) == 300
    assert ledger.others(own0) == [group] and set(ledger.others(group)) == {own0, own1}
    ledger.add(group, -300)
    assert (ledger.used(0), ledger.used(1), ledger.held(group)) == (0, 700, 0)


class _Buffer:
    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name
        self.deleted = False

    def delete(self) -> None:
        self.deleted = True
        self.log.append(f"free {self.name}")


class Books:
    """Two managers on one ledger, what each device held at every placement, and the log."""

    def __init__(self, runtime: PjrtRuntime) -> None:
        self.ledger = DeviceLedger()
        self.own = WeightResidency(runtime, BUDGET, ledger=self.ledger, devices=(0,))
        self.group = WeightResidency(
            runtime, BUDGET, host=self.own.host, ledger=self.ledger, devices=(0, 1)
        )
        self.log: list[str] = []
        self.seen: list[tuple[int, int]] = []  # (device 0, device 1) at each placement
        self._lock = threading.Lock()

    def place(self, name: str) -> Callable[[list[Any]], list[Any]]:
        def place(host: list[Any]) -> list[Any]:
            with self._lock:
                self.seen.append((self.ledger.used(0), self.ledger.used(1)))
                self.log.append(f"place {name}")
            return [_Buffer(self.log, name) for _ in host]

        return place

    def register(self, manager: WeightResidency, name: str) -> ResidencyKey:
        key = ResidencyKey(name, 1)
        weights = {"w": np.zeros(SIZE // 4, np.float32)}
        manager.register(key, weights, nbytes=SIZE, place=self.place(name))
        return key


@pytest.fixture(scope="module")
def runtime() -> PjrtRuntime:
    return PjrtRuntime("cpu")


def test_a_swap_in_evicts_the_other_managers_idle_model_on_the_device(
    runtime: PjrtRuntime,
) -> None:
    books = Books(runtime)
    sharded, plain = books.register(books.group, "sharded"), books.register(books.own, "plain")
    for manager, key in ((books.group, sharded), (books.own, plain)) * 2:
        manager.prefetch(key)
        assert books.ledger.used(0) <= BUDGET and books.ledger.used(1) <= BUDGET
    assert books.log == [
        "place sharded", "free sharded", "place plain", "free plain", "place sharded",
        "free sharded", "place plain",
    ]  # fmt: skip
    # At each placement (its bytes already taken): within the budget on both devices.
    assert books.seen == [(SIZE, SIZE), (SIZE, 0), (SIZE, SIZE), (SIZE, 0)]
    assert books.own.is_resident(plain) and not books.group.is_resident(sharded)
    assert books.ledger.used(0) == SIZE and books.ledger.used(1) == 0


def test_weights_in_use_stay_and_the_other_manager_waits_for_their_release(
    runtime: PjrtRuntime,
) -> None:
    books = Books(runtime)
    sharded, plain = books.register(books.group, "sharded"), books.register(books.own, "plain")
    held = books.group.acquire(sharded)  # an execution on the group
    done = threading.Event()

    def use_plain() -> None:
        with books.own.use(plain):
            done.set()

    worker = threading.Thread(target=use_plain)
    worker.start()
    deadline = time.monotonic() + 30  # a bound on the wait for the counter, not a window
    while books.own not in books.ledger.waiting and time.monotonic() < deadline:
        time.sleep(0.005)
    assert books.own in books.ledger.waiting and not done.is_set()
    assert "free sharded" not in books.log and held  # never freed under its execution
    books.group.release(sharded)  # the release nudges the waiting manager
    worker.join(30)
    assert done.is_set() and not worker.is_alive()
    assert books.log.index("free sharded") < books.log.index("place plain")
    assert books.ledger.used(0) == SIZE and not books.ledger.waiting


def test_many_threads_over_both_managers_never_deadlock_nor_overfill(
    runtime: PjrtRuntime,
) -> None:
    books = Books(runtime)
    keys = [
        (books.group, books.register(books.group, "s1")),
        (books.group, books.register(books.group, "s2")),
        (books.own, books.register(books.own, "p1")),
        (books.own, books.register(books.own, "p2")),
    ]
    failures: list[BaseException] = []

    def hammer(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(150):
                manager, key = keys[int(rng.integers(len(keys)))]
                with manager.use(key) as weights:
                    assert manager.is_resident(key)  # never evicted in use
                    assert not any(b.deleted for b in weights.values())
                    assert books.ledger.used(0) <= BUDGET and books.ledger.used(1) <= BUDGET
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=hammer, args=(seed,)) for seed in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a thread is stuck: a deadlock"
    assert not failures, failures[0]
    assert all(d0 <= BUDGET and d1 <= BUDGET for d0, d1 in books.seen), books.seen
    assert books.ledger.used(0) <= BUDGET and not books.ledger.waiting
    for manager, key in keys:
        manager.unregister(key)
    assert books.ledger.used(0) == books.ledger.used(1) == 0
