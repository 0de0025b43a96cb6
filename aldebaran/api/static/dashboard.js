// Aldebaran dashboard: polls /api/dashboard and redraws. Plain DOM, no dependencies.
"use strict";

const POLL_MS = 1500;
const TOKEN_KEY = "aldebaran-api-token";

// A bearer token (when the API has one) comes once in the URL fragment: /#token=...
(function keepToken() {
  const match = location.hash.match(/token=([^&]+)/);
  if (match) {
    sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(match[1]));
    history.replaceState(null, "", location.pathname);
  }
})();

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined) continue;
    if (key === "class") node.className = value;
    else node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

const $ = (id) => document.getElementById(id);
const dash = (v) => (v === null || v === undefined ? "–" : v);
const rate = (v) => (v ? v.toFixed(1) : "0.0");

function fill(tbody, rows, emptyText, columns) {
  tbody.replaceChildren(...(rows.length ? rows : [el("tr", { class: "empty" }, el("td", { colspan: columns }, emptyText))]));
}

function time(iso) {
  if (!iso) return "–";
  const d = new Date(iso);
  return isNaN(d) ? iso : d.toLocaleTimeString([], { hour12: false });
}

function renderCards(data) {
  const queues = data.queues || [];
  const total = queues.reduce((n, q) => n + q.messages, 0);
  $("card-messages").textContent = data.queues ? total : "–";
  $("card-messages-note").textContent = data.queues ? `${queues.length} queue rows` : "broker unavailable";
  $("card-books").textContent = dash(data.open_books);
  $("card-books-note").textContent = data.book_queues === null || data.book_queues === undefined ? "" : `per-order book queues: ${data.book_queues}`;
  const pull = data.pull_queue;
  $("card-pull").textContent = pull ? pull.queue_length : "–";
  $("card-pull-note").textContent = pull
    ? `“${pull.name}”: ${pull.checkouts_count} checked out · ${pull.dead_letter_count} dead`
    : "Redis unavailable";
  const dead = data.dead_letters;
  $("card-dead").textContent = dead ? dead.count : "–";
  $("card-dead").classList.toggle("bad", Boolean(dead && dead.count));
  const parked = (data.channels || []).reduce((n, c) => n + (c.parked || 0), 0);
  $("card-dead-note").textContent = `in Aldebaran.Dead_Letter · ${parked} parked by channels`;
  const alerts = data.alerts || [];
  $("card-alerts").textContent = data.alerts ? alerts.length : "–";
  $("card-alerts").classList.toggle("warn", alerts.length > 0);
  $("card-alerts-note").textContent = alerts.length ? `last at ${time(alerts[0].detected_at)}` : "none recorded";
}

function badge(status, text) {
  return el("span", { class: `badge ${status.replace(/ /g, "-")}`, "data-status": status }, text);
}

function renderAlerts(data) {
  const channels = (data.channels || []).map((c) => c.name);
  const head = el("tr", {},
    el("th", {}, "detected"), el("th", {}, "kind"), el("th", {}, "order"), el("th", {}, "client"),
    el("th", {}, "stock"), el("th", { class: "num" }, "requested"), el("th", { class: "num" }, "purchased"),
    channels.map((name) => el("th", { class: "channel" }, name)));
  $("alerts").tHead.replaceChildren(head);
  const rows = (data.alerts || []).map((a) => {
    if (a.unreadable !== undefined) {
      return el("tr", {}, el("td", {}, "–"), el("td", {}, "unreadable"), el("td", { colspan: 5 + channels.length }, a.unreadable));
    }
    const delivery = a.delivery || {};
    return el("tr", { "data-alert-id": a.alert_id },
      el("td", { title: a.detected_at }, time(a.detected_at)),
      el("td", {}, el("span", { class: `kind ${a.kind}` }, a.kind)),
      el("td", { class: "mono" }, a.order_id), el("td", {}, a.client), el("td", {}, a.stock),
      el("td", { class: "num" }, dash(a.requested_shares)), el("td", { class: "num" }, dash(a.purchased_shares)),
      channels.map((name) => {
        const d = delivery[name];
        if (!d) return el("td", { class: "channel" }, "–");
        const text = d.recipients > 1 ? `${d.status} ${d.delivered}/${d.recipients}` : d.status;
        const cell = el("td", { class: "channel", "data-channel": name, title: d.reason || null }, badge(d.status, text));
        if (d.reason) cell.append(el("div", { class: "why" }, d.reason));
        return cell;
      }));
  });
  fill($("alerts").tBodies[0], rows, data.alerts ? "No alerts yet." : "Alerts unavailable (Redis did not answer).", 7 + channels.length);
}

function renderQueues(data) {
  $("vhost").textContent = data.vhost ? `vhost ${data.vhost}` : "";
  const rows = (data.queues || []).map((q) => el("tr", { "data-queue": q.name, class: q.name.includes("Dead_Letter") && q.messages ? "alarm" : null },
    el("td", { class: "mono" }, q.queues > 1 ? `${q.name} (${q.queues})` : q.name),
    el("td", { class: "num" }, q.ready), el("td", { class: "num" }, q.unacked), el("td", { class: "num" }, q.consumers),
    el("td", { class: "num" }, rate(q.publish_rate)), el("td", { class: "num" }, rate(q.deliver_rate)),
    el("td", { class: "num" }, rate(q.ack_rate))));
  fill($("queues").tBodies[0], rows, data.queues ? "No queues declared." : "Broker unavailable.", 7);
}

function renderChannels(data) {
  const rows = (data.channels || []).map((c) => el("tr", { "data-channel": c.name },
    el("td", { class: "mono" }, c.name), el("td", {}, c.kind), el("td", {}, c.delivery),
    el("td", { class: "num" }, c.recipients),
    el("td", { class: "num" }, dash(c.queued)), el("td", { class: c.parked ? "num bad" : "num" }, dash(c.parked)),
    el("td", { class: c.in_doubt ? "num warn in-doubt" : "num in-doubt",
               title: c.in_doubt ? "settle with `aldebaran delivery settle`" : null }, dash(c.in_doubt))));
  fill($("channels").tBodies[0], rows, "No channels configured.", 7);
}

function renderDeadLetters(data) {
  const dead = data.dead_letters;
  $("dead-note").textContent = dead && dead.note ? dead.note : "";
  const letters = dead ? [...dead.peek, ...dead.parked.map((p) => ({ ...p, message_id: p.alert_id }))] : [];
  const rows = letters.map((d) => el("tr", {},
    el("td", {}, el("span", { class: "reason" }, dash(d.reason))), el("td", { class: "mono" }, d.queue),
    el("td", { class: "mono" }, dash(d.message_id)), el("td", {}, el("code", { class: "body" }, d.body))));
  const empty = !dead ? "Broker unavailable." : dead.count ? `${dead.count} dead letters (not peeked).` : "No dead letters.";
  fill($("dead-letters").tBodies[0], rows, empty, 4);
}

function renderProblems(problems) {
  const box = $("problems");
  box.hidden = !problems.length;
  box.replaceChildren(...problems.map((p) => el("div", {}, p)));
}

function setStatus(ok, text) {
  const status = $("status");
  status.textContent = text;
  status.classList.toggle("down", !ok);
}

async function poll() {
  try {
    const token = sessionStorage.getItem(TOKEN_KEY);
    const response = await fetch("/api/dashboard", {
      headers: token ? { Authorization: `Bearer ${token}` } : {}, cache: "no-store",
    });
    if (response.status === 401) throw new Error("the API needs a token: open /#token=…");
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const data = await response.json();
    renderCards(data);
    renderAlerts(data);
    renderQueues(data);
    renderChannels(data);
    renderDeadLetters(data);
    renderProblems(data.problems || []);
    setStatus(!(data.problems || []).length, `live · updated ${time(data.generated_at)}`);
  } catch (err) {
    setStatus(false, `not updating: ${err.message}`);
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

poll();
