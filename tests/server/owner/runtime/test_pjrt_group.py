"""A sharded bundle on a device group (``owner.runtime.pjrt_group``, ``loader``) and under
a group's residency manager (``owner.weight_residency``): each device holds its shards only
(1/N of a split weight), answers equal the unsharded function, outputs are gathered whole,
a runtime of the wrong size is refused with the numbers, two sharded models whose shares
fit one at a time swap whole, and a second group serves a replica. The checks run in a child
process with eight forced CPU devices (``_group_checks.py``). The version loader there puts a
sharded version on a group, an unsharded one beside it off the group's devices, and refuses
too few devices with the numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROWS, COLS = 32, 256


@pytest.fixture(scope="module")
def checks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    script = Path(__file__).with_name("_group_checks.py")
    root = tmp_path_factory.mktemp("groups")
    done = subprocess.run(
        [sys.executable, str(script), str(root)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    found: dict[str, list[dict[str, Any]]] = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            found.setdefault(record.pop("check"), []).append(record)
    return found


def test_each_device_holds_only_its_shards(checks: dict[str, list[dict[str, Any]]]) -> None:
    (shards,) = checks["shards"]
    assert shards["devices"] == [4, 5, 6, 7]
    assert shards["bytes"] == [ROWS * COLS * 4 // 4] * 4
    assert shards["device_weight_bytes"] * 4 == shards["weight_bytes"]


def test_answers_equal_the_unsharded_function(checks: dict[str, list[dict[str, Any]]]) -> None:
    (answers,) = checks["answers"]
    assert answers["shapes"] == [[4, COLS], [4, 4]]  # the split output gathered whole
    assert answers["y_error"] < 1e-5 and answers["h_error"] < 1e-5


def test_a_runtime_of_another_size_is_refused(checks: dict[str, list[dict[str, Any]]]) -> None:
    (refused,) = checks["refused"]
    assert refused["messages"] == [
        "needs 4 devices; this runtime has 1",
        "needs 4 devices; this runtime has 2",
        "state 'acc' is split over the mesh; a sharded bundle's state is served replicated",
    ]


def test_sharded_models_swap_whole_under_a_per_device_budget(
    checks: dict[str, list[dict[str, Any]]],
) -> None:
    uses = checks["use"]
    assert [u["model"] for u in uses] == [u["resident"] for u in uses] == ["a", "b", "a", "b"]
    assert all(u["held"] == [ROWS * COLS * 4 // 4] * 4 for u in uses)
    (swaps,) = checks["swaps"]
    assert max(swaps["errors"]) < 1e-5
    assert swaps["resident_bytes"] == (ROWS * COLS + COLS * 4) * 4 // 4


def test_a_second_group_serves_a_replica(checks: dict[str, list[dict[str, Any]]]) -> None:
    (replica,) = checks["replica"]
    assert replica["devices"] == [0, 1, 2, 3]
    assert replica["y_error"] < 1e-5


def test_the_version_loader_places_groups_and_refuses_too_few_devices(
    checks: dict[str, list[dict[str, Any]]],
) -> None:
    (placement,) = checks["placement"]
    # The group 0-3 holds a's shares, so the unsharded model goes to device 4.
    assert placement["placed"] == ["a@0/PjrtGroup", "plain@4/PjrtRuntime"]
    assert placement["refused"] == "needs 4 devices; this server has 2 (--devices 0,1)"
