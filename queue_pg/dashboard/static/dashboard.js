// The dashboard's pages: each polls the JSON of the server every few seconds and redraws.
// Every figure shown is one the server read from SQL; this file only lays them out. Text from
// the database goes in through textContent only, never as HTML.
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

async function getJson(url) {
  const r = await fetch(url, { headers: { Accept: "application/json" } });
  const body = await r.json();
  if (r.status === 401 && body.login) location.reload(); // the session ended: log in again
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}

// Login mode: a POST of the session carries its CSRF token; the session cookie goes by itself.
async function postJson(url, body) {
  const headers = { "Content-Type": "application/json" };
  if (config.csrf) headers["X-CSRF-Token"] = config.csrf;
  if (needsToken()) headers.Authorization = "Bearer " + (sessionStorage.getItem("queue_pg_token") || "");
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

// A table from column specs [header, row => value, text?]; cells of `text` columns align left.
function table(id, columns, rows, empty) {
  if (!rows.length) return el("p", { class: "empty", id }, empty);
  const head = el("tr", {}, ...columns.map(([h, , text]) => el("th", { class: text ? "text" : "" }, h)));
  const body = rows.map((row) =>
    el("tr", {}, ...columns.map(([, f, text]) => el("td", { class: text ? "text" : "" }, f(row)))));
  return el("table", { id }, el("thead", {}, head), el("tbody", {}, ...body));
}

// --- charts (uPlot, shipped in static/) --------------------------------------------------------

const COLORS = ["#2b5fb8", "#e08a00", "#7a3fb8", "#b3261e", "#1e7b34"];

// One chart per key, made once and given new data on each poll.
function chart(key, title, samples, series, width) {
  const xs = samples.map((s) => Date.parse(s.at) / 1000);
  const data = [xs, ...series.map(([, f]) => samples.map(f))];
  let entry = charts.get(key);
  if (!entry) {
    const holder = el("div", { class: "card chart", "data-chart": key }, el("h3", {}, title));
    const opts = {
      width: width || 420, height: 170,
      series: [{}, ...series.map(([label], i) => ({ label, stroke: COLORS[i % COLORS.length], width: 1.5 }))],
      axes: [{}, { size: 50 }],
      // the whole last hour, however few samples there are yet
      scales: { x: { time: true, range: () => { const t = Date.now() / 1000; return [t - 3600, t]; } } },
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
  return table("queues", [
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
  ], stats, "No queue to show: none exists, or this role has no grant on any.");
}

function adviceTable(rows) {
  return table("advice", [
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
  ], rows, "No finished work in the last 24 hours: no advice yet.");
}

function inFlightTable(rows, limit) {
  const shown = rows.slice(0, limit);
  const t = table("in-flight", [
    ["queue", (m) => queueLink(m.queue), true], ["id", (m) => m.id], ["type", (m) => m.type ?? "", true],
    ["receive count", (m) => m.receive_count], ["leased at", (m) => time(m.leased_at)],
    ["visible until", (m) => time(m.visible_until)], ["lease expiries", (m) => m.lease_expiries],
    ["enqueued", (m) => time(m.enqueued_at)],
  ], shown, "No message is leased now.");
  return rows.length > limit ? el("div", {}, t, el("p", { class: "empty" }, "more not shown")) : t;
}

function deadLetterTable(rows, limit) {
  const shown = rows.slice(0, limit);
  const t = table("dead-letters", [
    ["dead-letter queue", (d) => queueLink(d.dead_letter_queue), true], ["id", (d) => d.id],
    ["from", (d) => d.source_queue ?? "-", true], ["type", (d) => d.type ?? "", true],
    ["receive count", (d) => d.receive_count], ["lease expiries", (d) => d.lease_expiries],
    ["reason", (d) => d.reason ?? "", true], ["last error", (d) => d.last_error ?? "", true],
    ["enqueued", (d) => time(d.enqueued_at)],
  ], shown, "No dead letters.");
  return rows.length > limit ? el("div", {}, t, el("p", { class: "empty" }, "more not shown")) : t;
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

// --- pages -------------------------------------------------------------------------------------

const pages = {
  async overview() {
    const [overview, history] = await Promise.all([getJson("api/overview"), getJson("api/history")]);
    const samples = byQueue(history);
    const cards = overview.stats.map((s) => el("div", { class: "queue-charts" },
      el("h2", {}, queueLink(s.queue)),
      el("div", { class: "charts" },
        chart("depth:" + s.queue, "messages (last hour)", samples.get(s.queue) || [], DEPTH.filter(([l]) => l !== "delayed")),
        chart("rates:" + s.queue, "per second (last hour)", samples.get(s.queue) || [], RATES.slice(0, 3)))));
    const replica = overview.replica ? [el("p", { class: "replica", role: "note" }, overview.replica)] : [];
    return [el("h2", {}, "Queues"), ...replica, statsTable(overview.stats, overview.queues), ...cards];
  },

  async queue() {
    const name = param("name");
    if (!name) return [el("p", { class: "empty" }, "No queue named: open one from the list of queues.")];
    const q = encodeURIComponent(name);
    const [overview, history, advice, inFlight, dead] = await Promise.all([
      getJson("api/overview"), getJson("api/history?queue=" + q), getJson("api/advice?queue=" + q),
      getJson("api/in-flight?limit=101&queue=" + q), getJson("api/dead-letters?limit=101&queue=" + q)]);
    const stats = overview.stats.filter((s) => s.queue === name);
    const isDlq = overview.queues.some((c) => c.dead_letter_queue === name) || dead.length > 0;
    const actions = config.actions
      ? el("p", { class: "actions" }, purgeButton(name), " ", isDlq ? redriveButton(name) : "")
      : el("p", { class: "empty" }, "Read-only: purge and redrive need the dashboard started with --allow-actions and a token.");
    const parts = [el("h2", { id: "queue-name" }, "Queue " + name), statsTable(stats, overview.queues), actions,
      el("div", { class: "charts" },
        chart("qdepth:" + name, "messages (last hour)", history, DEPTH, 560),
        chart("qrates:" + name, "per second (last hour)", history, RATES, 560)),
      el("h2", {}, "Timeout advice (last 24 hours)"), adviceTable(advice),
      el("h2", {}, `In flight (${stats.length ? stats[0].in_flight : 0})`), inFlightTable(inFlight, 100)];
    if (isDlq) parts.push(el("h2", {}, "Dead letters"), deadLetterTable(dead, 100));
    return parts;
  },

  async "in-flight"() {
    const rows = await getJson("api/in-flight?limit=501");
    return [el("h2", {}, "Messages in flight"), inFlightTable(rows, 500)];
  },

  async "dead-letters"() {
    const [overview, rows] = await Promise.all([getJson("api/overview"), getJson("api/dead-letters?limit=501")]);
    // every dead-letter queue this role sees, those past the first rows shown included
    const seen = new Set(overview.stats.map((s) => s.queue));
    const dlqs = [...new Set([...overview.queues.map((q) => q.dead_letter_queue), ...rows.map((d) => d.dead_letter_queue)])]
      .filter((d) => d && seen.has(d)).sort();
    const buttons = config.actions && dlqs.length
      ? el("p", { class: "actions" }, ...dlqs.flatMap((d) => [redriveButton(d), " "])) : "";
    return [el("h2", {}, "Dead letters"), buttons, deadLetterTable(rows, 500)];
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
    // charts keep their element across polls (uPlot redraws in place): re-append, not re-create
    content.replaceChildren(...parts.filter((p) => p !== ""));
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
    if (loadFailed) status("");
    loadFailed = false;
  } catch (e) {
    status("Could not load: " + e.message, true);
    loadFailed = true;
  }
  ticks += 1;
  document.body.dataset.ticks = String(ticks);
}

async function loop() {
  await refresh();
  setTimeout(loop, config.refresh * 1000);
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
