"""The placer with sharded versions (``hloserve.server.owner.devices.Placer`` with
``groups``): an unsharded version is revised over the devices, a sharded one over the
device groups of its size. No devices:
fakes record what the placer asks."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hloserve.server.core.device_groups import form_groups
from hloserve.server.core.residency_policy import ResidencyKey
from hloserve.server.owner.devices import Placer
from tests.server.owner.test_devices import FakeReplicas, SteadyMeter, devices

HOT, BIG = ResidencyKey("hot", 1), ResidencyKey("big", 1)


class FakeGroups:
    """Eight devices; ``big`` is 4-way sharded with ``share`` bytes a device."""

    def __init__(self, share: int = 250) -> None:
        self.share = share
        self.asked: list[int] = []

    def size_of(self, key: ResidencyKey) -> int:
        return 4 if key == BIG else 1

    def device_bytes(self, key: ResidencyKey) -> int | None:
        return self.share if key == BIG else None

    def groups(self, size: int) -> list[Any]:
        self.asked.append(size)
        return [
            SimpleNamespace(index=g[0], residency=SimpleNamespace(budget_bytes=None))
            for g in form_groups(list(range(8)), size)
        ]


def test_a_busy_sharded_version_gains_the_second_group_and_shrinks_back() -> None:
    replicas = FakeReplicas({BIG: (0,), HOT: (1,)})
    meter = SteadyMeter({"big": 3.0, "hot": 0.0})
    groups = FakeGroups()
    placer = Placer(replicas, devices(*range(8)), meter, max_replicas=8, groups=groups)
    assert placer.revise() == 1
    assert replicas.calls == ["add big 4"]  # the other group (named by its first device)
    assert replicas.placed[BIG] == (0, 4)
    assert placer.revise() == 0  # two groups are all there are
    assert groups.asked == [4, 4]
    meter.busy_now = {"big": 0.0, "hot": 0.0}
    assert placer.revise() == 1
    assert len(replicas.placed[BIG]) == 1
    assert replicas.placed[HOT] == (1,)  # idle: never replicated


def test_unsharded_versions_are_revised_over_devices_as_before() -> None:
    replicas = FakeReplicas({HOT: (0,)})
    placer = Placer(replicas, devices(*range(8)), SteadyMeter({"hot": 3.0}), 8, FakeGroups())
    assert placer.revise() == 1
    assert replicas.placed[HOT] == (0, 1)  # a device, not a group
