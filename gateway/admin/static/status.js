// The tierstore status page (docs/status-page.md): polls the admin API with
// the admin token and draws what it answers. No dependencies, no build step:
// the charts are inline SVG. Everything the API says is put in the page as
// text (textContent), never as HTML.
"use strict";

const REFRESH_MS = 2000; // one poll of the routes that change quickly
const SLOW_EVERY = 5; // buckets and mounts: every 5th poll
const HISTORY = 150; // samples kept for the charts: 5 minutes
const FINISHED_SHOWN = 5; // ended jobs and epochs listed after the running ones
const TOKEN_KEY = "tierstore-admin-token";
const SVG_NS = "http://www.w3.org/2000/svg";
const UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

const $ = (id) => document.getElementById(id);

let token = null;
let timer = null; // the next poll, while one is scheduled
let polling = false; // a poll is in flight
let polls = 0;
let slow = { buckets: [], mounts: [] };
let previous = null; // the last /stats sample, for rates
let samples = []; // one per poll: hit ratio and rates over the last interval
let epochsSeen = new Map(); // epoch id -> first {t, consumed} seen, for its ETA

class Refused extends Error {}

// -- token ---------------------------------------------------------------

function takeToken() {
  const fragment = new URLSearchParams(location.hash.slice(1));
  const given = fragment.get("token");
  if (given) {
    sessionStorage.setItem(TOKEN_KEY, given);
    // Out of the address bar, the tab's history and any bookmark.
    history.replaceState(null, "", location.pathname + location.search);
  }
  return sessionStorage.getItem(TOKEN_KEY);
}

function askToken(error) {
  token = null;
  sessionStorage.removeItem(TOKEN_KEY);
  clearTimeout(timer);
  timer = null;
  forget();
  $("dashboard").hidden = true;
  $("login").hidden = false;
  $("login-error").hidden = !error;
  $("login-error").textContent = error || "";
  setState("locked", "token needed");
  $("token").focus();
}

function forget() {
  previous = null;
  samples = [];
  epochsSeen = new Map();
  slow = { buckets: [], mounts: [] };
  polls = 0;
  for (const id of ["jobs", "epochs", "buckets", "requests", "hot-legend", "capacity-facts"]) {
    $(id).replaceChildren();
  }
}

// -- polling ---------------------------------------------------------------

async function get(path) {
  // Relative: the API is wherever this page is (behind a path prefix too).
  const response = await fetch(path, {
    headers: { Authorization: `Bearer ${token}` },
    cache: "no-store",
  });
  if (response.status === 401) throw new Refused(await errorOf(response));
  if (!response.ok) throw new Error(await errorOf(response));
  return response.json();
}

async function errorOf(response) {
  try {
    const { error } = await response.json();
    return `${error.code}: ${error.message}`;
  } catch {
    return `HTTP ${response.status}`;
  }
}

async function poll() {
  timer = null;
  if (polling || !token) return;
  polling = true;
  try {
    const all = polls % SLOW_EVERY === 0;
    const [tiers, stats, jobs, epochs, buckets, mounts] = await Promise.all([
      get("tiers"), get("stats"), get("jobs"), get("epochs"),
      all ? get("buckets") : null, all ? get("mounts") : null,
    ]);
    if (!token) return; // refused meanwhile
    polls += 1;
    if (buckets && mounts) slow = { buckets: buckets.buckets, mounts: mounts.mounts };
    draw(tiers, stats, jobs.jobs, epochs.epochs);
    $("login").hidden = true;
    $("dashboard").hidden = false;
    setState("live", `live · ${new Date().toLocaleTimeString()}`);
  } catch (error) {
    if (error instanceof Refused) {
      askToken(`The gateway refused this token (${error.message}).`);
      return;
    }
    setState("error", `no answer from the gateway: ${error.message}`);
  } finally {
    polling = false;
  }
  schedule();
}

function schedule() {
  if (token && timer === null && document.visibilityState === "visible") {
    timer = setTimeout(poll, REFRESH_MS);
  }
}

function setState(kind, text) {
  const state = $("state");
  state.className = `state ${kind}`;
  state.textContent = text;
}

document.addEventListener("visibilitychange", () => {
  if (!token) return;
  if (document.visibilityState === "visible") {
    if (timer === null) poll();
  } else {
    clearTimeout(timer);
    timer = null;
    setState("paused", "paused while hidden");
  }
});

document.addEventListener("DOMContentLoaded", () => {
  $("login").addEventListener("submit", (event) => {
    event.preventDefault();
    const given = $("token").value.trim();
    if (!given) return;
    $("token").value = "";
    sessionStorage.setItem(TOKEN_KEY, given);
    token = given;
    $("login-error").hidden = true;
    setState("loading", "loading");
    poll();
  });
  token = takeToken();
  if (token) poll();
  else askToken(null);
});

// -- formatting --------------------------------------------------------------

function size(bytes) {
  if (typeof bytes !== "number") return "–";
  let value = bytes;
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < UNITS.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${Math.round(value)} B` : `${value.toFixed(1)} ${UNITS[unit]}`;
}

const rate = (bytes) => (typeof bytes === "number" ? `${size(bytes)}/s` : "–");
const percent = (x) => (typeof x === "number" ? `${(100 * x).toFixed(1)} %` : "–");
const count = (n) => (typeof n === "number" ? n.toLocaleString("en") : "–");
const perSecond = (n) => (typeof n === "number" ? n.toFixed(n < 10 ? 1 : 0) : "–");

function duration(seconds) {
  if (typeof seconds !== "number" || !isFinite(seconds)) return "–";
  const s = Math.max(0, Math.round(seconds));
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const mmss = `${String(m).padStart(h ? 2 : 1, "0")}:${String(s % 60).padStart(2, "0")}`;
  return h ? `${h}:${mmss}` : mmss;
}

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = text;
  if (className) node.className = className;
  return node;
}

function row(cells) {
  const tr = el("tr");
  for (const cell of cells) {
    if (cell instanceof Node) {
      const td = el("td");
      td.append(cell);
      tr.append(td);
    } else {
      const [text, className] = Array.isArray(cell) ? cell : [cell];
      tr.append(el("td", text, className));
    }
  }
  return tr;
}

function empty(tbody, columns, text) {
  const td = el("td", text, "none");
  td.colSpan = columns;
  const tr = el("tr");
  tr.append(td);
  tbody.replaceChildren(tr);
}

// A bar for a fraction (0..1), or an unknown one (null): role=progressbar
// with aria-valuenow in percent, which is what assistive tools (and the
// browser test) read.
function progressBar(fraction, label, state) {
  const bar = el("div", null, `progress ${state || ""}`);
  bar.setAttribute("role", "progressbar");
  bar.setAttribute("aria-valuemin", "0");
  bar.setAttribute("aria-valuemax", "100");
  const fill = el("div", null, "fill");
  if (typeof fraction === "number") {
    const pct = Math.max(0, Math.min(100, 100 * fraction));
    bar.setAttribute("aria-valuenow", pct.toFixed(1));
    fill.style.width = `${pct}%`;
  } else {
    bar.classList.add("unknown");
  }
  bar.append(fill, el("span", label, "label"));
  return bar;
}

// -- drawing -----------------------------------------------------------------

function draw(tiers, stats, jobs, epochs) {
  sample(stats);
  $("gateway").textContent = `up ${duration(stats.uptime_s)}`;
  drawHot(tiers);
  drawTraffic(stats);
  drawMemory(stats.memory);
  drawCapacity(tiers);
  drawRequests(stats.requests || {});
  drawJobs(jobs);
  drawEpochs(epochs, stats.uptime_s);
  drawBuckets(slow.buckets, slow.mounts);
}

function sample(stats) {
  const served = stats.served || {};
  const requests = (stats.capacity && stats.capacity.requests) || {};
  const now = {
    t: stats.uptime_s,
    hotObjects: (served.hot || {}).objects || 0,
    capacityObjects: (served.capacity || {}).objects || 0,
    hotBytes: (served.hot || {}).bytes || 0,
    capacityBytes: (served.capacity || {}).bytes || 0,
    gets: requests.gets || 0,
    puts: requests.puts || 0,
    other: (requests.heads || 0) + (requests.deletes || 0) + (requests.lists || 0),
  };
  if (previous && now.t < previous.t) samples = []; // the gateway restarted
  if (previous && now.t > previous.t) {
    const dt = now.t - previous.t;
    const hits = now.hotObjects - previous.hotObjects;
    const reads = hits + now.capacityObjects - previous.capacityObjects;
    samples.push({
      hit: reads > 0 ? hits / reads : null,
      hot: (now.hotBytes - previous.hotBytes) / dt,
      capacity: (now.capacityBytes - previous.capacityBytes) / dt,
      gets: (now.gets - previous.gets) / dt,
      puts: (now.puts - previous.puts) / dt,
      other: (now.other - previous.other) / dt,
    });
    if (samples.length > HISTORY) samples.shift();
  }
  previous = now;
}

function drawHot(t) {
  const budget = t.hot_budget || 1;
  const pinned = t.hot_pinned || 0;
  const parts = [
    ["staged", t.hot_staged, "not yet in the capacity store"],
    ["clean", Math.max(0, t.hot_cached - pinned), "cached, evictable"],
    ["pinned", pinned, "cached, never evicted"],
    ["reserved", t.hot_reserved, "promised to writes in progress"],
    ["free", Math.max(0, t.hot_budget - t.hot_used), ""],
  ];
  const bar = $("hot-bar");
  bar.querySelectorAll(".part").forEach((node) => node.remove());
  const legend = [];
  for (const [name, bytes, meaning] of parts) {
    const part = el("div", null, `part ${name}`);
    part.style.width = `${(100 * (bytes || 0)) / budget}%`;
    part.title = `${name}: ${size(bytes)}${meaning ? ` (${meaning})` : ""}`;
    bar.append(part);
    const item = el("li", null, name);
    item.append(el("b", size(bytes)), ` ${name}`);
    legend.push(item);
  }
  $("high-mark").style.left = `${(100 * t.high_watermark) / budget}%`;
  $("low-mark").style.left = `${(100 * t.low_watermark) / budget}%`;
  const marks = el("li", null, "marks");
  marks.textContent =
    `watermarks: low ${size(t.low_watermark)}, high ${size(t.high_watermark)}` +
    ` · evicted ${size(t.evicted)} since start`;
  legend.push(marks);
  $("hot-legend").replaceChildren(...legend);
  $("hot-summary").textContent =
    `${size(t.hot_used)} of ${size(t.hot_budget)} (${percent(t.hot_used / budget)})`;
  drawDisk(t.disk);
}

// The filesystem against the free-space floor (docs/operations.md#a-full-disk).
function drawDisk(d) {
  if (!d) return;
  const refused = Object.entries(d.refusals || {}).filter(([, n]) => n)
    .map(([cause, n]) => `${cause} ${count(n)}`);
  $("hot-disk").textContent =
    `disk: ${size(d.free)} free of ${size(d.size)}, floor ${size(d.floor)}` +
    ` · index reserve ${size(d.reserve)} ${d.reserve_held ? "held" : "given to the index"}` +
    ` · writes refused: ${refused.length ? refused.join(", ") : "none"}` +
    ` · fills skipped ${count(d.fills_skipped)}`;
  const warnings = [];
  if (d.free < d.floor) warnings.push("free space is below the floor: evicting, and refusing writes that do not fit");
  if (!d.index_writable) warnings.push("the index is read-only until the disk has room");
  if (d.warning) warnings.push(d.warning);
  const warning = $("hot-disk-warning");
  warning.textContent = warnings.join(" · ");
  warning.hidden = !warnings.length;
}

// The process's RSS against its memory budget, and its caches (docs/operations.md#memory).
function drawMemory(m) {
  if (!m) return;
  const caches = Object.values(m.caches || {});
  const held = caches.reduce((sum, c) => sum + (c.bytes || 0), 0);
  const bound = caches.reduce((sum, c) => sum + (c.bound || 0), 0);
  $("memory").textContent =
    `memory: RSS ${size(m.rss)}` + (m.limit ? ` of a ${size(m.limit)} budget (${percent(m.rss / m.limit)})` : ", no budget") +
    ` · peak ${size(m.peak_rss)} · caches ${size(held)} of ${size(bound)}` +
    ` · refused for memory: ${count(m.refused)}`;
  const warning = $("memory-warning");
  warning.textContent = m.refusing
    ? "at the memory budget: new S3 requests get 503 SlowDown, caches are shrunk"
    : m.squeeze < 1 ? `near the memory budget: caches shrunk to ${percent(m.squeeze)} of their bounds` : "";
  warning.hidden = !warning.textContent;
}

function drawTraffic(stats) {
  const ratio = stats.hit_ratio || {};
  $("hit-ratio").textContent = percent(ratio.objects);
  $("hit-ratio-bytes").textContent = percent(ratio.bytes);
  const last = samples[samples.length - 1];
  $("hit-ratio-now").textContent = last ? percent(last.hit) : "–";
  chart($("hit-chart"), [samples.map((s) => s.hit)], { max: 1, format: percent });
  $("served-hot").textContent = last ? rate(last.hot) : "–";
  $("served-capacity").textContent = last ? rate(last.capacity) : "–";
  chart($("served-chart"), [samples.map((s) => s.hot), samples.map((s) => s.capacity)], { format: rate, base: 1024 });
}

function drawCapacity(t) {
  $("capacity-name").textContent = t.capacity || "";
  const last = samples[samples.length - 1];
  $("capacity-gets").textContent = last ? perSecond(last.gets) : "–";
  $("capacity-puts").textContent = last ? perSecond(last.puts) : "–";
  $("capacity-other").textContent = last ? perSecond(last.other) : "–";
  chart(
    $("capacity-chart"),
    [samples.map((s) => s.gets), samples.map((s) => s.puts), samples.map((s) => s.other)],
    { format: (n) => `${perSecond(n)}/s` },
  );
  const requests = t.capacity_requests || {};
  const facts = [
    ["segments", `${count(t.segments)} (${count(t.segments_written)} written since start)`],
    ["stored", `${size(t.capacity_bytes)}, ${percent(t.live_ratio)} of it live`],
    ["flush queue", `${count(t.flush_queue)} objects and parts, ${count(t.pending_records)} records`],
    ["read / written", `${size(t.capacity_bytes_read)} / ${size(t.capacity_bytes_written)} since start`],
    ["requests", `${count(requests.gets)} GET, ${count(requests.puts)} PUT, ` +
      `${count(requests.heads)} HEAD, ${count(requests.deletes)} DELETE, ${count(requests.lists)} LIST, ` +
      `${count(requests.retries)} retried`],
  ];
  const c = t.cluster;  // one of several gateways (docs/scale-out.md)
  if (c) {
    const lag = c.lag_seconds === null ? "not caught up yet" : `${c.lag_seconds.toFixed(1)} s behind`;
    const others = Object.entries(c.writers).filter(([, node]) => node !== c.node)
      .map(([bucket, node]) => `${bucket} on ${node}`);
    facts.unshift(["node", `${c.node}: ` +
      (c.writing.length ? `writes ${c.writing.join(", ")}` : "writes no bucket") +
      (others.length ? `; follows ${others.join(", ")}` : "") +
      `; ${lag}, ${count(c.lag_segments)} segments to apply`]);
  }
  if (t.last_flush_error) facts.push(["last flush error", t.last_flush_error]);
  const nodes = facts.flatMap(([name, value]) => [el("dt", name), el("dd", value)]);
  if (t.last_flush_error) nodes[nodes.length - 1].className = "error";
  $("capacity-facts").replaceChildren(...nodes);
}

function drawRequests(requests) {
  const ops = Object.entries(requests).sort((a, b) => b[1].count - a[1].count);
  if (!ops.length) return empty($("requests"), 5, "no S3 requests yet");
  $("requests").replaceChildren(
    ...ops.map(([name, op]) => {
      const latency = op.latency_ms || {};
      const ms = (v) => (typeof v === "number" ? v.toFixed(1) : "–");
      return row([name, [count(op.count), "n"], [count(op.errors), op.errors ? "n error" : "n"],
        [ms(latency.p50), "n"], [ms(latency.p99), "n"]]);
    }),
  );
}

function recent(list, live) {
  const running = list.filter(live);
  return running.concat(list.filter((x) => !live(x)).slice(0, FINISHED_SHOWN));
}

function jobTarget(params) {
  if (!params) return "";
  if (params.bucket !== undefined && params.bucket !== null) {
    let what = `s3://${params.bucket}/${params.prefix || ""}`;
    if (params.manifest) what += ` (manifest ${params.manifest})`;
    if (typeof params.keys === "number") what += ` (${count(params.keys)} keys)`;
    return what;
  }
  return typeof params.threshold === "number" ? `threshold ${params.threshold}` : "";
}

function drawJobs(jobs) {
  const shown = recent(jobs, (job) => job.state === "running");
  if (!shown.length) return empty($("jobs"), 6, "no jobs");
  $("jobs").replaceChildren(
    ...shown.map((job) => {
      const p = job.progress;
      const fraction = job.state === "succeeded" ? 1 : p.fraction;
      const amount = p.bytes_total
        ? `${size(p.bytes_done)} of ${size(p.bytes_total)}`
        : `${count(p.items_done)}${p.items_total ? ` of ${count(p.items_total)}` : ""} items`;
      const label = typeof fraction === "number" ? `${amount} · ${percent(fraction)}` : amount;
      const tr = row([
        [job.id, "id"],
        `${job.kind} ${jobTarget(job.params)}`,
        [job.state, `badge ${job.state}`],
        progressBar(fraction, label, job.state),
        [job.state === "running" ? rate(job.rate_bytes_per_s) : "", "n"],
        [job.state === "running" ? duration(job.eta_s) : "", "n"],
      ]);
      tr.dataset.job = job.id;
      tr.dataset.kind = job.kind;
      if (job.errors.length) tr.title = job.errors.join("\n");
      return tr;
    }),
  );
}

function drawEpochs(epochs, now) {
  const live = (e) => e.state === "active" || e.state === "queued";
  const shown = recent(epochs, live);
  if (!shown.length) return empty($("epochs"), 7, "no epochs registered");
  $("epochs").replaceChildren(
    ...shown.flatMap((e) => {
      const fraction = e.objects ? e.consumed / e.objects : 1;
      let eta = "";
      if (e.state === "active") {
        // Over the time this page has watched it: the server gives no rate.
        const first = epochsSeen.get(e.id);
        if (!first) epochsSeen.set(e.id, { t: now, consumed: e.consumed });
        else if (now > first.t && e.consumed > first.consumed) {
          const perSecondRead = (e.consumed - first.consumed) / (now - first.t);
          eta = duration((e.objects - e.consumed) / perSecondRead);
        }
      }
      const tr = row([
        [e.id, "id"],
        e.bucket,
        [e.state, `badge ${e.state}`],
        progressBar(fraction, `${count(e.consumed)} of ${count(e.objects)} objects · ` +
          `${e.readers} reader${e.readers === 1 ? "" : "s"}`, e.state),
        [percent(e.hit_ratio), "n"],
        [size(e.prefetched_bytes), "n"],
        [eta, "n"],
      ]);
      tr.dataset.epoch = e.id;
      if (!e.warning) return [tr];
      // Under its epoch, across the table: e.g. keys named that are not the keys read.
      const td = el("td", `⚠ ${e.warning}`, "warning");
      td.colSpan = 7;
      const note = el("tr");
      note.append(td);
      note.dataset.epochWarning = e.id;
      return [tr, note];
    }),
  );
}

function drawBuckets(buckets, mounts) {
  if (!buckets.length) return empty($("buckets"), 5, "no buckets");
  const mounted = new Map(mounts.map((m) => [m.name, m]));
  $("buckets").replaceChildren(
    ...buckets.map((b) => {
      const m = mounted.get(b.name);
      let kind = "managed";
      let policy = [b.write_through ? "write-through" : "write-back", b.compression ? "zstd" : "no compression"];
      if (b.pinned) policy.push("pinned");
      if (m) {
        // A mount's objects keep the source's layout: its own policy is what counts.
        kind = `mount of ${m.source}${m.endpoint ? ` at ${m.endpoint}` : ""}`;
        policy = [m.read_write ? "read-write" : "read-only",
          m.freshness === "immutable" ? "immutable" : `revalidated after ${duration(m.freshness)}`];
        if (m.serve_stale) policy.push("serves stale");
      }
      const tr = row([[b.name, "id"], kind, policy.join(" · "), [size(b.part_size), "n"],
        [m ? "" : size(b.small_object_size), "n"]]);
      tr.dataset.bucket = b.name;
      return tr;
    }),
  );
}

// A line chart of the last HISTORY samples, newest at the right; null is a
// gap. ``max`` fixes the scale, else it follows the largest value shown.
function chart(svg, series, { max, format, base = 10 }) {
  const [W, H, TOP, BOTTOM] = [400, 120, 16, 4];
  const values = series.flat().filter((v) => typeof v === "number");
  const peak = max || niceCeiling(Math.max(0, ...values), base);
  const y = (v) => TOP + (H - TOP - BOTTOM) * (1 - Math.min(v, peak) / peak);
  const step = W / (HISTORY - 1);
  const nodes = [];
  for (const level of [0, 0.5, 1]) {
    nodes.push(svgNode("line", { x1: 0, x2: W, y1: y(level * peak), y2: y(level * peak), class: "grid" }));
  }
  nodes.push(svgNode("text", { x: 2, y: TOP - 4, class: "axis" }, format(peak)));
  nodes.push(svgNode("text", { x: W - 2, y: TOP - 4, class: "axis end" }, `last ${duration((HISTORY * REFRESH_MS) / 1000)}`));
  series.forEach((points, i) => {
    let d = "";
    let pen = false;
    points.forEach((v, k) => {
      if (typeof v !== "number") {
        pen = false;
        return;
      }
      const x = W - (points.length - 1 - k) * step;
      d += `${pen ? "L" : "M"}${x.toFixed(1)},${y(v).toFixed(1)}`;
      pen = true;
    });
    if (d) nodes.push(svgNode("path", { d, class: `line s${i}` }));
    const last = points[points.length - 1];
    if (typeof last === "number") nodes.push(svgNode("circle", { cx: W, cy: y(last), r: 3, class: `dot s${i}` }));
  });
  svg.replaceChildren(...nodes);
}

// 1, 2 or 5 times a power of ten; with base 1024, of KiB, MiB, ... so that
// a byte scale reads "2.0 MiB/s", not "1.9 MiB/s".
function niceCeiling(value, base) {
  if (!(value > 0)) return 1;
  const unit = base === 1024 ? 1024 ** Math.max(0, Math.floor(Math.log(value) / Math.log(1024))) : 1;
  const scaled = value / unit;
  const magnitude = 10 ** Math.floor(Math.log10(scaled));
  const nice = [1, 2, 5, 10].find((f) => f * magnitude >= scaled);
  return nice * magnitude * unit;
}

function svgNode(tag, attributes, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  if (text !== undefined) node.textContent = text;
  return node;
}
