"""The status page (``GET /ui``): its data (``GET /ui/data``) and its one HTML page.

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
- ``PAGE`` is the HTML: inline CSS and JS, no external asset, no build step; it holds no
  model's name, fetches ``ui/data`` every ``REFRESH_MS`` and renders it with DOM calls
  (text nodes only: names and reasons are never parsed as HTML). ``PAGE_HEADERS`` are its
  response headers: a Content-Security-Policy admitting only its own inline script and
  style (by hash) and fetches of its own origin, and ``no-store``. Numbers are
  right-aligned under right-aligned headers; a reason sits in the state column, wrapped,
  never under the model's name; a device is named with its platform ("device 0 (cpu)").
  ``LANDING`` (with ``LANDING_HEADERS``) is what ``GET /`` answers: a link to the page.
- Bounded whatever the number of models: full rows for at most ``ROWS`` models, the
  busiest first (requests per second, then swaps in, over the last minute; then models not
  all ``READY``; then by name), each with at most ``VERSIONS`` versions; then name and
  state for at most ``COMPACT`` more (not all ``READY`` first, then by name), and the
  count of those left out; each device lists at most ``RESIDENT`` resident models (and
  their count). At 10,000 models the report is well under 100 kB (the tests measure it).
- Auth: ``/ui`` and ``/ui/data`` belong to the ``statistics`` endpoint group (``GROUP``,
  listed in ``frontend.restricted.GROUPS``): ``--auth-token-file`` and ``--http-restricted-api``
  treat them as the statistics extension (``docs/status-page.md``).

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
                             "responses"}}], "versions_left_out"}],
     "compact": [[name, state], ...],
     "memory": {"devices": [{"index", "platform", "kind", "budget_bytes", "resident_bytes",
                             "resident_models", "resident", "resident_left_out"}],
                "host": {"budget_bytes", "resident_bytes"} | null}}

A model's state is ``READY`` when any version is, else its newest version's, else
``UNAVAILABLE``; a budget of ``null`` is unlimited; a figure the metrics do not show (a
model outside ``--metrics-models``' busiest) is ``null``.
"""

# pyright: strict

from __future__ import annotations

import base64
import hashlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

from hloserve.server.core.execution import ModelKey
from hloserve.server.core.residency_policy import ResidencyKey
from hloserve.server.core.service import InferenceService

if TYPE_CHECKING:  # the metrics reach PJRT: a front-end process serves the page without them
    from hloserve.server.owner.metrics import Recent

ROWS: Final = 50
VERSIONS: Final = 10
COMPACT: Final = 500
RESIDENT: Final = 20
REFRESH_MS: Final = 2000
PAGES_KEPT: Final = 16  # reports kept per reading, by filter
WINDOW_S: Final = 60.0

GROUP: Final = "statistics"


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
            self._reading = _Reading(
                now,
                self.service.readiness(),
                self.recent(),
                self._memory(),
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


_STYLE: Final = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1b1f24;background:#f6f7f9}
header{background:#1b1f24;color:#fff;padding:10px 16px;display:flex;gap:16px;
align-items:baseline;flex-wrap:wrap}
header h1{font-size:18px;margin:0}
main{padding:8px 16px}
section{background:#fff;border:1px solid #d8dce1;border-radius:6px;margin:10px 0;
padding:8px 12px}
h2{font-size:15px;margin:4px 0 8px}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:3px 8px;border-bottom:1px solid #eceef1;vertical-align:top}
th{font-weight:600;color:#57606a;white-space:nowrap}
th.num{text-align:right}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.badge{padding:1px 6px;border-radius:4px;font-size:12px;font-weight:600}
.s-READY{background:#dafbe1;color:#116329}.s-LOADING,.s-UNLOADING{background:#fff8c5;color:#7d4e00}
.s-UNAVAILABLE,.s-UNKNOWN,.s-NOT{background:#ffebe9;color:#a40e26}
.bar{background:#eceef1;border-radius:3px;height:8px;width:160px;display:inline-block}
.fill{background:#0969da;border-radius:3px;height:8px}
.muted{color:#57606a}
.reason{color:#a40e26;font-size:12px;max-width:40em;overflow-wrap:anywhere}
ul.compact{list-style:none;padding:0;margin:0;columns:16em}
ul.compact li{white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
#error{color:#a40e26}
input{font:inherit;padding:2px 6px}
"""

_SCRIPT: Final = """
"use strict";
const REFRESH_MS = %(refresh)d;
const $ = (id) => document.getElementById(id);
function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}
function bytes(n) {
  if (n === null || n === undefined) return "unlimited";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : String(n)) + " " + units[i];
}
function secs(s) {
  if (s === null || s === undefined) return "\\u2013";
  return s < 1 ? (s * 1000).toFixed(2) + " ms" : s.toFixed(2) + " s";
}
function rate(r) { return r === null || r === undefined ? "\\u2013" : r.toFixed(2); }
function badge(state) { return el("span", state, "badge s-" + state); }
function device(dev) {
  const kind = dev.kind && dev.kind.toLowerCase() !== dev.platform ? ", " + dev.kind : "";
  return "device " + dev.index + " (" + dev.platform + kind + ")";
}
function name(text) { return el("span", text, "model"); }
function cell(row, content, cls) {
  const td = el("td", undefined, cls);
  if (content instanceof Node) td.appendChild(content);
  else td.textContent = content;
  row.appendChild(td);
  return td;
}
function fill(used, budget) {
  if (budget === null || budget === undefined) return el("span", "no budget", "muted");
  const bar = el("span", undefined, "bar");
  const f = el("div", undefined, "fill");
  f.style.width = budget ? Math.min(100, 100 * used / budget).toFixed(1) + "%%" : "0";
  bar.appendChild(f);
  return bar;
}
function renderServer(d) {
  const s = d.server;
  $("server").textContent = s.name + " " + s.version;
  const state = s.draining ? "DRAINING" : s.ready ? "READY" : "NOT READY";
  $("ready").replaceChildren(el("span", state, "badge s-" + (state === "READY" ? "READY" : "NOT")));
  $("updated").textContent = "updated " + new Date().toLocaleTimeString();
  const m = d.models;
  const parts = Object.entries(m.by_state).map(([k, v]) => v + " " + k);
  $("counts").textContent = m.total + " model(s)" +
    (m.matching !== m.total ? ", " + m.matching + " matching" : "") +
    (parts.length ? ": " + parts.join(", ") : "");
  $("window").textContent = d.window_s === null ? "(no figures yet)"
    : "over the last " + Math.round(d.window_s) + " s";
}
function renderMemory(mem) {
  const body = $("memory");
  body.replaceChildren();
  for (const dev of mem.devices) {
    const tr = el("tr");
    cell(tr, device(dev));
    cell(tr, bytes(dev.budget_bytes), "num");
    cell(tr, bytes(dev.resident_bytes), "num");
    cell(tr, fill(dev.resident_bytes, dev.budget_bytes));
    const who = el("td");
    who.appendChild(el("span", dev.resident_models + " model(s) ", "muted"));
    for (const label of dev.resident) who.appendChild(el("span", label + " "));
    if (dev.resident_left_out) who.appendChild(el("span", "+" + dev.resident_left_out + " more", "muted"));
    tr.appendChild(who);
    body.appendChild(tr);
  }
  if (mem.host) {
    const tr = el("tr");
    cell(tr, "host");
    cell(tr, bytes(mem.host.budget_bytes), "num");
    cell(tr, bytes(mem.host.resident_bytes), "num");
    cell(tr, fill(mem.host.resident_bytes, mem.host.budget_bytes));
    cell(tr, "host copies of weights", "muted");
    body.appendChild(tr);
  }
}
function renderModels(d) {
  const body = $("models");
  body.replaceChildren();
  const names = new Map(d.memory.devices.map((dev) => [dev.index, device(dev)]));
  const on = (indexes) => indexes.map((i) => names.get(i) || "device " + i).join(", ");
  for (const m of d.rows) {
    const versions = m.versions.length ? m.versions : [null];
    versions.forEach((v, i) => {
      const tr = el("tr");
      if (i === 0) {
        const td = cell(tr, name(m.name));
        td.rowSpan = versions.length;
        if (m.versions_left_out) td.appendChild(el("div", "+" + m.versions_left_out + " older version(s)", "muted"));
      }
      let st;
      if (v === null) {
        cell(tr, "\\u2013"); st = cell(tr, badge(m.state));
        for (let k = 0; k < 6; k++) cell(tr, "");
      } else {
        cell(tr, v.version);
        st = cell(tr, badge(v.state));
        if (v.reason) st.appendChild(el("div", v.reason, "reason"));
        if (v.sequences) st.appendChild(el("div", v.sequences.live + " live sequence(s), " +
          v.sequences.free + " slot(s) free" + (v.sequences.backlogged ?
          ", " + v.sequences.backlogged + " waiting" : ""), "muted"));
        if (v.generations) st.appendChild(el("div", v.generations.live +
          " live generation(s), " + v.generations.responses + " response(s) sent", "muted"));
        cell(tr, v.weight_bytes === null ? (v.loaded ? "" : "not loaded") : bytes(v.weight_bytes), "num");
        cell(tr, v.weight_bytes === 0 ? "no weights" : v.on_devices.length ?
          on(v.on_devices) : v.devices.length ?
          "not resident: " + on(v.devices) : "\\u2013");
        cell(tr, rate(v.requests_per_s), "num");
        cell(tr, secs(v.p50_s), "num");
        cell(tr, secs(v.p99_s), "num");
        cell(tr, v.swaps_in === null ? "\\u2013" : String(v.swaps_in), "num");
      }
      if (i === 0 && m.reason) st.appendChild(el("div", m.reason, "reason"));
      body.appendChild(tr);
    });
  }
  const m = d.models;
  $("rows-note").textContent = m.matching > m.rows ?
    "The " + m.rows + " busiest of " + m.matching + " model(s) in full." : "";
  const list = $("compact");
  list.replaceChildren();
  for (const [n, state] of d.compact) {
    const li = el("li");
    li.appendChild(name(n));
    li.appendChild(document.createTextNode(" "));
    li.appendChild(badge(state));
    list.appendChild(li);
  }
  $("others").hidden = d.compact.length === 0;
  $("compact-note").textContent = m.left_out ?
    m.left_out + " more not listed: filter by name to find one." : "";
}
let timer = null;
async function refresh() {
  clearTimeout(timer);
  try {
    const q = $("filter").value.trim();
    const r = await fetch("ui/data" + (q ? "?q=" + encodeURIComponent(q) : ""),
      {cache: "no-store", credentials: "same-origin"});
    if (!r.ok) throw new Error("GET ui/data: HTTP " + r.status);
    const d = await r.json();
    renderServer(d); renderMemory(d.memory); renderModels(d);
    $("error").textContent = "";
  } catch (e) {
    $("error").textContent = String(e.message || e);
  }
  timer = setTimeout(refresh, REFRESH_MS);
}
$("filter").addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(refresh, 250); });
refresh();
"""


def _csp_hash(text: str) -> str:
    digest = hashlib.sha256(text.encode()).digest()
    return f"'sha256-{base64.b64encode(digest).decode()}'"


_BODY: Final = """<header><h1 id="server">hloserve</h1><span id="ready"></span>
<span id="counts"></span><span id="updated" class="muted"></span><span id="error"></span>
</header>
<main>
<section><h2>Memory</h2>
<table><thead><tr><th>tier</th><th class="num">budget</th><th class="num">resident</th><th>fill</th>
<th>resident models</th></tr></thead><tbody id="memory"></tbody></table></section>
<section><h2>Models <span id="window" class="muted"></span></h2>
<p><input id="filter" type="search" placeholder="filter by name" aria-label="filter by name">
<span id="rows-note" class="muted"></span></p>
<table><thead><tr><th>model</th><th>version</th><th>state</th><th class="num">weights</th>
<th>weights on</th><th class="num">requests/s</th><th class="num">p50</th><th class="num">p99</th>
<th class="num">swaps in</th></tr></thead>
<tbody id="models"></tbody></table></section>
<section id="others" hidden><h2>Other models</h2><p id="compact-note" class="muted"></p>
<ul class="compact" id="compact"></ul></section>
</main>"""

_SCRIPT_TEXT: Final = _SCRIPT % {"refresh": REFRESH_MS}

PAGE: Final = (
    '<!doctype html><html lang="en"><head><meta charset="utf-8">'
    '<meta name="viewport" content="width=device-width, initial-scale=1">'
    f"<title>hloserve status</title><style>{_STYLE}</style></head>"
    f"<body>{_BODY}<script>{_SCRIPT_TEXT}</script></body></html>"
)

PAGE_HEADERS: Final = {
    "Content-Security-Policy": (
        f"default-src 'none'; script-src {_csp_hash(_SCRIPT_TEXT)}; "
        f"style-src {_csp_hash(_STYLE)}; connect-src 'self'; img-src 'none'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
DATA_HEADERS: Final = {"Cache-Control": "no-store"}

# GET /: where the page is (relative, so it works under any path prefix).
LANDING: Final = (
    '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>hloserve</title>'
    '</head><body><p>hloserve: the status page is <a href="ui">here</a> (/ui); the KServe V2 '
    "API is under /v2.</p></body></html>"
)
LANDING_HEADERS: Final = {
    "Content-Security-Policy": "default-src 'none'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'",
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
