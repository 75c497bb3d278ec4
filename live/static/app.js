// fabriclab live: draws the fabric in SVG, follows the server's event stream, sends controls.
// Plain JavaScript, no libraries: the page must work with nothing but this server.
"use strict";

const SVGNS = "http://www.w3.org/2000/svg";
const W = 1000;             // fabric drawing width in SVG units
const TIER_GAP = 130;       // vertical distance between tiers
const CHART_WINDOW_S = 180; // the charts show at most the last three minutes

const live = {
  layout: null, msg: null, series: [], events: new Map(), selected: null,
  links: new Map(),          // name -> {g, ab, ba, halo, mark, lower, upper}
  updates: 0, lastLagMs: null, pending: false,
};
window.fabriclabLive = live; // for tests and the curious: numbers behind what is drawn

function el(tag, attrs = {}, parent = null, ns = SVGNS) {
  const e = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (parent) parent.appendChild(e);
  return e;
}
const $ = (id) => document.getElementById(id);

function utilColour(u) {
  if (u < 0.01) return "#c9cfd9";
  const hue = 120 * (1 - Math.min(u, 1));
  return `hsl(${hue.toFixed(0)} 70% 42%)`;
}
const utilWidth = (u) => 1.5 + 7 * Math.min(u, 1.2);
const pct = (u) => `${(100 * u).toFixed(0)} %`;
function fmtBps(b) {
  if (b >= 1e9) return `${(b / 1e9).toFixed(2)} Gb/s`;
  return `${(b / 1e6).toFixed(1)} Mb/s`;
}
function fmtTime(t) {
  return new Date(t * 1000).toLocaleTimeString([], { hour12: false });
}

// ---------------------------------------------------------------------------------------------
// The fabric drawing

function drawFabric(layout) {
  const svg = $("fabric");
  svg.replaceChildren();
  const tiers = layout.tiers; // top tier first
  const H = 40 + TIER_GAP * (tiers.length - 1) + 40;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const pos = {};
  tiers.forEach((tier, ti) => {
    const y = 30 + ti * TIER_GAP;
    const n = tier.nodes.length;
    const left = 70, span = W - left - 20;
    tier.nodes.forEach((name, i) => { pos[name] = { x: left + span * (i + 0.5) / n, y }; });
    el("text", { x: 6, y, class: "tier-label", "dominant-baseline": "central" }, svg).textContent = tier.name;
  });
  const linkLayer = el("g", {}, svg);
  const nodeLayer = el("g", {}, svg);
  for (const lk of layout.links) {
    let lower = lk.a, upper = lk.b;
    if (pos[lk.a].y < pos[lk.b].y) { lower = lk.b; upper = lk.a; }
    const p = pos[lower], q = pos[upper];
    const dx = q.x - p.x, dy = q.y - p.y, len = Math.hypot(dx, dy) || 1;
    const nx = -dy / len * 2.6, ny = dx / len * 2.6; // offset between the two directions
    const g = el("g", { class: "link", "data-link": lk.name }, linkLayer);
    const title = el("title", {}, g);
    const halo = el("line", { class: "halo", x1: p.x, y1: p.y, x2: q.x, y2: q.y, "stroke-width": 16 }, g);
    // "up" = lower -> upper, drawn on the left of the line as seen going up.
    const up = el("line", { class: "dir up", x1: p.x - nx, y1: p.y - ny, x2: q.x - nx, y2: q.y - ny }, g);
    const down = el("line", { class: "dir down", x1: p.x + nx, y1: p.y + ny, x2: q.x + nx, y2: q.y + ny }, g);
    el("line", { class: "hit", x1: p.x, y1: p.y, x2: q.x, y2: q.y }, g);
    const mark = el("text", { class: "mark", x: (p.x + q.x) / 2 + 10, y: (p.y + q.y) / 2 }, g);
    g.addEventListener("click", () => onLinkClick(lk.name));
    live.links.set(lk.name, { g, title, halo, up, down, mark, lower, upper, a: lk.a, b: lk.b });
  }
  for (const [name, p] of Object.entries(pos)) {
    const node = layout.nodes[name];
    const g = el("g", { class: "node" + (node.host ? " host" : ""), "data-node": name }, nodeLayer);
    const w = node.host ? 44 : 64, h = node.host ? 20 : 26;
    el("rect", { x: p.x - w / 2, y: p.y - h / 2, width: w, height: h, rx: 5 }, g);
    el("text", { x: p.x, y: p.y }, g).textContent = name;
    el("title", {}, g).textContent = node.ip ? `${name} (${node.role}) ${node.ip}` : `${name} (${node.role})`;
  }
}

function paintLinks(links) {
  for (const lk of links) {
    const v = live.links.get(lk.name);
    if (!v) continue;
    // util_ab is a -> b; map to up/down of the drawing.
    const upIsAb = v.lower === lk.a;
    const uUp = upIsAb ? lk.util_ab : lk.util_ba, uDown = upIsAb ? lk.util_ba : lk.util_ab;
    const hotUp = upIsAb ? lk.hot_ab : lk.hot_ba, hotDown = upIsAb ? lk.hot_ba : lk.hot_ab;
    v.up.setAttribute("stroke", utilColour(uUp));
    v.up.setAttribute("stroke-width", utilWidth(uUp));
    v.down.setAttribute("stroke", utilColour(uDown));
    v.down.setAttribute("stroke-width", utilWidth(uDown));
    v.g.classList.toggle("down", !lk.up);
    v.g.classList.toggle("hot", hotUp || hotDown);
    v.g.dataset.util = Math.max(uUp, uDown).toFixed(4);
    v.g.dataset.up = lk.up ? "1" : "0";
    let mark = "", cls = "mark";
    if (!lk.up) { mark = "✕ cut"; cls += " cut"; }
    else if (hotUp || hotDown) { mark = "hot"; cls += " hot"; }
    if (lk.loss_pct > 0) { mark += (mark ? " · " : "") + `${lk.loss_pct} % loss`; if (lk.up && !(hotUp || hotDown)) cls += " loss"; }
    v.mark.textContent = mark;
    v.mark.setAttribute("class", cls);
    v.title.textContent = `${lk.name} (${lk.rate_mbps} Mb/s)${lk.up ? "" : " — CUT"}\n` +
      `${v.lower} → ${v.upper}: ${pct(uUp)}${hotUp ? " (hot)" : ""}\n` +
      `${v.upper} → ${v.lower}: ${pct(uDown)}${hotDown ? " (hot)" : ""}` +
      (lk.loss_pct > 0 ? `\nloss ${lk.loss_pct} %` : "") + "\nclick to " + (lk.up ? "cut" : "restore");
  }
  if (live.selected) showLinkPanel(live.selected);
}

// ---------------------------------------------------------------------------------------------
// Charts: hand-drawn SVG polylines with event markers

function drawChart(svgId, key, scale, fmt) {
  const svg = $(svgId);
  const box = svg.getBoundingClientRect();
  const w = Math.max(200, box.width), h = 84, padL = 34, padR = 6, padT = 6, padB = 14;
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  svg.replaceChildren();
  const now = live.msg ? live.msg.t_server : Date.now() / 1000;
  // The window grows with the run, from 30 s to three minutes, so a young run is not a sliver.
  const span = live.series.length ? Math.min(CHART_WINDOW_S, Math.max(30, now - live.series[0].t)) : 30;
  const t0 = now - span;
  const pts = live.series.filter((p) => p.t >= t0);
  let ymax = Math.max(...pts.map((p) => p[key] * scale), 0);
  ymax = key === "imbalance" ? Math.max(2, Math.ceil(ymax * 2) / 2) : Math.max(1, niceCeil(ymax));
  const X = (t) => padL + (w - padL - padR) * (t - t0) / span;
  const Y = (v) => h - padB - (h - padT - padB) * v / ymax;
  for (const v of [0, ymax / 2, ymax]) {
    el("line", { class: "grid", x1: padL, x2: w - padR, y1: Y(v), y2: Y(v) }, svg);
    el("text", { class: "axis", x: padL - 4, y: Y(v) + 3, "text-anchor": "end" }, svg).textContent = fmt(v);
  }
  el("text", { class: "axis", x: padL, y: h - 2 }, svg).textContent = span >= 120 ? `−${Math.round(span / 60)} min` : `−${Math.round(span)} s`;
  el("text", { class: "axis", x: w - padR, y: h - 2, "text-anchor": "end" }, svg).textContent = "now";
  for (const ev of live.events.values()) {
    if (ev.t < t0 || ev.kind === "info") continue;
    const x = X(ev.t);
    const g = el("g", { class: `ev-${ev.kind}` }, svg);
    el("line", { class: "ev", x1: x, x2: x, y1: padT, y2: h - padB }, g);
    el("text", { class: "ev-label", x: x + 2, y: padT + 8 }, g).textContent = EVENT_GLYPH[ev.kind] || "•";
    el("title", {}, g).textContent = `${fmtTime(ev.t)} ${ev.text}`;
  }
  if (pts.length > 1) {
    const d = pts.map((p) => `${X(p.t).toFixed(1)},${Y(p[key] * scale).toFixed(1)}`).join(" ");
    el("polyline", { class: "line", points: d }, svg);
  }
}
const EVENT_GLYPH = { mode: "R", policy: "P", link_down: "✕", link_up: "↺", loss: "L", workload: "!", controller: "!" };
function niceCeil(v) {
  if (v <= 0) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}
function drawCharts() {
  drawChart("c-goodput", "goodput_bps", 1e-6, (v) => v.toFixed(v < 10 ? 1 : 0));
  drawChart("c-imbalance", "imbalance", 1, (v) => v.toFixed(1));
  drawChart("c-hot", "hot", 1, (v) => v.toFixed(0));
}

// ---------------------------------------------------------------------------------------------
// Applying messages

function onMessage(msg) {
  live.msg = msg;
  live.updates += 1;
  if (msg.type === "snapshot") {
    live.series = msg.series || [];
    live.events = new Map();
  } else if (msg.point && (!live.series.length || msg.point.t > live.series[live.series.length - 1].t)) {
    live.series.push(msg.point);
    if (live.series.length > 1200) live.series.splice(0, live.series.length - 1200);
  }
  for (const ev of msg.events || []) live.events.set(ev.id, ev);
  if (msg.t_sample) live.lastLagMs = Math.max(0, Date.now() - msg.t_sample * 1000);
  if (!live.pending) { live.pending = true; requestAnimationFrame(render); }
}

function render() {
  live.pending = false;
  const msg = live.msg;
  if (!msg) return;
  renderStatus(msg);
  renderButtons(msg);
  if (msg.links && msg.samples) paintLinks(msg.links);
  renderMetrics(msg.metrics);
  drawCharts();
  renderPlacement(msg.placement);
  renderEvents();
}

function setPill(id, text, cls) {
  const p = $(id);
  p.textContent = text;
  p.className = "pill " + (cls || "");
}

function renderStatus(msg) {
  const phaseText = { starting: "bringing the fabric up…", running: "running", failed: "failed",
                      stopping: "shutting down…", stopped: "stopped" }[msg.phase] || msg.phase;
  setPill("phase", `${phaseText} · ${msg.mode} / ${policyLabel(msg.policy)}`,
          msg.phase === "running" ? "ok" : msg.phase === "failed" ? "bad" : "warn");
  const ctl = msg.controller === "ok" ? ["controller ok", "ok"] : msg.controller === "lost"
    ? ["controller lost", "bad"] : ["controller: waiting", ""];
  setPill("controller", ctl[0], ctl[1]);
  const wl = msg.workload || {};
  const dead = (wl.processes || 0) - (wl.alive || 0);
  setPill("workload", `${wl.kind || "workload"}: ${wl.alive || 0}/${wl.processes || 0} processes`,
          msg.phase !== "running" ? "" : dead > 0 ? "bad" : "ok");
  const lagPill = $("lag");
  if (live.lastLagMs !== null) lagPill.textContent = `numbers ${(live.lastLagMs / 1000).toFixed(1)} s old`;
  const banner = $("banner");
  let text = "", cls = "banner";
  if (msg.phase === "starting") { text = "Bringing the fabric up and starting the traffic…"; cls += " info"; }
  else if (msg.phase === "failed") text = `The fabric failed to come up: ${msg.error}`;
  else if (msg.phase === "stopping" || msg.phase === "stopped") { text = "The live view is shutting down; the fabric is being torn down."; cls += " info"; }
  else if (msg.controller === "lost") text = `Controller lost — showing the last numbers (${msg.controller_detail})`;
  else if (dead > 0) { text = `Workload: ${dead} of ${wl.processes} processes exited — ${(wl.exited || [])[0] || ""}`; cls += " warn"; }
  banner.hidden = !text;
  banner.textContent = text;
  banner.className = cls;
  $("topo-name").textContent = msg.topology || "";
  const hint = $("hint");
  const h = msg.mode === "spray" && msg.policy === "single"
    ? "Routing spray with path policy single: every flow has one source port, so its packets all take the same uplink. Set the policy to spray to spread them."
    : "";
  hint.hidden = !h;
  hint.textContent = h;
}

// A user's own policy (`fabriclab live --path-policy FILE.py:CLASS`) is shown by its class name.
function policyLabel(policy) {
  return String(policy || "").includes(".py:") ? policy.split(":").pop() : policy;
}

// The page offers every policy the server does: the built-ins are in the HTML, a user's own is added.
function addPolicyButtons(policies) {
  const group = document.querySelector("[data-policy]").parentElement;
  for (const p of policies || []) {
    if ([...group.querySelectorAll("[data-policy]")].some((b) => b.dataset.policy === p)) continue;
    const b = document.createElement("button");
    b.type = "button";
    b.dataset.policy = p;
    b.textContent = policyLabel(p);
    b.title = `your own path policy, ${p}`;
    b.addEventListener("click", () => withButtons(() => post("policy", { policy: p })));
    group.appendChild(b);
  }
}

function renderButtons(msg) {
  addPolicyButtons(msg.policies);
  for (const b of document.querySelectorAll("[data-mode]")) b.classList.toggle("active", b.dataset.mode === msg.mode);
  for (const b of document.querySelectorAll("[data-policy]")) b.classList.toggle("active", b.dataset.policy === msg.policy);
}

function renderMetrics(m) {
  if (!m) return;
  $("m-goodput").textContent = fmtBps(m.goodput_bps);
  const imb = $("m-imbalance");
  imb.textContent = m.imbalance.toFixed(2);
  imb.dataset.value = m.imbalance;
  $("m-hot").textContent = m.hot_count;
  $("hot-list").textContent = m.hot.length ? "hot: " + m.hot.map((h) => h.label).join(", ") : "";
}

function renderPlacement(p) {
  if (!p) return;
  $("win").textContent = p.window_s;
  const ub = $("uplinks").querySelector("tbody");
  ub.replaceChildren();
  for (const r of p.uplinks) {
    const tr = el("tr", {}, ub, null);
    el("td", {}, tr, null).textContent = r.label;
    const td = el("td", { class: "num" }, tr, null);
    const bar = el("span", { class: "bar" }, td, null);
    bar.style.width = `${Math.min(60, 60 * r.util).toFixed(0)}px`;
    bar.style.background = utilColour(r.util);
    td.appendChild(document.createTextNode(pct(r.util)));
    el("td", { class: "num" }, tr, null).textContent = (r.bytes / 1e6).toFixed(1);
    const f = el("td", {}, tr, null);
    f.textContent = r.flows.join(", ") || "—";
    if (r.ambiguous) el("span", { class: "tag ambiguous" }, f, null).textContent = " some could be elsewhere";
  }
  const fb = $("flows").querySelector("tbody");
  fb.replaceChildren();
  for (const f of p.flows) {
    const tr = el("tr", {}, fb, null);
    el("td", {}, tr, null).textContent = `${f.src} → ${f.dst}`;
    el("td", {}, tr, null).textContent = f.src_edge;
    el("td", {}, tr, null).textContent = f.carrying.length ? "via " + f.carrying.join(", ") : "no path carries bytes";
    const t = el("td", {}, tr, null);
    if (f.carrying.length) {
      const tag = el("span", { class: "tag " + (f.certain ? "certain" : "ambiguous") }, t, null);
      tag.textContent = f.certain ? "certain" : `one or more of ${f.carrying.length} of ${f.paths.length}`;
    }
  }
}

function renderEvents() {
  const ol = $("events");
  const evs = [...live.events.values()].sort((a, b) => b.id - a.id).slice(0, 100);
  ol.replaceChildren();
  for (const ev of evs) {
    const li = el("li", { class: `ev-${ev.kind}` }, ol, null);
    el("time", {}, li, null).textContent = fmtTime(ev.t);
    el("span", { class: "kind" }, li, null).textContent = ev.kind.replace("_", " ");
    li.appendChild(document.createTextNode(ev.text));
  }
}

// ---------------------------------------------------------------------------------------------
// Controls

let toastTimer = null;
function toast(text, isError) {
  const t = $("toast");
  t.textContent = text;
  t.className = "toast" + (isError ? " error" : "");
  t.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { t.hidden = true; }, isError ? 8000 : 3000);
}

async function post(kind, body) {
  let resp;
  try {
    resp = await fetch(`/api/${kind}`, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    });
  } catch (e) {
    toast(`Could not reach the live view: ${e}`, true);
    return null;
  }
  let data = {};
  try { data = await resp.json(); } catch (e) { /* an empty or non-JSON answer */ }
  if (!resp.ok) {
    toast(data.error || `HTTP ${resp.status}`, true);
    return null;
  }
  toast(`Done: ${data.applied}`, false);
  return data;
}

async function withButtons(fn) {
  const buttons = document.querySelectorAll(".controls button, .link-panel button");
  buttons.forEach((b) => { b.disabled = true; });
  try { return await fn(); } finally { buttons.forEach((b) => { b.disabled = false; }); }
}

function onLinkClick(name) {
  live.selected = name;
  for (const [n, v] of live.links) v.g.classList.toggle("selected", n === name);
  const lk = currentLink(name);
  showLinkPanel(name);
  if (lk) withButtons(() => post("link", { link: name, up: !lk.up }));
}

function currentLink(name) {
  return live.msg && live.msg.links ? live.msg.links.find((l) => l.name === name) : null;
}

function showLinkPanel(name) {
  const lk = currentLink(name);
  if (!lk) return;
  $("link-panel").hidden = false;
  $("lp-name").textContent = lk.name;
  $("lp-state").textContent = lk.up ? "up" : "cut";
  $("lp-util").textContent = `${lk.a} → ${lk.b} ${pct(lk.util_ab)}, ${lk.b} → ${lk.a} ${pct(lk.util_ba)}` +
    (lk.loss_pct > 0 ? `, loss ${lk.loss_pct} %` : "");
  $("lp-toggle").textContent = lk.up ? "Cut" : "Restore";
}

function wire() {
  for (const b of document.querySelectorAll("[data-mode]")) {
    b.addEventListener("click", () => withButtons(() => post("mode", { mode: b.dataset.mode })));
  }
  for (const b of document.querySelectorAll("[data-policy]")) {
    b.addEventListener("click", () => withButtons(() => post("policy", { policy: b.dataset.policy })));
  }
  for (const b of document.querySelectorAll("[data-preset]")) {
    b.addEventListener("click", () => withButtons(async () => {
      const [mode, policy] = b.dataset.preset === "spray" ? ["spray", "spray"] : ["ecmp", "single"];
      if (live.msg && live.msg.policy !== policy && !(await post("policy", { policy }))) return;
      if (live.msg && live.msg.mode !== mode) await post("mode", { mode });
    }));
  }
  $("lp-toggle").addEventListener("click", () => {
    const lk = currentLink(live.selected);
    if (lk) withButtons(() => post("link", { link: lk.name, up: !lk.up }));
  });
  $("lp-loss-set").addEventListener("click", () => {
    const v = $("lp-loss").value.trim();
    const n = Number(v);
    if (v === "" || !Number.isFinite(n)) { toast("Loss must be a number of percent, 0-100", true); return; }
    // Out-of-range values go to the server too: it explains what is allowed.
    withButtons(() => post("loss", { link: live.selected, loss_pct: n }));
  });
  window.addEventListener("resize", () => drawCharts());
}

function connect() {
  const es = new EventSource("/api/stream");
  es.onmessage = (e) => onMessage(JSON.parse(e.data));
  es.addEventListener("end", () => {
    es.close();
    const banner = $("banner");
    banner.hidden = false;
    banner.className = "banner info";
    banner.textContent = "The live view has stopped (fabric torn down). Start `fabriclab live` again to continue.";
    setPill("phase", "stopped", "");
  });
  es.onerror = () => {
    if (es.readyState === EventSource.CLOSED) return;
    setPill("phase", "connection lost — retrying…", "bad");
  };
}

async function main() {
  wire();
  const resp = await fetch("/api/topology");
  live.layout = await resp.json();
  drawFabric(live.layout);
  connect();
}

main().catch((e) => toast(`The page failed to start: ${e}`, true));
