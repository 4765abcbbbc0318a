// minipulsar live dashboard: reads snapshots from /dashboard/events (server-sent
// events, one message a second: {"time_ms", "clusters": [cluster snapshot]}), keeps the
// last HISTORY points of each series and draws them as SVG polylines (no library).
"use strict";

const HISTORY = 120;                       // points kept per series (2 minutes at 1/s)
const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#be185d", "#4d7c0f"];
const series = {"plot-rate-in": {}, "plot-rate-out": {}, "plot-lag": {}, "plot-repl-backlog": {}};
const colorOf = {};
const MOVED_SHOWN_MS = 60000;              // a bundle that moved stays highlighted this long
const lastOwner = {};                      // "cluster bundle" -> the broker that owned it last
const movedAt = {};                        // "cluster bundle" -> when it was seen on a new owner (ms)
let previous = null;                       // the last snapshot, to log what changed
let updates = 0;

function el(tag, attrs, ...children) {
  const e = document.createElementNS(tag === "svg" || attrs && attrs.svg ? "http://www.w3.org/2000/svg"
                                      : "http://www.w3.org/1999/xhtml", tag);
  for (const [k, v] of Object.entries(attrs || {})) if (k !== "svg") e.setAttribute(k, v);
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}
function svg(tag, attrs) { return el(tag, Object.assign({svg: true}, attrs)); }
function fmt(n) {
  if (n === null || n === undefined) return "-";
  if (Math.abs(n) >= 1e9) return (n / 1e9).toFixed(1) + "G";
  if (Math.abs(n) >= 1e6) return (n / 1e6).toFixed(1) + "M";
  if (Math.abs(n) >= 1e4) return (n / 1e3).toFixed(1) + "k";
  return Number.isInteger(n) ? String(n) : n.toFixed(n < 10 ? 2 : 1);
}
function color(key) {
  if (!(key in colorOf)) colorOf[key] = COLORS[Object.keys(colorOf).length % COLORS.length];
  return colorOf[key];
}

function push(plot, key, t, value) {
  const s = series[plot][key] || (series[plot][key] = []);
  s.push([t, value]);
  if (s.length > HISTORY) s.shift();
}

function drawPlot(id) {
  const root = document.getElementById(id);
  const W = root.clientWidth || 480, H = root.clientHeight || 170, L = 44, B = 16, T = 18;
  root.setAttribute("viewBox", `0 0 ${W} ${H}`);
  root.replaceChildren();
  const all = Object.entries(series[id]);
  const points = all.flatMap(([, s]) => s);
  if (!points.length) { root.append(svg("text", {x: L, y: H / 2})); root.lastChild.textContent = "no data yet"; return; }
  const t0 = Math.min(...points.map(p => p[0])), t1 = Math.max(...points.map(p => p[0]), t0 + 1);
  const vmax = (Math.max(0, ...points.map(p => p[1])) || 1) * 1.1;
  const x = t => L + (W - L - 6) * (t - t0) / (t1 - t0), y = v => H - B - (H - B - T) * v / vmax;
  root.append(svg("line", {class: "axis", x1: L, y1: H - B, x2: W - 6, y2: H - B}),
              svg("line", {class: "axis", x1: L, y1: T, x2: L, y2: H - B}));
  const labels = [[L - 4, T + 4, fmt(vmax), "end"], [L - 4, H - B, "0", "end"],
                  [W - 6, H - 3, `${Math.round((t1 - t0) / 1000)} s`, "end"]];
  for (const [lx, ly, text, anchor] of labels) {
    const tx = svg("text", {x: lx, y: ly, "text-anchor": anchor}); tx.textContent = text; root.append(tx);
  }
  let lx = L + 4, ly = 11;
  for (const [key, s] of all) {
    root.append(svg("polyline", {"data-series": key, "data-points": s.length, "data-last": s[s.length - 1][1],
                                 "data-max": Math.max(...s.map(p => p[1])), style: `stroke: ${color(key)}`,
                                 points: s.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" ")}));
    const label = `■ ${key} ${fmt(s[s.length - 1][1])}`, width = 14 + 6.2 * label.length;
    if (lx > L + 4 && lx + width > W) { lx = L + 4; ly += 12; }   // legend wraps instead of running off
    const tx = svg("text", {x: lx, y: ly, class: "legend", style: `fill: ${color(key)}`}); tx.textContent = label;
    root.append(tx); lx += width;
  }
}

function logEvent(text) {
  const ol = document.getElementById("events");
  ol.prepend(el("li", {}, `${new Date().toLocaleTimeString()} ${text}`));
  while (ol.children.length > 200) ol.lastChild.remove();
}

function diff(prev, snap) {
  if (!prev) return;
  const before = new Map(prev.clusters.map(c => [c.name, c]));
  for (const c of snap.clusters) {
    const p = before.get(c.name);
    if (!p) { logEvent(`cluster ${c.name} appeared`); continue; }
    const ps = new Map(p.brokers.map(b => [b.id, b]));
    for (const b of c.brokers) {
      const was = ps.get(b.id);
      if (!was) logEvent(`${c.name}: broker ${b.id} joined`);
      else if (was.status !== b.status) logEvent(`${c.name}: broker ${b.id} is ${b.status}`);
    }
  }
}

// Bundles owned now by another broker than the one that owned them last (in the same
// cluster: every cluster has the same bundle names), logged once; returns the keys
// ("cluster bundle") moved in the last MOVED_SHOWN_MS.
function trackOwners(snap) {
  const now = Date.now();
  for (const c of snap.clusters) for (const b of c.brokers) {
    if (b.status !== "up") continue;
    for (const bundle of Object.keys(b.bundles)) {
      const key = `${c.name} ${bundle}`, last = lastOwner[key];
      if (last && last !== b.id) {
        logEvent(`${c.name}: bundle ${bundle} moved ${last} → ${b.id}`);
        movedAt[key] = now;
      }
      lastOwner[key] = b.id;
    }
  }
  return new Set(Object.keys(movedAt).filter(k => now - movedAt[k] < MOVED_SHOWN_MS));
}

function render(snap) {
  updates += 1;
  const t = snap.time_ms;
  diff(previous, snap);
  const moved = trackOwners(snap);
  // cluster cards and their series
  const cards = document.getElementById("clusters");
  cards.replaceChildren();
  const pairs = {};
  for (const c of snap.clusters) {
    const up = c.brokers.filter(b => b.status === "up").length;
    const rin = c.topics.reduce((a, x) => a + x.msg_rate_in, 0), rout = c.topics.reduce((a, x) => a + x.msg_rate_out, 0);
    const msgs = c.topics.reduce((a, x) => a + x.msg_in, 0);
    cards.append(el("div", {class: "card", "data-cluster": c.name, "data-brokers-up": up, "data-msg-in": msgs},
      el("h3", {}, c.name + (c.error ? " (unreachable)" : "")),
      el("div", {}, el("span", {class: "num"}, `${up}/${c.brokers.length}`), " brokers up, ",
         el("span", {class: "num"}, c.topics.length), " topics"),
      el("div", {}, "in ", el("span", {class: "num"}, fmt(rin)), " msg/s · out ", el("span", {class: "num"}, fmt(rout)),
         " msg/s · ", el("span", {class: "num msg-in"}, fmt(msgs)), " published")));
    push("plot-rate-in", c.name, t, rin);
    push("plot-rate-out", c.name, t, rout);
    for (const topic of c.topics) for (const [remote, r] of Object.entries(topic.replication)) {
      const key = `${c.name} → ${remote}`;
      const p = pairs[key] || (pairs[key] = {lag: 0, backlog: 0});
      p.lag = Math.max(p.lag, r.delay_s); p.backlog += r.backlog;
    }
  }
  for (const [key, p] of Object.entries(pairs)) { push("plot-lag", key, t, p.lag); push("plot-repl-backlog", key, t, p.backlog); }
  for (const id of Object.keys(series)) drawPlot(id);
  // brokers with their bundles
  const brokers = document.querySelector("#brokers tbody");
  brokers.replaceChildren();
  for (const c of snap.clusters) for (const b of c.brokers) {
    const bundles = el("td", {class: "bundles"});
    for (const [bundle, n] of Object.entries(b.bundles).sort())
      bundles.append(el("span", {class: "bundle" + (moved.has(`${c.name} ${bundle}`) ? " moved" : ""), "data-bundle": bundle},
                        `${bundle} (${n})`));
    brokers.append(el("tr", {class: b.status + (b.leader ? " leader" : ""), "data-cluster": c.name, "data-broker": b.id,
                             "data-status": b.status, "data-bundles": Object.keys(b.bundles).length},
      el("td", {}, c.name), el("td", {}, b.id), el("td", {}, b.status), el("td", {class: "num"}, fmt(b.cpu)),
      el("td", {class: "num"}, fmt(b.msg_rate_in)), el("td", {class: "num"}, fmt(b.msg_rate_out)), bundles));
  }
  // topics
  const topics = document.querySelector("#topics tbody");
  topics.replaceChildren();
  const replicated = {};
  for (const c of snap.clusters) for (const x of c.topics) {
    const subs = Object.entries(x.subscriptions).map(([s, v]) => `${s}: ${fmt(v.backlog)}`).join(", ");
    const repl = Object.entries(x.replication).map(([r, v]) => `→${r}: ${fmt(v.backlog)}, ${fmt(v.delay_s)} s${v.connected ? "" : " (disconnected)"}`).join("; ");
    topics.append(el("tr", {"data-cluster": c.name, "data-topic": x.name, "data-msg-in": x.msg_in},
      el("td", {}, c.name), el("td", {}, x.name), el("td", {}, x.owner.replace(/^[a-z+]+:\/\//, "")),
      el("td", {class: "num"}, fmt(x.msg_rate_in)), el("td", {class: "num"}, fmt(x.msg_rate_out)),
      el("td", {class: "num"}, fmt(x.storage) + "B"), el("td", {}, subs || "-"), el("td", {}, repl || "-")));
    for (const [s, v] of Object.entries(x.subscriptions)) if (v.replicated) {
      const key = `${x.name} · ${s}`;
      (replicated[key] || (replicated[key] = {}))[c.name] = v;
    }
  }
  // replicated subscriptions: one column per cluster
  const names = snap.clusters.map(c => c.name);
  const table = document.getElementById("replicated");
  table.tHead.replaceChildren(el("tr", {}, el("th", {}, "topic · subscription"), ...names.map(n => el("th", {}, n))));
  const body = table.tBodies[0];
  body.replaceChildren();
  for (const [key, per] of Object.entries(replicated).sort())
    body.append(el("tr", {"data-subscription": key}, el("td", {}, key),
      ...names.map(n => el("td", {}, per[n] ? `mark-delete ${per[n].mark_delete} · backlog ${fmt(per[n].backlog)}` : "-"))));
  const updated = document.getElementById("updated");
  updated.textContent = `updated ${new Date(t).toLocaleTimeString()}`;
  updated.dataset.updates = updates;
  updated.dataset.timeMs = t;
  previous = snap;
}

function connect() {
  const status = document.getElementById("status");
  const source = new EventSource("/dashboard/events" + location.search);
  source.onopen = () => { status.textContent = "live"; status.className = "status live"; };
  source.onerror = () => { status.textContent = "reconnecting…"; status.className = "status lost"; };
  source.onmessage = (event) => {
    const snap = JSON.parse(event.data);
    if (snap.error) { status.textContent = snap.error; status.className = "status lost"; return; }
    render(snap);
  };
}
connect();
