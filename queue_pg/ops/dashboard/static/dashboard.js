// The dashboard's pages: each polls the JSON of the server every few seconds and redraws.
// Every figure shown is one the server read from SQL; this file only lays them out, but for
// the live points of the last-hour charts: each poll's counts, and its counters' growth since
// the poll before as a rate (as `queue-pg top` does), so the charts move from the first
// seconds on, between the samples sweep takes. Text from the database goes in through
// textContent only, never as HTML.
"use strict";

const page = document.body.dataset.page;
const content = document.getElementById("content");
const charts = new Map();
let config = { actions: false, refresh: 5 };
let ticks = 0;
let loadFailed = false;

// --- small helpers -----------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : String(c ?? ""));
  return e;
}

// A dashboard with a token wants it on every read: the page asks once, keeps it in the tab.
function tokenHeaders(headers) {
  const token = sessionStorage.getItem("queue_pg_token");
  if (token) headers.Authorization = "Bearer " + token;
  return headers;
}

async function getJson(url) {
  const r = await fetch(url, { headers: tokenHeaders({ Accept: "application/json" }) });
  const body = await r.json();
  if (r.status === 401 && body.login) location.reload(); // the session ended: log in again
  if (r.status === 401 && body.token) throw new NeedToken(body.error);
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}

class NeedToken extends Error {}

// Login mode: a POST of the session carries its CSRF token; the session cookie goes by itself.
async function postJson(url, body) {
  const headers = { "Content-Type": "application/json" };
  if (config.csrf) headers["X-CSRF-Token"] = config.csrf;
  if (needsToken()) tokenHeaders(headers);
  return fetch(url, { method: "POST", headers, body: JSON.stringify(body) });
}

// The bearer token is asked for unless a login session replaces it.
function needsToken() {
  return !config.login || Boolean(config.token);
}

function param(name) {
  return new URLSearchParams(location.search).get(name);
}

function seconds(v) {
  if (v === null || v === undefined) return "-";
  if (v < 1) return v.toFixed(3) + " s";
  if (v < 120) return v.toFixed(v < 10 ? 1 : 0) + " s";
  if (v < 7200) return (v / 60).toFixed(1) + " min";
  return (v / 3600).toFixed(1) + " h";
}

function num(v, digits) {
  if (v === null || v === undefined) return "-";
  return typeof v === "number" && !Number.isInteger(v) ? v.toPrecision(digits || 3) : String(v);
}

function time(iso) {
  return iso ? new Date(iso).toLocaleTimeString() : "-";
}

function status(text, isError) {
  const s = document.getElementById("status");
  s.textContent = text || "";
  s.className = isError ? "error" : "";
}

function queueLink(name) {
  return el("a", { href: "queue?name=" + encodeURIComponent(name), class: "queue-link" }, name);
}

// Text a producer or consumer chose can be long: a cell shows its first CLIP characters, the
// whole (up to TITLE characters) in its tooltip. It goes in as text, never as HTML.
const CLIP = 200;
const TITLE = 2000;

function clipped(value) {
  if (value instanceof Node) return value;
  const text = String(value ?? "");
  if (text.length <= CLIP) return text;
  return el("span", { class: "clipped", title: text.slice(0, TITLE) }, text.slice(0, CLIP) + "…");
}

// A table from column specs [header, row => value, text?]; cells of `text` columns align left
// and wrap anywhere, so no value widens the page.
function table(id, columns, rows, empty) {
  if (!rows.length) return el("p", { class: "empty", id }, empty);
  const head = el("tr", {}, ...columns.map(([h, , text]) => el("th", { class: text ? "text" : "" }, h)));
  const body = rows.map((row) =>
    el("tr", {}, ...columns.map(([, f, text]) => el("td", { class: text ? "text" : "" }, clipped(f(row))))));
  return el("div", { class: "scroll" }, el("table", { id }, el("thead", {}, head), el("tbody", {}, ...body)));
}

// --- lists: a filter and pages on every list, kept across polls -------------------------------

const PAGE_ROWS = 50;
const lists = new Map();

function cellText(value) {
  return value instanceof Node ? value.textContent : String(value ?? "");
}

// A list of rows with a filter (on its text columns) and pages of PAGE_ROWS; `capped`: the
// server had more rows than it sent. The controls are made once, so typing survives polls.
function list(id, columns, rows, empty, capped) {
  let s = lists.get(id);
  if (!s) {
    const given = lists.size === 0 ? param("filter") || "" : "";
    s = { page: 0, filter: given.toLowerCase() };
    s.input = el("input", { type: "search", class: "filter", placeholder: "filter", "data-filter": id,
                            "aria-label": "filter" });
    s.input.value = given;
    s.prev = el("button", { type: "button", class: "pager", "data-prev": id }, "‹ previous");
    s.next = el("button", { type: "button", class: "pager", "data-next": id }, "next ›");
    s.info = el("span", { class: "page-info", "data-info": id });
    s.controls = el("div", { class: "list-controls" }, s.input, s.prev, s.info, s.next);
    s.rowsHolder = el("div");
    s.holder = el("div", { class: "list", "data-list": id }, s.controls, s.rowsHolder);
    s.input.oninput = () => { s.filter = s.input.value.toLowerCase(); s.page = 0; drawList(s); };
    s.prev.onclick = () => { s.page -= 1; drawList(s); };
    s.next.onclick = () => { s.page += 1; drawList(s); };
    lists.set(id, s);
  }
  Object.assign(s, { id, columns, rows, empty, capped });
  drawList(s);
  return s.holder;
}

function drawList(s) {
  const texts = s.columns.filter(([, , text]) => text);
  const matching = s.filter
    ? s.rows.filter((row) => texts.some(([, f]) => cellText(f(row)).toLowerCase().includes(s.filter)))
    : s.rows;
  const pages = Math.max(1, Math.ceil(matching.length / PAGE_ROWS));
  s.page = Math.max(0, Math.min(s.page, pages - 1));
  const first = s.page * PAGE_ROWS;
  const shown = matching.slice(first, first + PAGE_ROWS);
  s.info.textContent = matching.length
    ? `${first + 1}–${first + shown.length} of ${matching.length}${s.capped ? " (the first " + s.rows.length + " read)" : ""}`
    : "";
  s.prev.disabled = s.page === 0;
  s.next.disabled = s.page >= pages - 1;
  s.controls.hidden = s.rows.length === 0;
  s.rowsHolder.replaceChildren(table(s.id, s.columns, shown,
    s.filter && s.rows.length ? "Nothing matches the filter." : s.empty));
}

// --- charts (uPlot, shipped in static/) --------------------------------------------------------

const COLORS = ["#2b5fb8", "#e08a00", "#7a3fb8", "#b3261e", "#1e7b34"];

// The range the charts show, chosen in the header: the last hour (sweep's samples and the
// live points) or 24 hours / 7 days (finished messages per hour, from the history rollups).
const RANGES = { "3600": "last hour", "86400": "last 24 hours", "604800": "last 7 days" };
const range = RANGES[sessionStorage.getItem("queue_pg_range")] ? sessionStorage.getItem("queue_pg_range") : "3600";
const rangeSeconds = Number(range);

// Live points per queue: each poll's counts and counters (x: the browser's clock, in seconds).
const live = new Map();
const FLOWS = ["sent", "received", "deleted", "lease_expiries", "stale_receipts"];

function noteLive(stats) {
  const at = Date.now() / 1000;
  for (const s of stats) {
    const points = live.get(s.queue) || [];
    const before = points[points.length - 1];
    const p = { at, visible: s.visible, in_flight: s.in_flight, delayed: s.delayed, dead_lettered: s.dead_lettered };
    for (const f of FLOWS) {
      p[f] = s[f];
      p[f + "_per_s"] = before && at > before.at ? Math.max(s[f] - before[f], 0) / (at - before.at) : null;
    }
    points.push(p);
    while (points.length && points[0].at < at - 3600) points.shift();
    live.set(s.queue, points);
  }
}

// Sweep's samples up to the first live point, then the live points.
function withLive(queue, samples) {
  const points = live.get(queue) || [];
  const first = points.length ? points[0].at : Infinity;
  return [...samples.map((s) => ({ ...s, at: Date.parse(s.at) / 1000 })).filter((s) => s.at < first), ...points];
}

// One chart per key, made once and given new data on each poll.
function chart(key, title, samples, series, width) {
  const xs = samples.map((s) => (typeof s.at === "number" ? s.at : Date.parse(s.at) / 1000));
  const data = [xs, ...series.map(([, f]) => samples.map(f))];
  let entry = charts.get(key);
  if (!entry) {
    const holder = el("div", { class: "card chart", "data-chart": key }, el("h3", {}, title));
    const opts = {
      width: width || 420, height: 170,
      series: [{}, ...series.map(([label], i) => ({ label, stroke: COLORS[i % COLORS.length], width: 1.5 }))],
      axes: [{}, { size: 50 }],
      // the whole range, however few samples there are yet
      scales: { x: { time: true, range: () => { const t = Date.now() / 1000; return [t - rangeSeconds, t]; } } },
      legend: { live: false },
    };
    entry = { holder, plot: new uPlot(opts, data, holder) };
    charts.set(key, entry);
  } else {
    entry.plot.setData(data);
  }
  entry.holder.dataset.points = String(xs.length);
  return entry.holder;
}

const DEPTH = [["visible", (s) => s.visible], ["in flight", (s) => s.in_flight],
               ["delayed", (s) => s.delayed], ["dead-lettered", (s) => s.dead_lettered]];
const RATES = [["sent/s", (s) => s.sent_per_s], ["received/s", (s) => s.received_per_s],
               ["deleted/s", (s) => s.deleted_per_s], ["lease expiries/s", (s) => s.lease_expiries_per_s],
               ["stale receipts/s", (s) => s.stale_receipts_per_s]];
const THROUGHPUT = [["finished/s", (s) => s.finished_per_s], ["dead-lettered/s", (s) => s.dead_lettered_per_s],
                    ["lease expiries/s", (s) => s.lease_expiries_per_s]];

// The charts of a queue for the chosen range: `history` the last hour's samples, `hourly` the
// rollups' rows (24 hours, 7 days).
// `prefix`: "" on the overview, "q" on a queue's page (the charts' keys: depth:orders, qdepth:orders).
function queueCharts(prefix, queue, history, hourly, width, depth, rates) {
  if (rangeSeconds > 3600) {
    return [chart(`${prefix}throughput:${queue}`, `finished per hour, as per second (${RANGES[range]})`,
                  hourly, THROUGHPUT, width)];
  }
  const samples = withLive(queue, history);
  return [chart(`${prefix}depth:${queue}`, "messages (last hour)", samples, depth, width),
          chart(`${prefix}rates:${queue}`, "per second (last hour)", samples, rates, width)];
}

function historyOf(queue) {
  const q = queue ? "&queue=" + encodeURIComponent(queue) : "";
  return rangeSeconds > 3600
    ? Promise.all([Promise.resolve([]), getJson(`api/throughput?seconds=${rangeSeconds}${q}`)])
    : Promise.all([getJson("api/history?seconds=3600" + q), Promise.resolve([])]);
}

function byQueue(samples) {
  const m = new Map();
  for (const s of samples) {
    if (!m.has(s.queue)) m.set(s.queue, []);
    m.get(s.queue).push(s);
  }
  return m;
}

// --- the pieces pages share --------------------------------------------------------------------

function statsTable(stats, queues) {
  const timeout = new Map(queues.map((q) => [q.name, q.visibility_timeout]));
  return list("queues", [
    ["queue", (s) => queueLink(s.queue), true],
    ["visible", (s) => s.visible], ["in flight", (s) => s.in_flight], ["delayed", (s) => s.delayed],
    ["dead-lettered", (s) => s.dead_lettered],
    ["oldest visible", (s) => seconds(s.oldest_visible_age)],
    ["sent (1 min)", (s) => num(s.sent_1m)], ["received (1 min)", (s) => num(s.received_1m)],
    ["deleted (1 min)", (s) => num(s.deleted_1m)], ["lease expiries (1 min)", (s) => num(s.lease_expiries_1m)],
    ["stale receipts (1 min)", (s) => num(s.stale_receipts_1m)],
    ["sent (1 h)", (s) => num(s.sent_1h)],
    ["timeout", (s) => seconds(timeout.get(s.queue))],
    ["exact?", (s) => (s.approximate ? "approx." : "yes")],
  ], stats, "No queue to show: none exists, or this role has no grant on any.", false);
}

function adviceTable(rows) {
  return list("advice", [
    ["queue", (a) => queueLink(a.queue), true],
    ["type", (a) => (a.scope === "queue" ? "(all)" : a.type ?? "(none)"), true],
    ["timeout now", (a) => seconds(a.current_timeout)],
    ["timeout advised", (a) => {
      const e = el("span", {}, seconds(a.recommended_timeout));
      if (a.recommended_timeout !== null && a.recommended_timeout > a.current_timeout) e.className = "warn";
      return e;
    }],
    ["heartbeat every", (a) => seconds(a.heartbeat_interval)],
    ["samples", (a) => a.samples], ["p50", (a) => seconds(a.p50)], ["p95", (a) => seconds(a.p95)],
    ["p99", (a) => seconds(a.p99)], ["max", (a) => seconds(a.max)],
    ["expiry rate", (a) => num(a.expiry_rate, 2)], ["redeliveries", (a) => a.redeliveries],
    ["stale receipts", (a) => a.stale_receipts], ["confidence", (a) => a.confidence, true],
    ["split?", (a) => (a.split_advised ? "yes" : ""), true],
  ], rows, "No finished work in the last 24 hours: no advice yet.", false);
}

function inFlightTable(rows, limit) {
  return list("in-flight", [
    ["queue", (m) => queueLink(m.queue), true], ["id", (m) => m.id], ["type", (m) => m.type ?? "", true],
    ["receive count", (m) => m.receive_count], ["leased at", (m) => time(m.leased_at)],
    ["visible until", (m) => time(m.visible_until)], ["lease expiries", (m) => m.lease_expiries],
    ["enqueued", (m) => time(m.enqueued_at)],
  ], rows.slice(0, limit), "No message is leased now.", rows.length > limit);
}

function deadLetterTable(rows, limit) {
  return list("dead-letters", [
    ["dead-letter queue", (d) => queueLink(d.dead_letter_queue), true], ["id", (d) => d.id],
    ["from", (d) => d.source_queue ?? "-", true], ["type", (d) => d.type ?? "", true],
    ["receive count", (d) => d.receive_count], ["lease expiries", (d) => d.lease_expiries],
    ["reason", (d) => d.reason ?? "", true], ["last error", (d) => d.last_error ?? "", true],
    ["enqueued", (d) => time(d.enqueued_at)],
  ], rows.slice(0, limit), "No dead letters.", rows.length > limit);
}

// --- actions: behind a dialog that wants the name typed again, and the token ---------------------

function confirmAction(text, name) {
  const dialog = document.getElementById("confirm");
  const input = document.getElementById("confirm-input");
  const token = document.getElementById("token-input");
  const ok = document.getElementById("confirm-ok");
  document.getElementById("confirm-text").textContent = text;
  document.getElementById("confirm-name").textContent = name;
  document.getElementById("token-label").hidden = !needsToken() || Boolean(sessionStorage.getItem("queue_pg_token"));
  input.value = "";
  token.value = "";
  ok.disabled = true;
  input.oninput = () => { ok.disabled = input.value !== name; };
  return new Promise((resolve) => {
    dialog.onclose = () => {
      if (dialog.returnValue === "ok" && token.value) sessionStorage.setItem("queue_pg_token", token.value);
      resolve(dialog.returnValue === "ok" && input.value === name);
    };
    dialog.returnValue = "";
    dialog.showModal();
  });
}

async function act(action, body, done) {
  const r = await postJson("api/" + action, body);
  const answer = await r.json();
  if (r.status === 401) sessionStorage.removeItem("queue_pg_token");
  if (!r.ok) throw new Error(answer.error || r.statusText);
  status(done(answer));
  await refresh();
}

function purgeButton(queue) {
  return el("button", { class: "danger", id: "purge", onclick: async () => {
    if (!(await confirmAction(`Delete every message of queue ${queue}, in any state? This cannot be undone.`, queue))) return;
    try { await act("purge", { queue, confirm: queue }, (a) => `Purged ${a.purged} messages from ${a.queue}.`); }
    catch (e) { status(e.message, true); }
  } }, "Purge…");
}

function redriveButton(dlq) {
  return el("button", { class: "act", "data-redrive": dlq, onclick: async () => {
    if (!(await confirmAction(`Move every message of dead-letter queue ${dlq} back to the queue it came from?`, dlq))) return;
    try { await act("redrive", { dlq, confirm: dlq }, (a) => `Redrove ${a.redriven} messages from ${a.dlq}.`); }
    catch (e) { status(e.message, true); }
  } }, "Redrive " + dlq + "…");
}

// --- message bodies: on request, for a role that may receive from the queue ---------------------

const bodyViews = new Map();

function bodies(queue) {
  let v = bodyViews.get(queue);
  if (!v) {
    v = { holder: el("div", { class: "bodies", "data-bodies": queue }) };
    const button = el("button", { type: "button", class: "act", id: "show-bodies", onclick: async () => {
      try {
        const rows = await getJson("api/messages?limit=20&queue=" + encodeURIComponent(queue));
        v.holder.replaceChildren(button, rows.length ? list("bodies", [
          ["id", (m) => m.id], ["receive count", (m) => m.receive_count], ["enqueued", (m) => time(m.enqueued_at)],
          ["attributes", (m) => m.attributes, true],
          ["body", (m) => el("pre", { class: "body" }, m.body + (m.truncated ? " …(cut)" : "")), true],
        ], rows, "", false) : el("p", { class: "empty" }, "No visible message."));
      } catch (e) {
        v.holder.replaceChildren(button, el("p", { class: "error", id: "bodies-error" }, e.message));
      }
    } }, "Show the first visible messages' bodies");
    v.holder.append(button);
    bodyViews.set(queue, v);
  }
  return v.holder;
}

// --- pages -------------------------------------------------------------------------------------

const pages = {
  async overview() {
    const [overview, [history, hourly]] = await Promise.all([getJson("api/overview"), historyOf(null)]);
    noteLive(overview.stats);
    const samples = byQueue(history);
    const hours = byQueue(hourly);
    const cards = overview.stats.map((s) => el("div", { class: "queue-charts" },
      el("h2", {}, queueLink(s.queue)),
      el("div", { class: "charts" }, ...queueCharts("", s.queue, samples.get(s.queue) || [], hours.get(s.queue) || [],
        undefined, DEPTH.filter(([l]) => l !== "delayed"), RATES.slice(0, 3)))));
    const replica = overview.replica ? [el("p", { class: "replica", role: "note" }, overview.replica)] : [];
    return [el("h2", {}, "Queues"), ...replica, statsTable(overview.stats, overview.queues), ...cards];
  },

  async queue() {
    const name = param("name");
    if (!name) return [el("p", { class: "empty" }, "No queue named: open one from the list of queues.")];
    const q = encodeURIComponent(name);
    const [overview, [history, hourly], advice, inFlight, dead] = await Promise.all([
      getJson("api/overview"), historyOf(name), getJson("api/advice?queue=" + q),
      getJson("api/in-flight?limit=1001&queue=" + q), getJson("api/dead-letters?limit=1001&queue=" + q)]);
    noteLive(overview.stats);
    const stats = overview.stats.filter((s) => s.queue === name);
    const isDlq = overview.queues.some((c) => c.dead_letter_queue === name) || dead.length > 0;
    const actions = config.actions
      ? el("p", { class: "actions" }, purgeButton(name), " ", isDlq ? redriveButton(name) : "")
      : el("p", { class: "empty" }, "Read-only: purge and redrive need the dashboard started with --allow-actions and a token.");
    const parts = [el("h2", { id: "queue-name" }, "Queue " + name), statsTable(stats, overview.queues), actions,
      el("div", { class: "charts" }, ...queueCharts("q", name, history, hourly, 560, DEPTH, RATES)),
      el("h2", {}, "Messages"), bodies(name),
      el("h2", {}, "Timeout advice (last 24 hours)"), adviceTable(advice),
      el("h2", {}, `In flight (${stats.length ? stats[0].in_flight : 0})`), inFlightTable(inFlight, 1000)];
    if (isDlq) parts.push(el("h2", {}, "Dead letters"), deadLetterTable(dead, 1000));
    return parts;
  },

  async "in-flight"() {
    const rows = await getJson("api/in-flight?limit=1001");
    return [el("h2", {}, "Messages in flight"), inFlightTable(rows, 1000)];
  },

  async "dead-letters"() {
    const [overview, rows] = await Promise.all([getJson("api/overview"), getJson("api/dead-letters?limit=1001")]);
    // every dead-letter queue this role sees, those past the first rows shown included
    const seen = new Set(overview.stats.map((s) => s.queue));
    const dlqs = [...new Set([...overview.queues.map((q) => q.dead_letter_queue), ...rows.map((d) => d.dead_letter_queue)])]
      .filter((d) => d && seen.has(d)).sort();
    const buttons = config.actions && dlqs.length
      ? el("p", { class: "actions" }, ...dlqs.flatMap((d) => [redriveButton(d), " "])) : "";
    return [el("h2", {}, "Dead letters"), buttons, deadLetterTable(rows, 1000)];
  },

  async tasks() {
    const rows = await getJson("api/tasks");
    const failed = (t) => el("a", { href: "dead-letters?filter=" + encodeURIComponent(t.type ?? ""), class: "failed-link" },
                             (100 * t.dead_letter_rate).toFixed(1) + " %");
    return [el("h2", {}, "Tasks (last 24 hours)"),
      el("p", {}, "Per task (the message type) and queue, from the messages finished in the last 24 hours; " +
                  "dead-lettered opens the task's dead letters."),
      list("tasks", [
        ["task", (t) => t.type ?? "(none)", true], ["queue", (t) => queueLink(t.queue), true],
        ["finished", (t) => t.finished], ["per s (24 h)", (t) => num(t.finished / 86400)],
        ["p50", (t) => seconds(t.p50)], ["p95", (t) => seconds(t.p95)], ["max", (t) => seconds(t.max)],
        ["retries", (t) => t.redeliveries], ["lease expiry rate", (t) => num(t.expiry_rate, 2)],
        ["dead-lettered", failed],
      ], rows, "No task finished in the last 24 hours.", false)];
  },

  async workers() {
    const [rows, stuck] = await Promise.all([getJson("api/workers"), getJson("api/stuck")]);
    return [el("h2", {}, "Workers"),
      el("p", {}, "Consumers registered by queue-pg workers (the queues this role sees): alive while " +
                  "their session holds its lock; a lost one's leases end within seconds."),
      list("workers", [
        ["worker", (w) => w.name ?? "-", true], ["id", (w) => w.id], ["role", (w) => w.role, true],
        ["backend pid", (w) => w.pid], ["queues", (w) => w.queues.join(", "), true],
        ["jobs running", (w) => w.running],
        ["registered", (w) => (w.registered_at ? new Date(w.registered_at).toLocaleString() : "-")],
        ["state", (w) => (w.alive ? "alive" : "lost " + (w.lost_at ? time(w.lost_at) : "")), true],
      ], rows, "No worker registered on the queues this role sees.", false),
      el("h2", { id: "stuck-title" }, `Stuck jobs (${stuck.length})`),
      el("p", {}, "Runs on 'per_type' queues past twice their type's lease (queue_pg.stuck_jobs); " +
                  "past the stop point their heartbeats are refused and the message is delivered again."),
      list("stuck", [
        ["queue", (j) => queueLink(j.queue), true], ["message", (j) => j.id], ["type", (j) => j.type, true],
        ["worker", (j) => j.consumer ?? "-", true], ["running for", (j) => seconds(j.running_for)],
        ["type's lease", (j) => seconds(j.type_lease)], ["stuck after", (j) => seconds(j.stuck_after)],
        ["stopped after", (j) => seconds(j.stopped_after)],
      ], stuck, "No stuck job.", false)];
  },

  async advice() {
    const rows = await getJson("api/advice");
    return [el("h2", {}, "Timeout advice (last 24 hours)"),
      el("p", {}, "The advised visibility timeout is about 6 × the p99 processing time (bounded), " +
                  "doubled when leases lapse; heartbeat at a third of it."),
      adviceTable(rows)];
  },
};

// --- the loop ----------------------------------------------------------------------------------

async function refresh() {
  try {
    const parts = await pages[page]();
    // charts and list controls keep their element across polls: re-append, not re-create
    // (which loses the focus of a filter being typed in: given back, with its caret)
    const focused = document.activeElement;
    const caret = focused && focused.classList.contains("filter") ? focused.selectionStart : null;
    content.replaceChildren(...parts.filter((p) => p !== ""));
    if (caret !== null && focused.isConnected && document.activeElement !== focused) {
      focused.focus();
      focused.setSelectionRange(caret, caret);
    }
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
    if (loadFailed) status("");
    loadFailed = false;
  } catch (e) {
    if (e instanceof NeedToken) {
      showTokenForm(sessionStorage.getItem("queue_pg_token") ? e.message : "");
      return false;
    }
    status("Could not load: " + e.message, true);
    loadFailed = true;
  }
  ticks += 1;
  document.body.dataset.ticks = String(ticks);
}

async function loop() {
  if ((await refresh()) === false) return; // the token form waits for the token
  setTimeout(loop, config.refresh * 1000);
}

function showTokenForm(error) {
  sessionStorage.removeItem("queue_pg_token");
  content.replaceChildren();
  if (error) status(error, true);
  const form = document.getElementById("token-form");
  form.hidden = false;
  document.getElementById("token-value").focus();
  form.onsubmit = (event) => {
    event.preventDefault();
    sessionStorage.setItem("queue_pg_token", document.getElementById("token-value").value);
    location.reload();
  };
}

async function start() {
  for (const a of document.querySelectorAll("[data-nav]")) {
    if (a.dataset.nav === page) a.className = "here";
  }
  try {
    config = await getJson("api/config");
  } catch (e) {
    status("Could not load: " + e.message, true);
  }
  document.getElementById("mode").textContent = config.actions ? "actions enabled" : "read-only";
  const select = document.getElementById("range");
  select.value = range;
  select.onchange = () => { sessionStorage.setItem("queue_pg_range", select.value); location.reload(); };
  if (config.login && !config.user) {
    showLogin();
    return;
  }
  if (config.login) {
    const user = document.getElementById("user");
    user.textContent = "role " + config.user;
    user.hidden = false;
    const logout = document.getElementById("logout");
    logout.hidden = false;
    logout.onclick = async () => {
      await (await postJson("api/logout", {})).json(); // read whole before the page goes
      location.reload();
    };
  }
  await loop();
}

function showLogin() {
  const form = document.getElementById("login");
  form.hidden = false;
  document.getElementById("login-role").focus();
  form.onsubmit = async (event) => {
    event.preventDefault();
    const password = document.getElementById("login-password");
    const r = await postJson("api/login", { role: document.getElementById("login-role").value,
                                            password: password.value });
    password.value = "";
    const answer = await r.json();
    if (r.ok) { location.reload(); return; }
    status(answer.error || r.statusText, true);
  };
}

start();
