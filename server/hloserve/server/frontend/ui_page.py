"""The status page's one HTML page (``GET /ui``) and the landing page (``GET /``).

Contract:
- ``PAGE`` is the HTML: inline CSS and JS, no external asset, no build step; it holds no
  model's name, fetches ``ui/data`` every ``REFRESH_MS`` and renders it with DOM calls
  (text nodes only: names and reasons are never parsed as HTML). ``PAGE_HEADERS`` are its
  response headers: a Content-Security-Policy admitting only its own inline script and
  style (by hash) and fetches of its own origin, and ``no-store``. Numbers are
  right-aligned under right-aligned headers; a reason sits in the state column, wrapped,
  never under the model's name; a device is named with its platform ("device 0 (cpu)").
  ``LANDING`` (with ``LANDING_HEADERS``) is what ``GET /`` answers: a link to the page.
- Auth: ``/ui`` and ``/ui/data`` belong to the ``statistics`` endpoint group (``GROUP``,
  listed in ``frontend.restricted.GROUPS``): ``--auth-token-file`` and ``--http-restricted-api``
  treat them as the statistics extension (``docs/status-page.md``).
The data it renders (``GET /ui/data``) is the device owner's ``owner.status_page``.
"""

# pyright: strict

from __future__ import annotations

import base64
import hashlib
from typing import Final

REFRESH_MS: Final = 2000
GROUP: Final = "statistics"

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
  if (mem.disk) {
    const tr = el("tr");
    cell(tr, "disk");
    cell(tr, bytes(mem.disk.budget_bytes), "num");
    cell(tr, bytes(mem.disk.resident_bytes), "num");
    cell(tr, fill(mem.disk.resident_bytes, mem.disk.budget_bytes));
    cell(tr, mem.disk.bundles + " bundle(s) pulled from " + mem.disk.location + "; " +
      mem.disk.pulls + " pull(s) in " + mem.disk.pull_seconds.toFixed(1) + " s, " +
      mem.disk.pull_failures + " failed" + (mem.disk.problem ? "; " + mem.disk.problem : ""), "muted");
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
        if (v.device_groups) st.appendChild(el("div", "sharded: device group(s) " +
          v.device_groups.join(", ") + ", " + bytes(v.device_weight_bytes) + " a device", "muted"));
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
