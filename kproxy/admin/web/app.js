// kproxy's live page: no framework, no build step, nothing loaded from elsewhere.
// The admin token is asked once, kept in sessionStorage (this tab only) and sent as an
// Authorization header on every call; the stream is read with fetch() rather than
// EventSource because EventSource cannot send headers (the token never goes in a URL).
"use strict";

const MAX_ROWS = 500;            // rows kept in the list: the page never grows without limit
const MAX_PAUSED = 5000;         // rows held while paused (the oldest go first)
const OVERVIEW_EVERY_MS = 2000;
// The capture panel asks /capture this often, running or not: a capture started or
// stopped elsewhere (the API, another page, capture_autostart) shows within it.
const CAPTURE_EVERY_MS = 2000;
const RECONNECT_MS = 2000;
const TOKEN_KEY = "kproxy-admin-token";

const $ = (sel) => document.querySelector(sel);
let token = sessionStorage.getItem(TOKEN_KEY) || "";
let paused = false, held = [], received = 0, streamCtl = null, refused = false, selected = null;
let filterQuery = "";

function headers(extra) {
  const h = Object.assign({}, extra || {});
  if (token) h["Authorization"] = "Bearer " + token;
  return h;
}

async function call(path, options) {
  const r = await fetch(path, Object.assign({cache: "no-store"}, options || {},
                                            {headers: headers((options || {}).headers)}));
  if (r.status === 401 || r.status === 403) {
    const body = await r.json().catch(() => ({}));
    refuse(r.status, body.error || r.statusText);
    throw new Error("refused");
  }
  return r;
}

function setState(text, cls) {
  const el = $("#state");
  el.textContent = text;
  el.className = "pill " + (cls || "");
}

function refuse(status, message) {
  refused = true;
  setState(status === 401 ? "token needed" : "refused", "refused");
  if (streamCtl) streamCtl.abort();
  if (status === 401) askToken(token ? "That token was refused." : "");
  else { $("#notice").hidden = false; $("#notice").textContent = message; }
}

function askToken(error) {
  const dialog = $("#token-dialog");
  $("#token-error").hidden = !error;
  $("#token-error").textContent = error || "";
  if (!dialog.open) dialog.showModal();
  $("#token").focus();
}

$("#token-form").addEventListener("submit", () => {
  token = $("#token").value.trim();
  $("#token").value = "";
  sessionStorage.setItem(TOKEN_KEY, token);
  refused = false;
  if (token) start(); else askToken("");     // nothing is fetched before there is a token
});
$("#forget").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  token = "";
  askToken("");
});

// ------------------------------------------------------------------ the stream

let started = false;
function start() {
  started = true;
  connect();
  refreshOverview();
  refreshCapture();
}

async function connect() {
  if (streamCtl) streamCtl.abort();
  const ctl = streamCtl = new AbortController();
  setState("connecting…");
  let response;
  try {
    response = await call("/live/stream" + filterQuery, {signal: ctl.signal});
  } catch (e) {
    if (!refused && !ctl.signal.aborted) setTimeout(() => ctl === streamCtl && connect(), RECONNECT_MS);
    return;
  }
  if (!response.ok) {
    const body = await response.json().catch(() => ({}));
    showNotice(body.error || ("stream refused: " + response.status));
    setState("error", "refused");
    return;
  }
  setState(paused ? "paused" : "live", paused ? "paused" : "live");
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  try {
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, {stream: true});
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        handleEvent(buffer.slice(0, cut));
        buffer = buffer.slice(cut + 2);
      }
    }
  } catch (e) { /* aborted or cut */ }
  if (ctl === streamCtl && !refused) {
    setState("reconnecting…");
    setTimeout(() => ctl === streamCtl && connect(), RECONNECT_MS);
  }
}

function handleEvent(block) {
  let type = "message", data = "";
  for (const line of block.split("\n")) {
    if (line.startsWith("event: ")) type = line.slice(7);
    else if (line.startsWith("data: ")) data += line.slice(6);
  }
  if (!data) return;
  const value = JSON.parse(data);
  if (type === "pairs") addRows(value);
  else if (type === "status") showStatus(value);
}

function addRows(rows) {
  received += rows.length;
  if (paused) {
    held.push(...rows);
    if (held.length > MAX_PAUSED) held.splice(0, held.length - MAX_PAUSED);
  } else {
    render(rows);
  }
  updateCounts();
}

function render(rows) {
  const body = $("#pairs tbody");
  const fragment = document.createDocumentFragment();
  for (let i = rows.length - 1; i >= Math.max(0, rows.length - MAX_ROWS); i--) fragment.appendChild(rowElement(rows[i]));
  body.insertBefore(fragment, body.firstChild);              // newest first
  while (body.rows.length > MAX_ROWS) body.deleteRow(-1);
}

function cell(tr, text, cls, title) {
  const td = tr.insertCell();
  td.textContent = text == null ? "" : String(text);
  if (cls) td.className = cls;
  if (title) td.title = title;
  return td;
}

function fmtTime(t) {
  const d = new Date(t * 1000);
  return d.toTimeString().slice(0, 8) + "." + String(d.getMilliseconds()).padStart(3, "0");
}

function rowElement(p) {
  const tr = document.createElement("tr");
  tr.tabIndex = 0;
  tr.dataset.id = p.id;
  tr.dataset.api = p.api;
  tr.dataset.conn = p.conn;
  if (p.pid) tr.dataset.pid = p.pid;     // kproxy run --workers: the worker process the pair is on
  const failed = p.error_count > 0 || p.decode_error;
  if (failed) tr.classList.add("failed");
  cell(tr, fmtTime(p.time));
  cell(tr, p.conn, "num");
  cell(tr, p.client, null, p.listener + (p.software ? " · " + p.software : ""));
  cell(tr, p.client_id);
  cell(tr, p.api + " v" + p.version, "api");
  cell(tr, p.corr, "num");
  cell(tr, p.latency_ms == null ? (p.outcome === "no_response" ? "acks=0" : "") : p.latency_ms.toFixed(2), "num");
  cell(tr, p.req_bytes, "num");
  cell(tr, p.resp_bytes, "num");
  cell(tr, p.throttle_ms ? p.throttle_ms + " ms" : "", "num");
  cell(tr, p.decode_error ? "decode error" : p.errors.join(" "), "err", p.decode_error || "");
  const topics = p.topics.join(", ") + (p.more_topics ? ` +${p.more_topics}` : "");
  cell(tr, topics, "topics", topics);
  cell(tr, p.records, "num");
  return tr;
}

function showStatus(s) {
  const lost = s.dropped + s.thinned + s.overloaded;
  const notices = [];
  if (lost) {
    const parts = [];
    if (s.thinned) parts.push(`${s.thinned} thinned (over the page's per-second cap)`);
    if (s.dropped) parts.push(`${s.dropped} dropped (this page fell behind)`);
    if (s.overloaded) parts.push(`${s.overloaded} not analysed (kproxy's live view was busy)`);
    notices.push(`Sampled stream: ${s.sent} of ${s.matched + s.overloaded} matching pairs shown; ` + parts.join(", ") + ".");
  }
  if (s.workers_missing && s.workers_missing.length) {     // kproxy run --workers
    notices.push(`Not shown: the connections of worker ${s.workers_missing.join(", ")} (of ${s.workers}), not serving or not answering now.`);
  }
  if (notices.length) showNotice(notices.join(" "));
  else if (!refused) $("#notice").hidden = true;
}

function showNotice(text) {
  const n = $("#notice");
  n.textContent = text;
  n.hidden = false;
}

function updateCounts() {
  $("#counts").textContent = `${received} pairs` + (paused ? ` · ${held.length} waiting` : "");
}

function togglePause() {
  paused = !paused;
  $("#pause").textContent = paused ? "Resume" : "Pause";
  setState(paused ? "paused" : "live", paused ? "paused" : "live");
  if (!paused && held.length) { render(held); held = []; }
  updateCounts();
}

$("#pause").addEventListener("click", togglePause);
$("#clear").addEventListener("click", () => { $("#pairs tbody").textContent = ""; held = []; received = 0; updateCounts(); });

// ------------------------------------------------------------------ filters

$("#filters").addEventListener("submit", (e) => {
  e.preventDefault();
  const params = new URLSearchParams();
  for (const el of e.target.elements) {
    if (!el.name) continue;
    if (el.type === "checkbox") { if (el.checked) params.set(el.name, "1"); }
    else if (el.value.trim()) params.set(el.name, el.value.trim());
  }
  const q = params.toString();
  filterQuery = q ? "?" + q : "";
  $("#pairs tbody").textContent = "";
  held = []; received = 0; updateCounts();
  $("#notice").hidden = true;
  connect();
});
$("#reset").addEventListener("click", () => { $("#filters").reset(); $("#filters").requestSubmit(); });

// ------------------------------------------------------------------ detail

$("#pairs tbody").addEventListener("click", (e) => {
  const tr = e.target.closest("tr");
  if (tr) openDetail(tr);
});
$("#pairs tbody").addEventListener("keydown", (e) => {
  const tr = e.target.closest("tr");
  if (!tr) return;
  if (e.key === "Enter") openDetail(tr);
  else if (e.key === "ArrowDown" || e.key === "j") { (tr.nextElementSibling || tr).focus(); e.preventDefault(); }
  else if (e.key === "ArrowUp" || e.key === "k") { (tr.previousElementSibling || tr).focus(); e.preventDefault(); }
});

async function openDetail(tr) {
  if (selected) selected.classList.remove("selected");
  selected = tr;
  tr.classList.add("selected");
  const aside = $("#detail");
  aside.hidden = false;
  aside.dataset.conn = tr.dataset.conn;
  aside.dataset.origin = tr.dataset.pid ? "?pid=" + tr.dataset.pid : "";
  $("#detail-title").textContent = `${tr.dataset.api} · pair ${tr.dataset.id}`;
  $("#detail-request").textContent = $("#detail-response").textContent = "loading…";
  let pair;
  try {
    const r = await call("/live/pairs/" + tr.dataset.id + aside.dataset.origin);
    pair = await r.json();
    if (!r.ok) throw new Error(pair.error || r.statusText);
  } catch (e) {
    $("#detail-request").textContent = $("#detail-response").textContent = "";
    $("#detail-summary").textContent = String(e.message || e);
    return;
  }
  const facts = [`${pair.api_name} v${pair.api_version}`, `conn ${pair.connection_id}`,
                 `client ${pair.client_host}:${pair.client_port}`, `client_id ${pair.client_id}`,
                 pair.latency_ms == null ? pair.outcome : `${pair.latency_ms.toFixed(2)} ms`];
  if (pair.topics.length) facts.push("topics " + pair.topics.join(", "));
  if (pair.record_count != null) facts.push(`${pair.record_count} records`);
  if (pair.errors.length) facts.push("errors " + pair.errors.join(", "));
  if (!pair.record_data_shown) facts.push("record data not shown (capture_allow_record_data is off)");
  $("#detail-summary").textContent = facts.join(" · ");
  $("#detail-summary").dataset.topics = pair.topics.join(",");
  $("#detail-summary").dataset.records = pair.record_count == null ? "" : pair.record_count;
  $("#detail-request").textContent = JSON.stringify(pair.request, null, 2);
  $("#detail-response").textContent = JSON.stringify(pair.response, null, 2);
}

function closeDetail() {
  $("#detail").hidden = true;
  if (selected) { selected.classList.remove("selected"); selected.focus(); selected = null; }
}
$("#detail-close").addEventListener("click", closeDetail);

$("#detail-pcap").addEventListener("click", async () => {
  const conn = $("#detail").dataset.conn;
  try {
    const r = await call(`/live/connections/${conn}/pcapng` + $("#detail").dataset.origin);
    if (!r.ok) { showNotice((await r.json()).error); return; }
    const url = URL.createObjectURL(await r.blob());
    const a = document.createElement("a");
    a.href = url;
    a.download = `kproxy-conn-${conn}.pcapng`;
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  } catch (e) { /* refused: handled */ }
});

// ------------------------------------------------------------------ overview

function fillTable(tbody, rows, cells) {
  tbody.textContent = "";
  for (const row of rows) {
    const tr = tbody.insertRow();
    for (const [text, cls] of cells(row)) cell(tr, text, cls);
  }
}

async function refreshOverview() {
  if (!refused) {
    try {
      const o = await (await call("/live/overview")).json();
      const t = o.traffic;
      $("#window-note").textContent = t.since ? `over the last ${Math.round(t.span_s)} s (counted while this page is open)` : "(waiting for traffic)";
      if (o.notice) $("#window-note").textContent += ` · ${o.notice}`;   // kproxy run --workers: a worker missing
      fillTable($("#apis tbody"), t.apis, (a) => [
        [a.api], [a.rate_recent_per_s.toFixed(2), "num"], [a.rate_per_s.toFixed(2), "num"],
        [a.p99_ms == null ? "–" : "≤ " + a.p99_ms.toFixed(2), "num"],
        [a.errors ? `${(a.error_rate * 100).toFixed(1)} % (${a.errors})` : "0", "num"]]);
      const listeners = Object.entries(o.connections.by_listener);
      fillTable($("#listeners tbody"), listeners.length ? listeners : [["no open connections", ""]],
                ([name, n]) => [[name], [n, "num"]]);
      fillTable($("#inventory tbody"), o.inventory, (c) => [
        [c.address], [c.client_id ?? "–"], [c.software_name ?? "unknown"], [c.software_version ?? "–"],
        [c.open, "num"],
        [Object.entries(c.apis).map(([api, v]) => `${api} ${v.join("/")}`).join(", "), "wrap"]]);
      const ms = (v) => [v == null ? "–" : v.toFixed(2), "num"];
      fillTable($("#telemetry tbody"), o.client_telemetry || [], (c) => {
        const split = c.latency_split_ms || {};
        return [[c.client_instance_id], [c.client_id ?? "–"], [c.address],
          [`${c.software_name ?? "unknown"} ${c.software_version ?? ""}`], [c.pushes, "num"], [c.metrics, "num"],
          ms(split.queue), ms(split.request), ms(split.broker), ms(split.network)];
      });
      if (o.failovers) showFailovers(o.failovers);
      $("#audit-panel").hidden = !o.audit;
      if (o.audit) showAudit(o.audit);
    } catch (e) { /* refused or down: the state pill says so */ }
  }
  setTimeout(refreshOverview, OVERVIEW_EVERY_MS);
}

// Every value below may come from a client (client ids, topic names): cells take text only.
function showFailovers(f) {
  $("#failovers-note").textContent = `${f.ended} since start · ${f.failing_now} partition(s) failing now` +
    (f.leader_changes.length ? ` · latest leader change: ${f.leader_changes[0].topic}-${f.leader_changes[0].partition} ` +
      `${f.leader_changes[0].old_leader ?? "?"} → ${f.leader_changes[0].new_leader}` : "");
  fillTable($("#failovers tbody"), f.failovers, (x) => [
    [fmtTime(x.recovered)], [x.client_id ?? "–"], [x.software_name ?? "unknown"], [x.client_host],
    [`${x.topic}-${x.partition}`], [x.api], [`${x.old_leader ?? "?"} → ${x.new_leader ?? "?"}`, "num"],
    [x.recovery_seconds.toFixed(3), "num"], [x.failed_requests, "num"],
    [Object.entries(x.errors).map(([e, n]) => `${e} ×${n}`).join(", "), "wrap"],
    [x.recovered_by + (x.hint_leader != null ? ` (hint: ${x.hint_leader})` : "")]]);
}

function auditResources(e) {
  const r = e.results.map((x) => x.name ?? x.resource_name ?? x.topic ?? x.group_id ?? x.user ??
                                 (x.request && x.request.resource_name)).filter((x) => x != null);
  return [...new Set(r)].join(", ");
}

function showAudit(events) {
  fillTable($("#audit tbody"), events, (e) => [
    [e.time], [e.principal], [e.client_address], [e.client_id ?? "–"], [e.client_software_name ?? "unknown"],
    [e.api], [auditResources(e), "wrap"],
    [e.outcome + (e.outcome !== "ok" ? ": " + e.results.filter((x) => x.error !== "NONE").map((x) => x.error).join(", ") : "")]]);
}

// ------------------------------------------------------------------ capture control (the /capture API)

let captureTimer = null;
async function refreshCapture() {
  clearTimeout(captureTimer);          // one polling loop, however often start() runs
  if (!refused) {
    try {
      const r = await call("/capture");
      showCapture(await r.json());
    } catch (e) { /* refused: the state pill says so */ }
  }
  captureTimer = setTimeout(refreshCapture, CAPTURE_EVERY_MS);
}

function showCapture(s) {
  const el = $("#capture-status");
  if (s.error && !s.state) { el.textContent = s.error; return; }
  el.textContent = s.state === "running" ? `running since ${s.started_at} · ${s.counters.rows_written} rows written`
    : s.state === "failed" ? `failed: ${s.error}` : `${s.state} · ${s.counters.rows_written} rows written in total`;
  el.dataset.state = s.state;
  const paths = Object.values(s.files || {}).filter(Boolean);
  if (paths.length) {                 // a stopped capture lists no files: keep the last ones shown
    const files = $("#capture-files");
    files.textContent = "";
    for (const path of paths) {
      const li = document.createElement("li");
      li.textContent = path;
      files.appendChild(li);
    }
  }
  $("#capture-start").disabled = s.state === "running";
  $("#capture-stop").disabled = s.state !== "running";
}

$("#capture-start").addEventListener("click", async () => {
  const settings = {formats: [...document.querySelectorAll("input[name=fmt]:checked")].map((e) => e.value)};
  if ($("#capture-dir").value.trim()) settings.directory = $("#capture-dir").value.trim();
  if ($("#capture-apis").value.trim()) settings.filter = {apis: $("#capture-apis").value.split(",").map((s) => s.trim()).filter(Boolean)};
  try {
    const r = await call("/capture/start", {method: "POST", body: JSON.stringify(settings),
                                             headers: {"Content-Type": "application/json"}});
    const s = await r.json();
    if (!r.ok) { $("#capture-status").textContent = s.error; return; }
    showCapture(s);
  } catch (e) { /* refused */ }
});

$("#capture-stop").addEventListener("click", async () => {
  try {
    const r = await call("/capture/stop", {method: "POST", body: "{}"});
    const s = await r.json();
    showCapture(s);
  } catch (e) { /* refused */ }
});

// ------------------------------------------------------------------ keyboard

document.addEventListener("keydown", (e) => {
  if (e.target.matches("input, textarea") || $("#token-dialog").open) return;
  if (e.key === "p") togglePause();
  else if (e.key === "c") $("#clear").click();
  else if (e.key === "/") { e.preventDefault(); $("#filters input[name=apis]").focus(); }
  else if (e.key === "Escape") closeDetail();
});

if (token) start(); else askToken("");     // nothing is fetched before there is a token
