// megatraind's dashboard: follows the daemon's server-sent events (GET api/events, pushed on every
// step; server/dashboard_api.h) and, when the stream fails (an old browser, the stream cap, the
// daemon gone), polls its JSON API every second instead, trying the stream again after 30 s of
// successful polls. Draws the job list, the selected job's curves and layer bars (plain SVG),
// its latest eval replies (a fine-tuning job's data.eval_prompts), memory per tier, checkpoints,
// the daemon's health and each of its devices; says "daemon unreachable" while fetches fail. body[data-live] says
// which ("events" or "polling").
"use strict";

const POLL_MS = 1000;
const STREAM_RETRY_MS = 30000;
const FETCH_TIMEOUT_MS = 3000;
const SVG = "http://www.w3.org/2000/svg";
let selected = null;  // the job the user clicked; null = the running (else newest) job

const $ = (id) => document.getElementById(id);
const num = (v) => (v === "NaN" || v === undefined || v === null ? NaN : Number(v));

function svg(tag, attrs, parent) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  if (parent) parent.appendChild(el);
  return el;
}

async function getJson(path) {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), FETCH_TIMEOUT_MS);
  try {
    const response = await fetch(path, { cache: "no-store", signal: abort.signal });
    // Exposed daemon, session expired: log in again (server/http_auth.h).
    if (response.status === 401) window.location.assign("login");
    if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
    return await response.json();
  } finally {
    clearTimeout(timer);
  }
}

function bytes(n) {
  n = num(n);
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i === 0 ? 0 : 1)} ${units[i]}`;
}

function duration(seconds) {
  seconds = num(seconds);
  if (!isFinite(seconds) || seconds <= 0) return "–";
  const h = Math.floor(seconds / 3600), m = Math.floor((seconds % 3600) / 60);
  const s = Math.floor(seconds % 60);
  return h > 0 ? `${h}h ${m}m` : m > 0 ? `${m}m ${s}s` : `${s}s`;
}

const fixed = (v, digits) => (isFinite(num(v)) ? num(v).toFixed(digits) : "–");

function showDaemon(status) {
  const pill = $("daemon-status");
  pill.textContent = status.healthy ? "healthy" : `unhealthy: ${status.unhealthy_reason}`;
  pill.className = `pill ${status.healthy ? "ok" : "bad"}`;
  $("daemon-info").textContent =
    `${status.version} · ${status.device} · queue ${status.queue_length}` +
    (status.running_job_id ? ` · running ${status.running_job_id}` : "");
  showDevices(status.devices || []);
}

// Every device the daemon drives (megatraind --devices): its arena in use of its capacity and its
// health. An older daemon sends no devices; its one device is in the header line.
function showDevices(devices) {
  const box = $("devices");
  box.replaceChildren();
  $("devices-section").hidden = devices.length === 0;
  for (const d of devices) {
    const used = num(d.arena_in_use_bytes || 0), capacity = num(d.arena_capacity_bytes || 0);
    const div = document.createElement("div");
    div.className = d.healthy ? "device tier" : "device tier bad";
    div.dataset.index = d.index || 0;
    div.dataset.healthy = d.healthy ? "yes" : "no";
    div.textContent = `${d.index || 0} ${d.name}: arena ${bytes(used)} of ${bytes(capacity)} · ` +
      (d.healthy ? "healthy" : `unhealthy: ${d.unhealthy_reason}`);
    const track = document.createElement("div");
    track.className = "track";
    const fill = document.createElement("div");
    fill.className = "fill";
    fill.style.width = `${capacity > 0 ? Math.min(100, (100 * used) / capacity) : 0}%`;
    track.append(fill);
    div.append(track);
    box.append(div);
  }
}

function showJobs(jobs, running) {
  const body = $("jobs").tBodies[0];
  body.replaceChildren();
  $("no-jobs").hidden = jobs.length > 0;
  for (const job of [...jobs].reverse()) {  // newest first
    const p = job.progress || {};
    const row = body.insertRow();
    row.dataset.jobId = job.id;
    if (job.id === selected) row.className = "selected";
    row.onclick = () => { selected = job.id; refresh(); };
    row.insertCell().textContent = job.spec && job.spec.name ? `${job.id} (${job.spec.name})` : job.id;
    const state = row.insertCell();
    state.className = "state";
    state.textContent = job.state;
    const bar = document.createElement("progress");
    bar.max = Math.max(1, num(p.total_steps));
    bar.value = num(p.step) || 0;
    const cell = row.insertCell();
    cell.append(bar, ` ${num(p.step) || 0}/${num(p.total_steps) || 0}`);
    row.insertCell().textContent = job.state === "RUNNING" ? duration(p.eta_seconds) : "–";
    row.insertCell().textContent = fixed(p.loss, 4);
    row.insertCell().textContent = fixed(p.tokens_per_second, 0);
  }
  if (selected && !jobs.some((j) => j.id === selected)) selected = null;
  if (selected) return selected;
  if (running) return running;
  return jobs.length ? jobs[jobs.length - 1].id : null;
}

// Draws series [{points: [[x, y]...], cls}] into an SVG chart with axes' extremes as labels.
function chart(el, series, yFormat) {
  // Drawn at the element's pixel size, so text is never stretched.
  const W = Math.max(200, el.clientWidth || 300), H = 160, L = 44, R = 6, T = 8, B = 16;
  el.setAttribute("viewBox", `0 0 ${W} ${H}`);
  el.setAttribute("preserveAspectRatio", "none");
  el.replaceChildren();
  const all = series.flatMap((s) => s.points).filter(([x, y]) => isFinite(x) && isFinite(y));
  const first = series.length ? series[0].points : [];
  el.dataset.points = String(first.length);
  el.dataset.lastStep = String(first.length ? first[first.length - 1][0] : 0);
  if (!all.length) {
    svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, el).textContent = "no data yet";
    return;
  }
  let [x0, x1] = [Math.min(...all.map((p) => p[0])), Math.max(...all.map((p) => p[0]))];
  let [y0, y1] = [Math.min(...all.map((p) => p[1])), Math.max(...all.map((p) => p[1]))];
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y0 -= Math.abs(y0) * 0.1 || 1; y1 += Math.abs(y1) * 0.1 || 1; }
  const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const sy = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  svg("line", { x1: L, y1: T, x2: L, y2: H - B, stroke: "currentColor", "stroke-opacity": 0.3 }, el);
  svg("text", { x: L - 3, y: T + 8, "text-anchor": "end" }, el).textContent = yFormat(y1);
  svg("text", { x: L - 3, y: H - B, "text-anchor": "end" }, el).textContent = yFormat(y0);
  svg("text", { x: L, y: H - 3 }, el).textContent = `step ${x0}`;
  svg("text", { x: W - R, y: H - 3, "text-anchor": "end" }, el).textContent = `${x1}`;
  for (const s of series) {
    const pts = s.points.filter(([x, y]) => isFinite(x) && isFinite(y));
    if (pts.length === 1) {
      svg("circle", { cx: sx(pts[0][0]), cy: sy(pts[0][1]), r: 2.5, class: s.cls }, el);
    }
    svg("polyline", {
      class: s.cls, "data-points": pts.length, "vector-effect": "non-scaling-stroke",
      points: pts.map(([x, y]) => `${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join(" "),
    }, el);
  }
}

function short(v) {
  if (Math.abs(v) >= 1e6) return `${(v / 1e6).toFixed(2)}M`;
  if (Math.abs(v) >= 1e3) return `${(v / 1e3).toFixed(2)}k`;
  return Math.abs(v) < 0.01 && v !== 0 ? v.toExponential(1) : v.toFixed(2);
}

// Per layer, one horizontal bar each of copy-in, compute, copy-out and stall seconds.
function layerBars(el, layers) {
  const kinds = ["copy_in", "compute", "copy_out", "stall"];
  const W = Math.max(200, el.clientWidth || 300), L = 52, rowH = 4 * 7 + 8;
  const H = Math.max(24, layers.length * rowH + 16);
  el.setAttribute("viewBox", `0 0 ${W} ${H}`);
  el.style.height = `${H}px`;
  el.replaceChildren();
  const max = Math.max(1e-9, ...layers.flatMap((l) => kinds.map((k) => num(l[`${k}_seconds`]) || 0)));
  layers.forEach((layer, i) => {
    const g = svg("g", { class: "layer", "data-layer": i }, el);
    const y = 4 + i * rowH;
    svg("text", { x: L - 4, y: y + 16, "text-anchor": "end" }, g).textContent = `layer ${i}`;
    kinds.forEach((k, j) => {
      const seconds = num(layer[`${k}_seconds`]) || 0;
      const r = svg("rect", { class: k, x: L, y: y + j * 7, height: 6,
        width: Math.max(0.5, (seconds / max) * (W - L - 60)) }, g);
      svg("title", {}, r).textContent = `${k.replace("_", "-")} ${(seconds * 1000).toFixed(2)} ms`;
    });
  });
  svg("text", { x: W - 2, y: H - 2, "text-anchor": "end" }, el).textContent =
    `max ${(max * 1000).toFixed(2)} ms`;
}

function showMemory(tiers, history, nvmeBytes) {
  const box = $("memory");
  box.replaceChildren();
  for (const t of tiers) {
    const used = num(t.bytes), budget = num(t.budget_bytes);
    const div = document.createElement("div");
    div.className = "tier";
    div.dataset.tier = t.tier;
    div.textContent = `${t.tier}: ${bytes(used)}` + (budget > 0 ? ` of ${bytes(budget)}` : " (no budget)");
    const track = document.createElement("div");
    track.className = "track";
    const fill = document.createElement("div");
    fill.className = budget > 0 && used > budget ? "fill over" : "fill";
    fill.style.width = `${budget > 0 ? Math.min(100, (100 * used) / budget) : 0}%`;
    track.append(fill);
    div.append(track);
    box.append(div);
  }
  const nvmeBudget = num(nvmeBytes);
  $("nvme").textContent = (nvmeBudget > 0 ? `NVMe tier: ${bytes(nvmeBudget)} (the job's budget). ` : "No NVMe tier. ") +
    (history ? `NVMe traffic: ${bytes(history.nvme_bytes_read)} read, ${bytes(history.nvme_bytes_written)} written (this daemon run)` : "");
}

const CHECKS = {
  manifest_matches: ["manifest matches its recorded SHA-256", "ok"],
  manifest_changed: ["manifest CHANGED since commit", "bad"],
  missing: ["manifest missing (removed or unreadable)", "bad"],
  not_hashed: ["no manifest hash recorded", "bad"],
  not_checked: ["not checked (older)", ""],
};

// Newest first, each with its quick check (server/dashboard_api.h; `megatrain verify` for all).
function showCheckpoints(records, checks) {
  const list = $("checkpoints");
  list.replaceChildren();
  if (!records.length) list.append(Object.assign(document.createElement("li"), { textContent: "none yet" }));
  records.forEach((c, i) => {
    const [text, cls] = CHECKS[checks[i]] || [checks[i] || "unknown", ""];
    const li = document.createElement("li");
    li.className = `checkpoint ${cls}`;
    li.dataset.check = checks[i] || "";
    const check = Object.assign(document.createElement("span"), { className: `check ${cls}`, textContent: text });
    li.append(`step ${c.step} · ${new Date(num(c.created_unix_ms)).toLocaleString()} · `, check, ` · ${c.path}`);
    list.prepend(li);
  });
}

// The latest round of replies to the job's data.eval_prompts (a fine-tuning job), each prompt and
// reply as text: job data never goes through innerHTML. Hidden when the job has none.
function showEvalReplies(replies) {
  $("eval").hidden = replies.length === 0;
  const list = $("eval-replies");
  list.replaceChildren();
  if (!replies.length) return;
  // One round, after its step's update (step 0: the model before any step).
  const step = num(replies[0].step);
  $("eval").dataset.step = String(step);
  $("eval-step").textContent = step > 0 ? `after step ${step}` : "before training";
  for (const r of replies) {
    const li = document.createElement("li");
    li.className = "eval-reply";
    li.dataset.index = String(num(r.index) || 0);
    const prompt = Object.assign(document.createElement("div"), { className: "prompt", textContent: r.prompt });
    const reply = Object.assign(document.createElement("div"), { className: "reply", textContent: r.reply });
    const meta = Object.assign(document.createElement("div"), {
      className: "meta muted",
      textContent: `${num(r.tokens) || 0} tokens${r.stopped ? "" : " (cut at eval_reply_tokens)"}`,
    });
    li.append(prompt, reply, meta);
    list.append(li);
  }
}

function showJob(detail, daemon) {
  const { job, history } = detail;
  const p = job.progress || {};
  $("job").hidden = false;
  $("job").dataset.jobId = job.id;
  $("job-id").textContent = job.id;
  $("job-state").textContent = job.state;
  $("job-state").className = `pill ${job.state}`;
  $("job-message").textContent = job.failure_reason ||
    `step ${num(p.step) || 0} of ${num(p.total_steps) || 0} · ${num(p.tokens) || 0} tokens` +
    (job.state === "RUNNING" ? ` · ETA ${duration(p.eta_seconds)}` : "");
  const steps = history.steps || [];
  const xy = (key) => steps.map((s) => [num(s.step), num(s[key])]);
  chart($("chart-loss"), [
    { points: xy("loss"), cls: "loss" },
    { points: (history.validation || []).map((v) => [num(v.step), num(v.validation_loss)]), cls: "validation" },
  ], short);
  chart($("chart-tps"), [{ points: xy("tokens_per_second"), cls: "loss" }], short);
  chart($("chart-lr"), [{ points: xy("learning_rate"), cls: "loss" }], (v) => v.toExponential(2));
  chart($("chart-gnorm"), [{ points: xy("grad_norm"), cls: "loss" }], short);
  $("layers-step").textContent = num(history.layers_step) > 0 ? history.layers_step : "–";
  layerBars($("layers"), history.layers || []);
  // The daemon's tiers are the running job's; another job shows its last reported bytes.
  const tiers = job.id === daemon.running_job_id ? daemon.memory
    : (p.memory || []).map((t) => ({ ...t, budget_bytes: (daemon.memory.find((d) => d.tier === t.tier) || {}).budget_bytes }));
  showMemory(tiers, history, job.spec && job.spec.memory && job.spec.memory.nvme_bytes);
  showCheckpoints((detail.checkpoints && detail.checkpoints.checkpoints) || [],
    detail.checkpoint_checks || []);
  showEvalReplies(history.eval_replies || []);
}

function unreachable(error) {
  document.body.classList.add("unreachable");
  $("unreachable").hidden = false;
  $("unreachable-reason").textContent = String(error.message || error);
  const pill = $("daemon-status");
  pill.textContent = "daemon unreachable";
  pill.className = "pill bad";
}

function reachable() {
  document.body.classList.remove("unreachable");
  $("unreachable").hidden = true;
  $("updated").textContent = new Date().toLocaleTimeString();
}

let timer = null;
let stream = null;       // the open EventSource; null while polling
let streamJob = null;    // the job its "job" events are about
let lastDaemon = null;   // from the latest "jobs" event
let streamRetryAt = 0;   // while polling: when to try the stream again

// Follows api/events for `job` (null: the job list only).
function openStream(job) {
  clearTimeout(timer);
  if (stream) stream.close();
  streamJob = job;
  stream = new EventSource(job ? `api/events?job=${encodeURIComponent(job)}` : "api/events");
  document.body.dataset.live = "events";
  stream.addEventListener("jobs", (event) => {
    const { daemon, list } = JSON.parse(event.data);
    lastDaemon = daemon;
    showDaemon(daemon);
    const id = showJobs(list.jobs || [], daemon.running_job_id);
    reachable();
    if (id !== streamJob) openStream(id);  // the stream of the job to show
    else if (!id) $("job").hidden = true;
  });
  stream.addEventListener("job", (event) => {
    if (lastDaemon) showJob(JSON.parse(event.data), lastDaemon);
  });
  stream.onerror = () => {  // the stream failed or ended: poll (the next tick says why)
    stream.close();
    stream = null;
    document.body.dataset.live = "polling";
    streamRetryAt = Date.now() + STREAM_RETRY_MS;
    tick();
  };
}

// After a click: the stream of the selected job, or a poll now.
function refresh() {
  if (stream) openStream(selected);
  else tick();
}

async function tick() {
  clearTimeout(timer);
  let id = null;
  try {
    const [daemon, list] = await Promise.all([getJson("api/daemon"), getJson("api/jobs")]);
    showDaemon(daemon);
    id = showJobs(list.jobs || [], daemon.running_job_id);
    if (id) {
      showJob(await getJson(`api/jobs/${encodeURIComponent(id)}`), daemon);
    } else {
      $("job").hidden = true;
    }
    reachable();
  } catch (error) {
    unreachable(error);
    timer = setTimeout(tick, POLL_MS);
    return;
  }
  if (window.EventSource && Date.now() >= streamRetryAt) openStream(id);
  else timer = setTimeout(tick, POLL_MS);
}

document.body.dataset.live = "polling";
tick();  // the first draw by fetch, then the stream
