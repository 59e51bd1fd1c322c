// The penstock dashboard: no framework, nothing from another host. The token is kept in
// sessionStorage (this tab only) and sent as a Bearer token; the event stream is read with
// fetch() and a stream reader, since EventSource cannot send an Authorization header.
"use strict";
const KEY = "penstock-token";
const history = new Map(); // stream id -> last 60 lateness samples (ns)
const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const k of kids) e.append(k);
  return e;
}

function bytes(n) {
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return n.toFixed(i ? 1 : 0) + " " + u[i];
}

// The width through the CSSOM: the page's Content-Security-Policy refuses style attributes.
function bar(pct) {
  const f = el("div", { class: "fill" });
  f.style.width = pct.toFixed(1) + "%";
  return f;
}

function spark(id, samples) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("viewBox", "0 0 60 20");
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("role", "img");
  const last = samples.length ? samples[samples.length - 1] : 0;
  svg.setAttribute("aria-label", "stream " + id + " lateness p99, last " + (last / 1000).toFixed(0) + " µs");
  const max = Math.max(1, ...samples);
  const pts = samples.map((v, i) => (i + 60 - samples.length) + "," + (19 - 18 * v / max).toFixed(2)).join(" ");
  const line = document.createElementNS(ns, "polyline");
  line.setAttribute("points", pts);
  svg.dataset.samples = samples.join(",");
  svg.append(line);
  return svg;
}

function render(o) {
  const adm = $("admission");
  adm.replaceChildren();
  const names = { disk_ns_per_s: "disk time", net_bytes_per_s: "network", cpu_ns_per_s: "CPU", buffers: "buffers" };
  for (const [k, label] of Object.entries(names)) {
    const r = o.admission.resources[k];
    if (!r) continue;
    const pct = r.capacity ? Math.min(100, 100 * r.used / r.capacity) : 0;
    const fill = bar(pct);
    const track = el("div", { class: "track", role: "meter", "aria-label": label, "aria-valuemin": "0", "aria-valuemax": String(r.capacity), "aria-valuenow": String(r.used) }, fill);
    adm.append(el("div", { class: "bar" }, el("span", {}, label), track, el("span", {}, r.used + " of " + r.capacity + " (" + pct.toFixed(1) + "%)")));
  }
  for (const d of o.admission.devices) {
    const pct = d.capacity_ns_per_s ? Math.min(100, 100 * d.used_ns_per_s / d.capacity_ns_per_s) : 0;
    const fill = bar(pct);
    adm.append(el("div", { class: "bar" }, el("span", {}, "device " + d.device), el("div", { class: "track", role: "meter", "aria-label": "device " + d.device, "aria-valuemin": "0", "aria-valuemax": String(d.capacity_ns_per_s), "aria-valuenow": String(d.used_ns_per_s) }, fill), el("span", {}, pct.toFixed(1) + "%")));
  }
  const disk = $("disk");
  disk.replaceChildren(
    el("dt", {}, "rt queue"), el("dd", {}, String(o.admission.disk_queue.rt)),
    el("dt", {}, "bulk queue"), el("dd", {}, String(o.admission.disk_queue.bulk)),
    el("dt", {}, "workers"), el("dd", {}, o.admission.workers));
  const tb = $("streams").tBodies[0];
  tb.replaceChildren();
  const seen = new Set();
  for (const s of o.streams) {
    seen.add(s.id);
    const h = history.get(s.id) || [];
    if (s.lateness.recent_p99_ns !== undefined) { h.push(s.lateness.recent_p99_ns); if (h.length > 60) h.shift(); }
    history.set(s.id, h);
    const tr = el("tr", { "data-id": s.id }, el("td", {}, s.id), el("td", {}, s.state), el("td", {}, s.class), el("td", {}, bytes(s.sent)), el("td", {}, String(s.lateness.misses)), el("td", {}, spark(s.id, h)));
    tb.append(tr);
  }
  for (const id of [...history.keys()]) if (!seen.has(id)) history.delete(id);
  const sb = $("sessions").tBodies[0];
  sb.replaceChildren();
  for (const s of [...o.rtsp_sessions, ...o.hls_sessions]) {
    const kind = s.id.startsWith("rtsp-") ? "rtsp" : "hls";
    const b = el("button", { type: "button", "aria-label": "end session " + s.id }, "Kick");
    b.addEventListener("click", () => api("DELETE", "/api/v1/sessions/" + kind + "/" + encodeURIComponent(s.id)));
    sb.append(el("tr", {}, el("td", {}, s.id), el("td", {}, s.state), el("td", {}, s.path || s.scope || ""), el("td", {}, bytes(s.sent || 0)), el("td", {}, b)));
  }
  $("refusals").replaceChildren(...o.refusals.slice(0, 10).map((r) =>
    el("li", {}, new Date(r.unix_ms).toLocaleTimeString() + " " + r.verb + " " + r.code + ": " + r.text)));
  $("recordings").replaceChildren(...o.recordings.slice(0, 50).map((r) =>
    el("li", {}, r.path + " — " + bytes(r.bytes) + ", " + new Date(r.modified_unix_s * 1000).toLocaleString())));
}

function token() { return sessionStorage.getItem(KEY); }

async function api(method, path) {
  const r = await fetch(path, { method, headers: { Authorization: "Bearer " + token() } });
  return r.json();
}

async function events() {
  for (;;) {
    try {
      const r = await fetch("/api/v1/events", { headers: { Authorization: "Bearer " + token() } });
      if (r.status === 401) { signOut("wrong token"); return; }
      if (!r.ok) throw new Error("status " + r.status);
      $("status").textContent = "live";
      const reader = r.body.getReader();
      const dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, i);
          buf = buf.slice(i + 2);
          let name = "message", data = "";
          for (const line of block.split("\n")) {
            if (line.startsWith("event: ")) name = line.slice(7);
            else if (line.startsWith("data: ")) data += line.slice(6);
          }
          if (name === "overview" && data) render(JSON.parse(data));
        }
      }
    } catch (e) {
      $("status").textContent = "reconnecting (" + e.message + ")";
    }
    await new Promise((ok) => setTimeout(ok, 2000));
  }
}

function signOut(why) {
  sessionStorage.removeItem(KEY);
  $("board").hidden = true;
  $("login").hidden = false;
  $("status").textContent = why;
}

function start() {
  $("login").hidden = true;
  $("board").hidden = false;
  events();
}

document.addEventListener("DOMContentLoaded", () => {
  $("login").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem(KEY, $("token").value);
    $("token").value = "";
    start();
  });
  if (token()) start();
});
