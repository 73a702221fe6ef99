// The Horus view: four read-only pages over the JSON API at api/v1 (docs/UI.md). No framework, no build.
"use strict";

const PAGES = ["cluster", "queue", "decisions", "predictor", "simulations"];
const tail = location.pathname.match(/\/(cluster|queue|decisions|predictor|simulations)?\/?$/);
const BASE = location.pathname.slice(0, location.pathname.length - tail[0].length) + "/";
const PAGE = tail[1] || "cluster";
const API = BASE + "api/v1/";
const AIRFLOW = BASE.replace(/[^/]+\/$/, ""); // the Airflow UI root: the app is mounted one level below it
const main = document.getElementById("main");

// One colour scale for every utilization and memory share on every page: 0-100 %, then red when over-committed.
const SCALE = ["#f1f5f9", "#e0f2fe", "#bae6fd", "#7dd3fc", "#38bdf8", "#0ea5e9", "#0284c7", "#0369a1", "#075985", "#0c4a6e", "#172554"];
const OVER = "#dc2626";
function colour(percent) {
  if (percent === null || percent === undefined) return null;
  if (percent > 100.5) return OVER;
  return SCALE[Math.max(0, Math.min(10, Math.round(percent / 10)))];
}

function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, c => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}
function fmt(value, digits = 0) { return value === null || value === undefined ? "–" : Number(value).toFixed(digits); }
function when(seconds) { return new Date(seconds * 1000).toLocaleString(); }
function status(text) { document.getElementById("status").textContent = text; }

async function api(path) {
  const response = await fetch(API + path, { credentials: "same-origin", headers: { Accept: "application/json" } });
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  if (!response.ok) {
    const detail = body && body.detail ? body.detail : response.statusText;
    const hint = response.status === 401 ? " Sign in to Airflow, then open Horus again." : "";
    throw new Error(`${response.status}: ${typeof detail === "string" ? detail : JSON.stringify(detail)}.${hint}`);
  }
  return body;
}
function showError(where, error) { where.innerHTML = `<div class="error" role="alert">${esc(error.message)}</div>`; }
function taskLink(task) {
  if (!task) return '<span class="muted">not an Airflow task</span>';
  const label = `${task.dag_id}.${task.task_id}${task.map_index >= 0 ? `[${task.map_index}]` : ""}`;
  return `<a target="_top" href="${esc(AIRFLOW + task.ui_path)}" title="run ${esc(task.run_id)}">${esc(label)}</a>`;
}
function legend() {
  const swatches = SCALE.map((c, i) => `<span style="background:${c}" title="${i * 10} %"></span>`).join("") +
    `<span style="background:${OVER}" title="over 100 %"></span>`;
  return `<div class="legend">0 %<span class="scale">${swatches}</span>100 % · over · each GPU: top predicted util, middle measured util (hatched: not measured), bottom predicted memory share</div>`;
}

// --- cluster map ---------------------------------------------------------------------------------
let clusterData = null;
async function cluster() {
  main.innerHTML = `<div class="toolbar">
      <label>Node <input id="f-node" placeholder="name contains" size="14"></label>
      <label>GPU type <select id="f-type"><option value="">all</option></select></label>
      <label>DAG <select id="f-dag"><option value="">all</option></select></label>
      <button id="refresh">Refresh</button>${legend()}</div>
    <div id="notes"></div><div id="summary" class="muted"></div><div id="map" class="map"></div><div id="gpu-detail"></div>`;
  const filters = { node: document.getElementById("f-node"), gpu_type: document.getElementById("f-type"), dag_id: document.getElementById("f-dag") };
  let timer = null;
  let latest = 0; // a filter change overtakes an answer still on its way: only the newest is drawn
  const load = async () => {
    const query = new URLSearchParams();
    for (const [key, input] of Object.entries(filters)) if (input.value) query.set(key, input.value);
    const started = performance.now();
    const mine = ++latest;
    let data;
    try {
      data = await api("cluster?" + query);
    } catch (error) { if (mine === latest) showError(document.getElementById("map"), error); return; }
    if (mine !== latest) return;
    clusterData = data;
    fillSelect(filters.gpu_type, clusterData.gpu_types);
    fillSelect(filters.dag_id, clusterData.dag_ids);
    drawMap(clusterData);
    document.documentElement.dataset.drawnAt = String(performance.now()); // ms since navigation: what bench_ui.py reads
    status(`${clusterData.source} · as of ${new Date(clusterData.as_of * 1000).toLocaleTimeString()} · drawn in ${Math.round(performance.now() - started)} ms`);
  };
  filters.node.addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(load, 300); });
  filters.gpu_type.addEventListener("change", load);
  filters.dag_id.addEventListener("change", load);
  document.getElementById("refresh").addEventListener("click", load);
  document.getElementById("map").addEventListener("click", event => {
    const cell = event.target.closest(".gpu");
    if (cell) showGpu(cell);
  });
  await load();
}

function fillSelect(select, values) {
  const chosen = select.value;
  select.innerHTML = '<option value="">all</option>' + values.map(v => `<option>${esc(v)}</option>`).join("");
  select.value = values.includes(chosen) ? chosen : "";
}

function drawMap(data) {
  document.getElementById("notes").innerHTML = data.notes.map(n => `<div class="note">${esc(n)}</div>`).join("");
  const shown = data.nodes.reduce((n, node) => n + node.gpus.length, 0);
  document.getElementById("summary").textContent =
    `${data.totals.nodes} nodes · ${data.totals.gpus} GPUs · ${data.totals.busy_gpus} busy · ${data.tasks.length} tasks shown` +
    (shown !== data.totals.gpus ? ` · ${shown} GPUs match the filter` : "");
  const map = document.getElementById("map");
  map.classList.toggle("big", shown > 512);
  map.classList.toggle("small", shown <= 16); // a workstation's few GPUs fill the page, not a corner
  const parts = [];
  data.nodes.forEach((node, n) => {
    const healthy = node.gpus.every(g => g.healthy);
    parts.push(`<div class="node${healthy ? "" : " unhealthy"}" data-node="${esc(node.name)}"><div class="name" title="${esc(node.name)}">${esc(node.name)}</div>`);
    node.gpus.forEach((gpu, g) => {
      const predicted = colour(gpu.predicted.util);
      const measured = gpu.measured && gpu.measured.util !== null ? colour(gpu.measured.util) : null;
      const memory = colour(100 * gpu.predicted.mem_mib / gpu.memory_mib);
      const tip = `${gpu.gpu_id} ${gpu.gpu_type}${gpu.healthy ? "" : " (unhealthy)"}: predicted ${fmt(gpu.predicted.util)} %, measured ${measured ? fmt(gpu.measured.util) + " %" : "–"}, ${gpu.tasks.length} task(s)`;
      parts.push(`<div class="gpu${gpu.healthy ? "" : " sick"}" data-g="${n}:${g}" data-gpu="${esc(gpu.gpu_id)}" title="${esc(tip)}">` +
        `<i style="background:${predicted}"></i><i class="m${measured ? "" : " none"}"${measured ? ` style="background:${measured}"` : ""}></i>` +
        `<i style="background:${memory}"></i></div>`);
    });
    parts.push("</div>");
  });
  map.innerHTML = parts.join("");
  if (!data.nodes.length && data.totals.gpus) map.innerHTML = '<p class="muted">No GPU matches these filters.</p>';
}

function showGpu(cell) {
  document.querySelectorAll(".gpu.selected").forEach(c => c.classList.remove("selected"));
  cell.classList.add("selected");
  const [n, g] = cell.dataset.g.split(":").map(Number);
  const gpu = clusterData.nodes[n].gpus[g];
  const measured = gpu.measured;
  const rows = gpu.tasks.map(i => clusterData.tasks[i]).map(t => `<tr><td>${t.external ? '<span class="muted">a pod Horus did not place</span>' : taskLink(t.task)}</td>
      <td>${esc(t.job_id)}</td><td>${fmt(t.util)} %</td><td>${fmt(t.util_p90)} %</td><td>${fmt(t.mem_mib)} MiB</td>
      <td>${t.reservation_id ? `<a href="${BASE}decisions#${esc(t.reservation_id)}">why here</a>` : ""}</td></tr>`).join("");
  document.getElementById("gpu-detail").innerHTML = `<div class="detail"><h2>${esc(gpu.gpu_id)} · ${esc(gpu.gpu_type)}${gpu.declared ? " (declared in HORUS_LOCAL_GPUS)" : ""}${gpu.healthy ? "" : " · unhealthy"}</h2>
    <table><tr><th></th><th>utilization</th><th>utilization p90</th><th>memory</th></tr>
    <tr><td>predicted (sum of tasks)</td><td>${fmt(gpu.predicted.util)} %</td><td>${fmt(gpu.predicted.util_p90)} %</td><td>${fmt(gpu.predicted.mem_mib)} of ${fmt(gpu.memory_mib)} MiB</td></tr>
    <tr><td>measured</td><td>${measured ? fmt(measured.util) + " %" : "not measured"}</td><td></td><td>${measured && measured.mem_mib !== null ? fmt(measured.mem_mib) + " MiB" : ""}${measured ? ` <span class="muted">(${fmt(measured.age_s)} s ago)</span>` : ""}</td></tr></table>
    <h2>Tasks</h2>${rows ? `<table><tr><th>task</th><th>job</th><th>pred. util</th><th>p90</th><th>memory</th><th></th></tr>${rows}</table>` : '<p class="muted">No task on this GPU.</p>'}</div>`;
}

// --- queue ---------------------------------------------------------------------------------------
async function queue() {
  main.innerHTML = `<div class="toolbar"><button id="refresh">Refresh</button></div><div id="list"></div>`;
  const list = document.getElementById("list");
  const load = async () => {
    let data;
    try { data = await api("queue"); } catch (error) { showError(list, error); return; }
    status(`${data.source} queue · ${data.queue.length} waiting`);
    if (data.note) { list.innerHTML = `<div class="note">${esc(data.note)}</div>`; return; }
    if (!data.queue.length) {
      list.innerHTML = `<div class="note">No task is waiting for GPUs. A task that finds none free joins the queue, and appears here with why it waits until a scheduling round books it.</div>`;
      return;
    }
    list.innerHTML = `<table id="queue"><thead><tr><th>#</th><th>task</th><th>GPUs</th><th>priority</th><th>profile</th><th>pred. util</th><th>pred. memory</th><th>waiting</th><th>passed over</th><th>why it waits</th></tr></thead><tbody>${
      data.queue.map(q => {
        const predicted = Object.entries(q.predicted);
        const util = predicted.map(([t, d]) => `${fmt(d.util)} % <span class="muted">${esc(t)}</span>`).join("<br>");
        const mem = predicted.map(([t, d]) => `${fmt(d.mem_mib)} MiB`).join("<br>");
        return `<tr><td>${q.position}</td><td>${taskLink(q.task)}<div class="muted">${esc(q.job_id)}</div></td><td>${q.gpus}</td><td>${q.priority}</td>
          <td>${esc(q.profile)}</td><td>${util}</td><td>${mem}</td><td>${duration(q.waited_s)}</td><td>${q.skips}</td>
          <td class="reason">${esc(q.reason)}</td></tr>`;
      }).join("")}</tbody></table>`;
  };
  document.getElementById("refresh").addEventListener("click", load);
  await load();
}

// --- decisions -----------------------------------------------------------------------------------
async function decisions() {
  main.innerHTML = `<div class="toolbar"><label>DAG <input id="f-dag" placeholder="dag id" size="20"></label><button id="refresh">Refresh</button></div>
    <div id="list"></div><button id="older" hidden>Older placements</button>`;
  const list = document.getElementById("list");
  const older = document.getElementById("older");
  let before = null;
  let latest = 0; // a refresh overtakes an answer still on its way: only the newest is drawn
  const load = async (append) => {
    const query = new URLSearchParams({ limit: "50" });
    const dag = document.getElementById("f-dag").value.trim();
    if (dag) query.set("dag_id", dag);
    if (append && before !== null) query.set("before", String(before));
    const mine = ++latest;
    let data;
    try { data = await api("decisions?" + query); } catch (error) { if (mine === latest) { showError(list, error); older.hidden = true; } return; }
    if (mine !== latest) return;
    status(`${data.source} ledger`);
    before = data.next_before;
    older.hidden = before === null;
    if (!append) {
      if (!data.decisions.length) {
        list.innerHTML = `<div class="note">No placements yet${dag ? ` for DAG ${esc(dag)}` : ""}. Run a DAG with HorusTrainingOperator or HorusKubernetesPodOperator (<code>make demo</code> runs one); every placement then appears here with its reasons.</div>`;
        return;
      }
      list.innerHTML = `<table id="decisions"><thead><tr><th>placed</th><th>task</th><th>GPUs</th><th>profile</th><th>pred. util</th><th>pred. memory</th><th>status</th><th>reason</th></tr></thead><tbody></tbody></table>`;
    }
    const body = list.querySelector("tbody");
    body.insertAdjacentHTML("beforeend", data.decisions.map(d => `<tr class="decision" data-id="${esc(d.reservation_id)}" tabindex="0">
        <td>${esc(when(d.created_at))}</td><td>${taskLink(d.task)}<div class="muted">${esc(d.job_id)}</div></td><td>${esc(d.gpu_ids.join(", "))}</td>
        <td>${esc(d.profile)}</td><td>${fmt(d.predicted.util)} %</td><td>${fmt(d.predicted.mem_mib)} MiB</td><td>${esc(d.status)}</td>
        <td class="reason">${esc(d.reason)}</td></tr>`).join(""));
  };
  document.getElementById("refresh").addEventListener("click", () => load(false));
  document.getElementById("f-dag").addEventListener("change", () => load(false));
  older.addEventListener("click", () => load(true));
  list.addEventListener("click", event => {
    if (event.target.closest("a")) return;
    const row = event.target.closest("tr.decision");
    if (row) toggleExplanation(row);
  });
  list.addEventListener("keydown", event => {
    const row = event.target.closest("tr.decision");
    if (row && event.key === "Enter") toggleExplanation(row);
  });
  await load(false);
  const wanted = location.hash.slice(1);
  const row = wanted && list.querySelector(`tr.decision[data-id="${CSS.escape(wanted)}"]`);
  if (row) { toggleExplanation(row); row.scrollIntoView(); }
}

async function toggleExplanation(row) {
  const next = row.nextElementSibling;
  if (next && next.classList.contains("explain")) { next.remove(); row.classList.remove("open"); return; }
  row.classList.add("open");
  row.insertAdjacentHTML("afterend", `<tr class="explain"><td colspan="8"><span class="muted">Loading the explanation…</span></td></tr>`);
  const cell = row.nextElementSibling.firstElementChild;
  try {
    cell.innerHTML = explanation(await api("decisions/" + encodeURIComponent(row.dataset.id)));
  } catch (error) { showError(cell, error); }
}

function explanation(d) {
  const runs = d.mlflow_runs.length
    ? d.mlflow_runs.map(r => r.url ? `<a target="_blank" rel="noopener" href="${esc(r.url)}">${esc(r.name || r.run_id)}</a> (${esc(r.status)})`
        : `${esc(r.name || "")} run <code>${esc(r.run_id)}</code> (${esc(r.status)}; set HORUS_MLFLOW_UI_URL to link it)`).join(", ")
    : (d.mlflow_error ? `<span class="fail">${esc(d.mlflow_error)}</span>` : '<span class="muted">no profiling run yet (it is logged when the task ends)</span>');
  const head = `<p><b>${esc(d.reason)}</b></p><p>Reservation <code>${esc(d.reservation_id)}</code> · owner <code>${esc(d.owner)}</code> · MLflow profiling run: ${runs}</p>`;
  const e = d.explanation;
  if (!e) return head + '<p class="muted">No explanation was kept for this placement (made before decisions were journaled, or its pod annotation is unreadable).</p>';
  const rows = e.candidates.map(c => {
    const chosen = e.gpu_ids.includes(c.gpu_id);
    const verdicts = c.verdicts.map(v => `<div class="${v.passed ? "pass" : "fail"}">${esc(v.plugin)}: ${esc(v.reason)}</div>`).join("");
    const parts = Object.entries(c.cost_parts || {}).map(([k, v]) => `${esc(k)} ${fmt(v, 3)}`).join(" · ");
    return `<tr><td>${esc(c.gpu_id)}${chosen ? ' <span class="badge champion">chosen</span>' : ""}</td><td>${esc(c.gpu_type)}</td>
      <td>${verdicts}</td><td>${c.cost === null ? "–" : fmt(c.cost, 3)}</td><td>${parts}</td></tr>`;
  }).join("");
  const rejected = Object.entries(e.rejected || {}).map(([plugin, n]) => `${esc(plugin)}: ${n}`).join(" · ");
  return head + `<table class="candidates"><tr><th>candidate GPU</th><th>type</th><th>filter verdicts</th><th>cost</th><th>score terms</th></tr>${rows}</table>` +
    (rejected ? `<p class="muted">GPUs rejected, by the first filter that failed: ${rejected}</p>` : "") +
    `<p class="muted">Profile ${esc(e.profile)}; decided on ledger version ${esc(e.state_version)}. Lower cost is better; the chosen GPUs and the next best are kept.</p>`;
}

// --- predictor -----------------------------------------------------------------------------------
const PRIMARY = { "horus-gpu-utilization": "heldout.source.gpu_util.model.mae", "horus-interference": "heldout.job_type.learned.mae" };

async function predictor() {
  main.innerHTML = '<div id="models"></div><h2>Predicted vs measured GPU utilization, latest profiling runs</h2><div id="scatter"></div>';
  let data;
  try { data = await api("predictor"); } catch (error) { showError(main, error); return; }
  status("MLflow registry");
  document.getElementById("models").innerHTML = data.models.map((m, i) => modelSection(m, i)).join("");
  data.models.forEach((m, i) => {
    const select = document.getElementById(`metric-${i}`);
    if (!select) return;
    const draw = () => { document.getElementById(`plot-${i}`).innerHTML = lineChart(m.versions, select.value); };
    select.addEventListener("change", draw);
    draw();
  });
  document.getElementById("scatter").innerHTML = scatter(data.profiling);
}

function modelSection(model, i) {
  if (!model.versions.length) {
    return `<h2>${esc(model.name)}</h2><div class="note">No version registered yet. <code>make demo</code> (or <code>python model_registry/bootstrap.py</code>) registers the first champion; the retraining DAG adds challengers.</div>`;
  }
  const metrics = [...new Set(model.versions.flatMap(v => Object.keys(v.metrics)))].sort();
  const primary = metrics.includes(PRIMARY[model.name]) ? PRIMARY[model.name] : metrics[0];
  const rows = model.versions.slice().reverse().map(v => `<tr><td>v${esc(v.version)}</td><td>${v.aliases.map(a => `<span class="badge ${esc(a)}">${esc(a)}</span>`).join("")}</td>
      <td>${esc(when(v.created_at))}</td><td>${fmt(v.metrics[primary], 3)}</td><td class="muted" title="${esc(v.run_id || "")}">${esc((v.run_id || "").slice(0, 8))}</td></tr>`).join("");
  return `<h2>${esc(model.name)}</h2><div class="grid2"><div><table><tr><th>version</th><th>aliases</th><th>registered</th><th>${esc(primary)}</th><th>training run</th></tr>${rows}</table></div>
    <div><label class="muted">metric <select id="metric-${i}">${metrics.map(k => `<option${k === primary ? " selected" : ""}>${esc(k)}</option>`).join("")}</select></label>
    <div id="plot-${i}"></div></div></div>`;
}

function lineChart(versions, metric) {
  const points = versions.filter(v => v.metrics[metric] !== undefined).map(v => ({ x: v.created_at, y: v.metrics[metric], label: `v${v.version}`, champion: v.aliases.includes("champion") }));
  if (!points.length) return '<p class="muted">No version logged this metric.</p>';
  const W = 420, H = 180, P = 34;
  const xs = points.map(p => p.x), ys = points.map(p => p.y);
  const [x0, x1] = [Math.min(...xs), Math.max(...xs)], [y0, y1] = [Math.min(0, ...ys), 1.15 * Math.max(...ys) || 1];
  const sx = x => P + (x1 === x0 ? (W - 2 * P) / 2 : (x - x0) / (x1 - x0) * (W - 2 * P));
  const sy = y => H - P + (P - H) * (y - y0) / ((y1 - y0) || 1) + 6;
  const line = points.map(p => `${sx(p.x).toFixed(1)},${sy(p.y).toFixed(1)}`).join(" ");
  const dots = points.map(p => `<circle cx="${sx(p.x).toFixed(1)}" cy="${sy(p.y).toFixed(1)}" r="${p.champion ? 5 : 3}" fill="${p.champion ? "#15803d" : "#0284c7"}"><title>${esc(p.label)}: ${fmt(p.y, 4)}${p.champion ? " (champion)" : ""}</title></circle>
      <text x="${sx(p.x).toFixed(1)}" y="${(sy(p.y) - 8).toFixed(1)}" text-anchor="middle">${esc(p.label)}</text>`).join("");
  return `<svg class="chart" width="${W}" height="${H}" role="img" aria-label="${esc(metric)} by version">
    <line x1="${P}" y1="${H - P + 6}" x2="${W - P}" y2="${H - P + 6}" stroke="#d1d5db"/><line x1="${P}" y1="10" x2="${P}" y2="${H - P + 6}" stroke="#d1d5db"/>
    <text x="4" y="14">${fmt(y1, 3)}</text><text x="4" y="${H - P + 6}">${fmt(y0, 3)}</text><text x="${P}" y="${H - 8}">${esc(new Date(x0 * 1000).toLocaleDateString())}</text>
    <text x="${W - P}" y="${H - 8}" text-anchor="end">${esc(new Date(x1 * 1000).toLocaleDateString())}</text>
    <polyline fill="none" stroke="#0284c7" stroke-width="1.5" points="${line}"/>${dots}</svg>`;
}

function scatter(profiling) {
  const points = profiling.points.filter(p => p.predicted_util !== null && p.measured_util !== null);
  const skipped = profiling.without_gpu_measurement;
  const aside = skipped ? `<p class="muted">${skipped} recent profiling run(s) measured no GPU (CPU machine or declared GPUs) and are not plotted.</p>` : "";
  if (!points.length) {
    return `<div class="note">No profiling run has measured a GPU yet, so there is nothing to compare predictions with. Run jobs on a GPU machine (the profiling DAG, or <code>horus run --job …</code>), or import DCGM telemetry with <code>horus telemetry import</code>.</div>` + aside;
  }
  const W = 420, H = 320, P = 36, max = Math.max(100, ...points.map(p => Math.max(p.predicted_util, p.measured_util)));
  const s = v => P + v / max * (W - 2 * P), t = v => H - P - v / max * (H - 2 * P);
  const dots = points.map(p => `<circle cx="${s(p.predicted_util).toFixed(1)}" cy="${t(p.measured_util).toFixed(1)}" r="4" fill="${colour(p.measured_util)}" stroke="#0c4a6e">
      <title>${esc(p.name)} (${esc(p.model)}, ${esc(p.gpu_type)}): predicted ${fmt(p.predicted_util)} %, measured ${fmt(p.measured_util)} %</title></circle>`).join("");
  const errors = points.map(p => Math.abs(p.predicted_util - p.measured_util));
  const mae = errors.reduce((a, b) => a + b, 0) / errors.length;
  return `<svg class="chart" width="${W}" height="${H}" role="img" aria-label="predicted vs measured utilization">
    <line x1="${s(0)}" y1="${t(0)}" x2="${s(max)}" y2="${t(max)}" stroke="#9ca3af" stroke-dasharray="4 3"/>
    <line x1="${P}" y1="${H - P}" x2="${W - P}" y2="${H - P}" stroke="#d1d5db"/><line x1="${P}" y1="${P}" x2="${P}" y2="${H - P}" stroke="#d1d5db"/>
    <text x="${W / 2}" y="${H - 6}" text-anchor="middle">predicted utilization %</text><text x="10" y="${P - 10}">measured %</text>
    <text x="${W - P}" y="${H - P + 14}" text-anchor="end">${fmt(max)}</text><text x="${P - 4}" y="${P}" text-anchor="end">${fmt(max)}</text>${dots}</svg>
    <p class="muted">${points.length} run(s); mean absolute error ${fmt(mae, 1)} points; the dashed line is a perfect prediction.</p>` + aside;
}

// --- simulations ---------------------------------------------------------------------------------
// [metric, heading, how to show it]: durations as h/min/s, shares as %, counts as whole numbers
const SIM_COLUMNS = [
  ["makespan_s", "makespan", "duration"], ["avg_jct_s", "mean JCT", "duration"], ["p95_jct_s", "p95 JCT", "duration"],
  ["avg_wait_s", "mean wait", "duration"], ["gpu_util", "GPUs busy", "share"], ["summed_util", "summed util", "ratio"],
  ["avg_slowdown", "mean slowdown", "ratio"], ["p95_slowdown", "p95 slowdown", "ratio"], ["oom_events", "OOM crashes", "count"],
  ["finished", "finished", "count"], ["unfinished", "unfinished", "count"],
];

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  const s = Math.round(Number(seconds));
  if (s < 120) return `${s} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  if (s < 172800) return `${(s / 3600).toFixed(1)} h`;
  return `${(s / 86400).toFixed(1)} d`;
}

function metric(value, kind) {
  if (value === null || value === undefined) return "–";
  if (kind === "duration") return duration(value);
  if (kind === "share") return `${(100 * Number(value)).toFixed(1)} %`;
  if (kind === "count") return Math.round(Number(value)).toLocaleString("en-US");
  return Number(value).toFixed(2);
}

async function simulations() {
  let data;
  try { data = await api("simulations"); } catch (error) { showError(main, error); return; }
  status("MLflow experiment horus-simulations");
  if (!data.simulations.length) {
    main.innerHTML = `<div class="note">No simulation yet. Replay a trace through the placement profiles, e.g. <code>horus simulate --trace data/traces/gavel/7f04ca.trace --trace-format gavel --nodes 4 --gpu v100</code>; each run is logged to MLflow and shown here.</div>`;
    return;
  }
  main.innerHTML = data.simulations.map(sim => {
    const profiles = Object.keys(sim.metrics).filter(p => p !== "wall_s").sort();
    const columns = SIM_COLUMNS.filter(([key]) => profiles.some(p => sim.metrics[p][key] !== undefined));
    const rows = profiles.map(p => `<tr><td>${esc(p)}</td>${columns.map(([key, , kind]) => `<td class="num" data-metric="${key}" title="${esc(String(sim.metrics[p][key] ?? ""))}">${metric(sim.metrics[p][key], kind)}</td>`).join("")}</tr>`).join("");
    const plots = sim.artifacts.filter(a => a.endsWith(".png")).map(a => `<img class="plot" alt="${esc(a)} of ${esc(sim.name)}" src="${API}simulations/${esc(sim.run_id)}/artifacts/${esc(a)}">`).join("");
    return `<section class="simulation"><h2>${sim.url ? `<a target="_blank" rel="noopener" href="${esc(sim.url)}">${esc(sim.name)}</a>` : esc(sim.name)}</h2>
      <p class="muted">${esc(when(sim.started_at))} · ${esc(sim.params.cluster || "")} · trace ${esc(sim.params.trace || "")} (${esc(sim.params.trace_format || "")})</p>
      <div class="scroll"><table><tr><th>profile</th>${columns.map(([key, heading]) => `<th title="${key}">${esc(heading)}</th>`).join("")}</tr>${rows}</table></div>${plots}</section>`;
  }).join("");
}

document.querySelectorAll("#tabs a").forEach(a => {
  a.href = BASE + a.dataset.page;
  a.classList.toggle("active", a.dataset.page === PAGE);
});
({ cluster, queue, decisions, predictor, simulations })[PAGE]().catch(error => showError(main, error));
