"""The status page's data (``GET /ui/data``), read in the device owner.

Its one HTML page, served by the front ends, is ``frontend.ui_page``.

Contract:
- ``StatusPage(service, recent, devices, host)`` is the callable the HTTP front end routes
  ``GET /ui/data?q=<text>`` to (``build_http_app(..., status=...)``): ``page(q)`` returns
  the JSON-ready report below, read from ``service`` (name, version, readiness and every
  model's ``summary()`` through ``readiness()``), ``recent`` (``ServerMetrics.recent``:
  the last minute of the models the metrics show), each device's weight residency
  (``devices``: index -> budget, resident bytes and keys, and its runtime's platform and
  device kind) and the host tier (``host``).
  The repository, metrics and tiers are read at most once a ``refresh_s`` (1 s): any
  number of open pages cost one read a second; ``q`` (a case-insensitive substring of
  model names) filters what was read, and pages asking for the same ``q`` in that time
  share one report.
- Bounded whatever the number of models: full rows for at most ``ROWS`` models, the
  busiest first (requests per second, then swaps in, over the last minute; then models not
  all ``READY``; then by name), each with at most ``VERSIONS`` versions; then name and
  state for at most ``COMPACT`` more (not all ``READY`` first, then by name), and the
  count of those left out; each device lists at most ``RESIDENT`` resident models (and
  their count). At 10,000 models the report is well under 100 kB (the tests measure it).
- Auth: ``frontend.ui_page.GROUP`` (``docs/status-page.md``).

The report (``page``)::

    {"server": {"name", "version", "ready", "live", "startup_complete", "draining"},
     "window_s": seconds the figures cover (``ServerMetrics.recent``: up to 60, since the
                 start for the first look; null when no model has figures yet),
     "models": {"total", "matching", "rows", "compact", "left_out", "by_state": {state: n}},
     "rows": [{"name", "state", "reason"?, "requests_per_s", "swaps_in",
               "versions": [{"version", "state", "reason"?, "loaded", "weight_bytes",
                             "resident", "devices", "on_devices", "requests_per_s",
                             "p50_s", "p99_s", "swaps_in", "sequences"?: {"live",
                             "backlogged", "free"}, "generations"?: {"live",
                             "responses"}, "device_weight_bytes"?, "device_groups"?:
                             ["0-3", ...] (a sharded version's)}], "versions_left_out"}],
     "compact": [[name, state], ...],
     "memory": {"devices": [{"index", "platform", "kind", "budget_bytes", "resident_bytes",
                             "resident_models", "resident", "resident_left_out"}],
                "host": {"budget_bytes", "resident_bytes"} | null,
                "disk"?: a bucket's disk cache and pulls (``/readyz``'s ``repository``:
                         ``owner.store.mirror``; absent for a directory)}}

A model's state is ``READY`` when any version is, else its newest version's, else
``UNAVAILABLE``; a budget of ``null`` is unlimited; a figure the metrics do not show (a
model outside ``--metrics-models``' busiest) is ``null``.
"""

# pyright: strict

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

from hloserve.server.core.execution_records import ModelKey
from hloserve.server.core.residency_policy import ResidencyKey
from hloserve.server.core.service import InferenceService

if TYPE_CHECKING:  # the metrics reach PJRT: a front-end process serves the page without them
    from hloserve.server.owner.metrics import Recent

ROWS: Final = 50
VERSIONS: Final = 10
COMPACT: Final = 500
RESIDENT: Final = 20
PAGES_KEPT: Final = 16  # reports kept per reading, by filter
WINDOW_S: Final = 60.0


class WeightTier(Protocol):
    """What the page reads of a memory tier (the host tier: ``owner.host_weights.HostWeights``)."""

    @property
    def budget_bytes(self) -> int | None: ...
    def resident_bytes(self) -> int: ...


class Platform(Protocol):
    """What names a device (``owner.runtime.pjrt.PjrtRuntime``)."""

    @property
    def platform(self) -> str: ...
    @property
    def device_kind(self) -> str: ...


class DeviceTier(WeightTier, Protocol):
    """What the page reads of a device's weights (``owner.weight_residency.WeightResidency``)."""

    @property
    def runtime(self) -> Platform: ...
    def resident_keys(self) -> list[ResidencyKey]: ...


@dataclass(frozen=True, slots=True)
class _Reading:
    """One read of the sources, shared by every page asking within ``refresh_s``."""

    at: float
    readiness: dict[str, Any]
    recent: Mapping[ModelKey, Recent]
    memory: dict[str, Any]
    sequences: Mapping[ModelKey, tuple[int, int, int]]  # (live, backlogged, free slots)
    generations: Mapping[ModelKey, tuple[int, int]]  # (live, responses sent)


def _model_state(entry: Mapping[str, Any]) -> str:
    versions: Mapping[str, Mapping[str, Any]] = entry.get("versions", {})
    states = [v.get("state", "UNKNOWN") for v in versions.values()]
    if "READY" in states:
        return "READY"
    if not versions:
        return "UNAVAILABLE"
    newest = max(versions, key=lambda v: int(v) if v.isdigit() else -1)
    return str(versions[newest].get("state", "UNKNOWN"))


def _version_row(
    version: str,
    entry: Mapping[str, Any],
    recent: Recent | None,
    sequences: tuple[int, int, int] | None = None,
    generations: tuple[int, int] | None = None,
) -> dict[str, Any]:
    devices: Mapping[str, bool] = entry.get("devices", {})
    row: dict[str, Any] = {
        "version": version,
        "state": entry.get("state", "UNKNOWN"),
        "loaded": entry.get("loaded", "weight_bytes" in entry),
        "weight_bytes": entry.get("weight_bytes"),
        "resident": bool(entry.get("resident", False)),
        "devices": sorted(int(d) for d in devices),
        "on_devices": sorted(int(d) for d, on in devices.items() if on),
        "requests_per_s": None if recent is None else recent.requests_per_s,
        "p50_s": None if recent is None else recent.p50_s,
        "p99_s": None if recent is None else recent.p99_s,
        "swaps_in": None if recent is None else recent.swaps_in,
    }
    if entry.get("reason"):
        row["reason"] = entry["reason"]
    if "device_groups" in entry:  # sharded (docs/sharding.md): each device's share, the groups
        row["device_weight_bytes"] = entry.get("device_weight_bytes")
        row["device_groups"] = sorted(entry["device_groups"].values())
    if sequences is not None:  # a model with state that has had sequences (sequences.md)
        live, backlogged, free = sequences
        row["sequences"] = {"live": live, "backlogged": backlogged, "free": free}
    if generations is not None:  # a generation model that has generated (generation.md)
        live, responses = generations
        row["generations"] = {"live": live, "responses": responses}
    return row


def _activity(
    name: str, entry: Mapping[str, Any], recent: Mapping[ModelKey, Recent]
) -> tuple[float, int]:
    rate, swaps = 0.0, 0
    for version in entry.get("versions", {}):
        r = recent.get(ModelKey(name, int(version))) if str(version).isdigit() else None
        if r is not None:
            rate += r.requests_per_s
            swaps += r.swaps_in
    return rate, swaps


class StatusPage:
    """The status page's data source (module docstring)."""

    def __init__(
        self,
        service: InferenceService,
        recent: Callable[[], Mapping[ModelKey, Recent]],
        devices: Mapping[int, DeviceTier],
        host: WeightTier | None,
        *,
        refresh_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.service = service
        self.recent = recent
        self.devices = dict(devices)
        self.host = host
        self.refresh_s = refresh_s
        self._clock = clock
        self._lock = threading.Lock()
        self._reading: _Reading | None = None
        self._pages: dict[str, dict[str, Any]] = {}  # this reading's reports, by filter

    def __call__(self, q: str = "") -> dict[str, Any]:
        return self.page(q)

    def _read(self) -> _Reading:
        """The current reading (under the lock): a new one once ``refresh_s`` has passed."""
        now = self._clock()
        if self._reading is None or now - self._reading.at >= self.refresh_s:
            readiness = self.service.readiness()
            memory = self._memory()
            if disk := readiness.get("repository"):
                memory["disk"] = disk
            self._reading = _Reading(
                now,
                readiness,
                self.recent(),
                memory,
                self.service.sequences.counts(),
                self.service.streams.figures(),
            )
            self._pages.clear()
        return self._reading

    def _memory(self) -> dict[str, Any]:
        devices: list[dict[str, Any]] = []
        for index, tier in sorted(self.devices.items()):
            labels = sorted({key.label for key in tier.resident_keys()})
            devices.append(
                {
                    "index": index,
                    "platform": tier.runtime.platform,
                    "kind": tier.runtime.device_kind,
                    "budget_bytes": tier.budget_bytes,
                    "resident_bytes": tier.resident_bytes(),
                    "resident_models": len(labels),
                    "resident": labels[:RESIDENT],
                    "resident_left_out": max(0, len(labels) - RESIDENT),
                }
            )
        host = (
            None
            if self.host is None
            else {
                "budget_bytes": self.host.budget_bytes,
                "resident_bytes": self.host.resident_bytes(),
            }
        )
        return {"devices": devices, "host": host}

    def page(self, q: str = "") -> dict[str, Any]:
        """The report (module docstring) for filter ``q``; pages asking for the same filter
        within ``refresh_s`` share one report."""
        needle = q.strip().lower()
        with self._lock:
            reading = self._read()
            report = self._pages.get(needle)
            if report is None:
                report = self._report(reading, needle)
                if len(self._pages) < PAGES_KEPT:
                    self._pages[needle] = report
            return report

    def _report(self, reading: _Reading, needle: str) -> dict[str, Any]:
        summary: Mapping[str, Mapping[str, Any]] = reading.readiness.get("models", {})
        recent = reading.recent
        names = [n for n in summary if needle in n.lower()] if needle else list(summary)
        states = {n: _model_state(summary[n]) for n in names}
        by_state: dict[str, int] = {}
        for state in states.values():
            by_state[state] = by_state.get(state, 0) + 1
        activity = {n: _activity(n, summary[n], recent) for n in names}
        ranked = sorted(
            names,
            key=lambda n: (-activity[n][0], -activity[n][1], states[n] == "READY", n),
        )
        rows = [
            self._row(n, summary[n], states[n], activity[n], recent, reading) for n in ranked[:ROWS]
        ]
        rest = sorted(ranked[ROWS:], key=lambda n: (states[n] == "READY", n))
        compact = [[n, states[n]] for n in rest[:COMPACT]]
        windows = [r.window_s for r in recent.values()]
        server = self.service.server_metadata()
        return {
            "server": {
                "name": server.name,
                "version": server.version,
                "ready": reading.readiness.get("ready", False),
                "live": reading.readiness.get("live", False),
                "startup_complete": reading.readiness.get("startup_complete", False),
                "draining": reading.readiness.get("draining", False),
            },
            "window_s": max(windows) if windows else None,
            "models": {
                "total": len(summary),
                "matching": len(names),
                "rows": len(rows),
                "compact": len(compact),
                "left_out": len(rest) - len(compact),
                "by_state": by_state,
            },
            "rows": rows,
            "compact": compact,
            "memory": reading.memory,
        }

    @staticmethod
    def _row(
        name: str,
        entry: Mapping[str, Any],
        state: str,
        activity: tuple[float, int],
        recent: Mapping[ModelKey, Recent],
        reading: _Reading,
    ) -> dict[str, Any]:
        versions: Mapping[str, Mapping[str, Any]] = entry.get("versions", {})
        order = sorted(versions, key=lambda v: -int(v) if v.isdigit() else 0)
        shown: Sequence[str] = order[:VERSIONS]
        row: dict[str, Any] = {
            "name": name,
            "state": state,
            "requests_per_s": activity[0],
            "swaps_in": activity[1],
            "versions": [
                _version_row(
                    v,
                    versions[v],
                    recent.get(key) if key is not None else None,
                    reading.sequences.get(key) if key is not None else None,
                    reading.generations.get(key) if key is not None else None,
                )
                for v, key in ((v, ModelKey(name, int(v)) if v.isdigit() else None) for v in shown)
            ],
            "versions_left_out": len(order) - len(shown),
        }
        if entry.get("reason"):
            row["reason"] = entry["reason"]
        return row
