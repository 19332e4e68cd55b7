// The rlfleet dashboard: polls the coordinator's JSON API and draws it.
//
// - /api/v1/status every second: the run, workers, tasks, buffers, ledger, evaluations.
// - /api/v1/records with a cursor every two seconds: only the log records written since the
//   last poll, appended to the curves (a new `epoch` means the coordinator restarted: the
//   curves are rebuilt from its feed).
// - Buttons POST to /api/v1/run/{pause,resume,stop} and /api/v1/scale.
//
// Every request carries the token kept in sessionStorage. A 401 hides the board, forgets
// what it showed and asks for the token. Text from the run (worker URLs, task errors) goes
// into the page with textContent only, never as HTML.
(() => {
  "use strict";

  const API = "/api/v1";
  const TOKEN_KEY = "rlfleet.token";
  const STATUS_MS = 1000;
  const RECORDS_MS = 2000;
  const RECORD_SCOPES = "collect,eval,train";

  // Each chart: which record keys it draws, and on which axis.
  const CHARTS = {
    returns: {
      el: "chart-returns",
      series: [
        { key: "eval/deterministic/return_mean", label: "eval (deterministic)", color: "#2563eb" },
        { key: "eval/stochastic/return_mean", label: "eval (stochastic)", color: "#7c3aed" },
        { key: "collect/return_mean", label: "collect", color: "#16a34a" },
      ],
    },
    rates: {
      el: "chart-rates",
      series: [
        { key: "collect/env_steps_per_s", label: "env steps/s", color: "#0891b2" },
        { key: "train/updates_per_s", label: "updates/s", color: "#ea580c", axis: "y2" },
      ],
    },
    train: {
      el: "chart-train",
      series: [
        { key: "train/loss", label: "loss", color: "#dc2626" },
        { key: "train/q_mean", label: "Q mean", color: "#0d9488", axis: "y2" },
        { key: "train/entropy", label: "entropy", color: "#9333ea", axis: "y2" },
      ],
    },
  };

  const $ = (id) => document.getElementById(id);
  const state = {
    token: sessionStorage.getItem(TOKEN_KEY),
    signedIn: false,
    epoch: null,
    cursor: 0,
    points: {},          // record key -> Map(step -> value)
    plots: {},           // chart name -> uPlot
    dirty: false,
    workerSteps: {},     // worker id -> [seconds, env steps] of recent polls
    generation: 0,       // bumped on sign-in/out: stale poll loops stop
    status: null,
  };

  class Unauthorized extends Error {}

  async function api(path, options = {}) {
    const headers = { Accept: "application/json", ...(options.headers || {}) };
    if (state.token) headers.Authorization = `Bearer ${state.token}`;
    const resp = await fetch(API + path, { ...options, headers, cache: "no-store" });
    if (resp.status === 401) throw new Unauthorized("the coordinator refused the token");
    let body = null;
    try { body = await resp.json(); } catch (_) { body = null; }
    if (!resp.ok) {
      const why = body && body.error ? body.error : `${resp.status} ${resp.statusText}`;
      throw new Error(why);
    }
    return body;
  }

  // -- signing in -------------------------------------------------------------------------

  function showLogin(message) {
    state.signedIn = false;
    state.generation += 1;
    forget();
    $("board").hidden = true;
    $("sign-out").hidden = true;
    $("login").hidden = false;
    $("login-error").textContent = message || "";
    $("run-state").textContent = "locked";
    $("run-state").className = "badge";
    $("run-name").textContent = "";
    $("run-reason").textContent = "";
    $("connection").textContent = "";
    $("token-input").value = "";
    $("token-input").focus();
  }

  function forget() {
    // Nothing the board showed stays in the page once the token is refused.
    for (const id of ["summary", "evaluations", "ledger", "workers", "buffers", "tasks",
                      "group", "league"]) {
      $(id).replaceChildren();
    }
    for (const plot of Object.values(state.plots)) plot.destroy();
    state.plots = {};
    state.points = {};
    state.epoch = null;
    state.cursor = 0;
    state.status = null;
    state.workerSteps = {};
    for (const chart of Object.values(CHARTS)) $(chart.el).dataset.points = "0";
  }

  function start() {
    state.generation += 1;
    const generation = state.generation;
    loop(generation, pollStatus, STATUS_MS);
    loop(generation, pollRecords, RECORDS_MS);
  }

  async function loop(generation, poll, every) {
    while (generation === state.generation) {
      try {
        await poll();
        $("connection").textContent = `updated ${new Date().toLocaleTimeString()}`;
      } catch (err) {
        if (err instanceof Unauthorized) {
          showLogin(state.token ? "The coordinator refused this token." :
            "Enter the cluster's API token to see this run.");
          return;
        }
        $("connection").textContent = `coordinator unreachable: ${err.message}`;
        if (poll === pollStatus) showUnreachable();
      }
      await new Promise((r) => setTimeout(r, every));
    }
  }

  // The coordinator stopped answering (the run ended, or it is restarting): the figures
  // stay as they were last seen, the buttons go until it answers again.
  function showUnreachable() {
    const badge = $("run-state");
    badge.textContent = "unreachable";
    badge.className = "badge";
    for (const id of ["pause", "resume", "stop", "scale"]) $(id).disabled = true;
    document.body.dataset.state = "unreachable";
  }

  function onSignedIn() {
    if (state.signedIn) return;
    state.signedIn = true;
    $("login").hidden = true;
    $("board").hidden = false;
    $("sign-out").hidden = !state.token;
  }

  // -- status -----------------------------------------------------------------------------

  async function pollStatus() {
    const s = await api("/status");
    onSignedIn();
    state.status = s;
    renderRun(s);
    renderAlerts(s.alerts || []);
    renderSummary(s);
    renderEvaluations(s);
    renderLedger(s.ledger);
    renderWorkers(s.workers);
    renderBuffers(s.buffers);
    renderTasks(s.tasks);
    renderGroup(s.learner_group);
    renderLeague(s.league);
  }

  function fmt(value, digits = 1) {
    if (value === null || value === undefined || Number.isNaN(value)) return "–";
    if (typeof value !== "number") return String(value);
    if (Number.isInteger(value)) return value.toLocaleString("en-US");
    return value.toLocaleString("en-US", { maximumFractionDigits: digits,
                                           minimumFractionDigits: digits });
  }

  function duration(seconds) {
    if (seconds === null || seconds === undefined) return "–";
    const s = Math.floor(seconds);
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
    return h ? `${h}h ${m}m` : m ? `${m}m ${r}s` : `${seconds.toFixed(1)} s`;
  }

  function el(tag, text, cls) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = text;
    if (cls) node.className = cls;
    return node;
  }

  // A table from a header and rows of cells; a cell is text, a number (right-aligned) or a
  // DOM node. `rowClass(i)` may give a row a class.
  function table(id, header, rows, rowClass) {
    const thead = el("thead");
    const hr = el("tr");
    header.forEach((h, i) => hr.append(el("th", h, rows.length && typeof rows[0][i] === "number"
      ? "num" : "")));
    thead.append(hr);
    const tbody = el("tbody");
    rows.forEach((row, r) => {
      const tr = el("tr", null, rowClass ? rowClass(r) : "");
      for (const cell of row) {
        if (cell instanceof Node) {
          const td = el("td");
          td.append(cell);
          tr.append(td);
        } else {
          tr.append(el("td", typeof cell === "number" ? fmt(cell) : (cell ?? "–"),
            typeof cell === "number" ? "num" : ""));
        }
      }
      tbody.append(tr);
    });
    if (!rows.length) {
      const tr = el("tr");
      const td = el("td", "none", "muted");
      td.colSpan = header.length;
      tr.append(td);
      tbody.append(tr);
    }
    $(id).replaceChildren(thead, tbody);
  }

  function renderRun(s) {
    const run = s.run;
    $("run-name").textContent = run.name;
    const badge = $("run-state");
    badge.textContent = run.solved ? `${run.state} · solved` : run.state;
    badge.className = `badge ${run.state}`;
    const where = run.slurm ? ` · coordinator ${slurmText(run)}` : "";
    $("run-reason").textContent = (run.stop_reason || "") + where;
    const stopped = run.state === "stopped";
    $("pause").disabled = stopped || run.paused;
    $("resume").disabled = stopped || !run.paused;
    $("stop").disabled = stopped;
    $("scale").disabled = stopped;
    document.body.dataset.state = run.state;  // for tests and user styles
  }

  // What went wrong quietly (NaN learner metrics, a learner starved of data): above the
  // cards, one line each, gone when the coordinator no longer reports it.
  function renderAlerts(alerts) {
    const box = $("alerts");
    box.replaceChildren(...alerts.map((a) => {
      const p = el("p", a.message, "alert");
      p.dataset.kind = a.kind;
      return p;
    }));
    box.hidden = !alerts.length;
  }

  function card(label, value) {
    const div = el("div", null, "card");
    div.append(el("div", label, "label"), el("div", value, "value"));
    return div;
  }

  function renderSummary(s) {
    const c = s.counters, r = s.rates, run = s.run;
    const alive = (role) => s.workers.filter((w) => w.role === role && w.state === "alive").length;
    $("summary").replaceChildren(
      card("env steps", fmt(c.env_steps)),
      card("env steps/s", fmt(r.env_steps_per_s)),
      card("train iterations", fmt(c.train_iterations)),
      card("updates/s", fmt(r.train_iterations_per_s)),
      card("policy version", fmt(c.policy_version)),
      card("episodes", fmt(c.episodes)),
      card("collectors", `${alive("collector")}` +
        (run.collectors_desired !== null ? ` / ${run.collectors_desired}` : "")),
      card("learners", `${alive("learner")}` +
        (run.learners_desired !== null ? ` / ${run.learners_desired}` : "")),
      card("wall time", duration(run.wall_seconds)),
      card("stop value", run.stop_value === null ? "–" : fmt(run.stop_value)),
    );
  }

  function evalRow(name, e) {
    if (!e) return [name, "–", "–", "–", "–", "–", "–"];
    const det = e.deterministic, sto = e.stochastic;
    const ret = (m) => (m ? `${fmt(m.return_mean)} ± ${fmt(m.return_std)}` : "–");
    return [name, e.policy_version, e.env_steps, e.train_iterations, ret(det), ret(sto),
            e.episodes];
  }

  function renderEvaluations(s) {
    table("evaluations",
      ["", "policy", "env step", "train it.", "deterministic", "stochastic", "episodes"],
      [evalRow("last", s.latest_evaluation), evalRow("best policy", s.best_evaluation)]);
    // Self-play: win rates against each opponent of the last evaluation.
    const battles = (s.latest_evaluation && s.latest_evaluation.battles) || {};
    const names = Object.keys(battles).filter((k) => !k.includes("/"));
    if (names.length) {
      const tbody = $("evaluations").querySelector("tbody");
      for (const name of names) {
        const b = battles[name];
        const tr = el("tr");
        tr.append(el("td", `vs ${name}`), el("td", `win ${fmt(b.win, 3)}`),
          el("td", `draw ${fmt(b.draw, 3)}`), el("td", `loss ${fmt(b.loss, 3)}`),
          el("td", `${fmt(b.games)} games`));
        tbody.append(tr);
      }
    }
  }

  function renderLedger(l) {
    const dropped = Object.entries(l.dropped || {});
    table("ledger", ["chunks", ""], [
      ["acknowledged", l.acknowledged],
      ["in buffers", l.in_buffers],
      ["consumed", l.consumed],
      ["evicted", l.evicted],
      ["dropped", dropped.reduce((sum, [, v]) => sum + v, 0)],
      ...dropped.map(([why, v]) => [`  dropped: ${why}`, v]),
      ["orphans deleted", l.orphans_deleted],
      ["balanced", l.balanced ? "yes" : "NO: chunks unaccounted for"],
    ]);
  }

  // A collector's env steps/s over the last few seconds of its heartbeats (its env step
  // count moves once per heartbeat: one poll apart the rate would jump about).
  const RATE_WINDOW_S = 5;

  function workerRate(w, now) {
    const st = w.status || {};
    if (w.role === "learner") return st.updates_per_s !== undefined
      ? `${fmt(st.updates_per_s)} updates/s` : "–";
    if (st.env_steps === undefined || w.state !== "alive") return "–";
    const seen = state.workerSteps[w.worker_id] || [];
    seen.push([now, st.env_steps]);
    while (seen.length > 2 && now - seen[1][0] >= RATE_WINDOW_S) seen.shift();
    state.workerSteps[w.worker_id] = seen;
    const [t0, s0] = seen[0];
    if (now - t0 < 1) return "–";
    return `${fmt(Math.max((st.env_steps - s0) / (now - t0), 0))} env steps/s`;
  }

  const GIB = 2 ** 30;

  // A worker's GPUs in a few words, grouped by kind: "2x NVIDIA H100 80GB HBM3 (80 GiB)".
  function gpuText(gpus) {
    if (!gpus.length) return "none";
    const counts = new Map();
    for (const g of gpus) {
      const key = `${g.name} (${Math.round(g.memory_bytes / GIB)} GiB)`;
      counts.set(key, (counts.get(key) || 0) + 1);
    }
    return [...counts].map(([key, n]) => `${n}x ${key}`).join(", ");
  }

  // What the worker reported having when it registered: host, cores, memory, GPUs.
  function resourceCells(res) {
    if (!res) return ["–", "–", "–", "–"];
    return [res.hostname, res.cpu_cores, `${fmt(res.memory_bytes / GIB)} GiB`,
      gpuText(res.gpus || [])];
  }

  // Where Slurm runs the worker: "job 4242 on n2"; "–" outside Slurm.
  function slurmText(res) {
    const slurm = res && res.slurm;
    if (!slurm) return "–";
    const again = slurm.restart_count ? `, requeued ${slurm.restart_count}x` : "";
    return `job ${slurm.job_id} on ${slurm.node}${again}`;
  }

  // The epsilon a collector explores with (Ape-X: its slot's fixed one), from its heartbeat.
  function epsilonText(w) {
    const eps = (w.status || {}).epsilon;
    return eps === undefined ? "–" : Number(eps.toPrecision(4)).toString();
  }

  function renderWorkers(workers) {
    const now = performance.now() / 1000;
    const rows = workers.map((w) => [w.worker_id, w.role, w.state, workerRate(w, now),
      w.status && w.status.policy_version !== undefined ? w.status.policy_version : "–",
      epsilonText(w), w.chunks_accepted, `${fmt(w.seconds_since_heartbeat)} s`, w.url,
      ...resourceCells(w.resources), slurmText(w.resources)]);
    table("workers", ["worker", "role", "state", "rate", "policy", "eps", "chunks", "heartbeat",
      "url", "host", "cpus", "memory", "GPUs", "slurm"], rows, (i) => workers[i].state);
  }

  function fillBar(size, capacity) {
    const wrap = el("span");
    const bar = el("span", null, "fill");
    const inner = el("span");
    const ratio = capacity > 0 ? Math.min(size / capacity, 1) : 0;
    inner.style.width = `${(ratio * 100).toFixed(1)}%`;
    bar.append(inner);
    wrap.append(bar, document.createTextNode(`${(ratio * 100).toFixed(0)}%`));
    return wrap;
  }

  function renderBuffers(buffers) {
    const rows = Object.entries(buffers).map(([name, b]) => [name, b.kind,
      fillBar(b.size, b.capacity), b.size, b.capacity, b.inserts_per_s, b.samples_per_s,
      b.use_count_mean, b.policy_lag_mean]);
    table("buffers", ["buffer", "kind", "fill", "items", "capacity", "inserts/s", "samples/s",
      "uses (mean)", "policy lag"], rows);
  }

  function renderTasks(tasks) {
    const rows = tasks.map((t) => [t.task_id, t.kind, t.worker_id || "–", t.state,
      t.reassignments, t.error || ""]);
    table("tasks", ["task", "kind", "worker", "state", "reassigned", "error"], rows);
  }

  function renderGroup(g) {
    const rows = (g.ranks || []).map((r) => [r.rank, r.worker_id, r.updates_per_s,
      r.allreduce_ms]);
    table("group", ["rank", "learner", "updates/s", "allreduce ms"], rows);
    const caption = el("caption",
      `generation ${g.generation}, world size ${g.world_size}, ${g.reformations} re-formations`,
      "muted");
    $("group").prepend(caption);
  }

  function renderLeague(league) {
    $("league-panel").hidden = !league;
    if (!league) return;
    const probs = league.probabilities || {};
    const rows = league.players.map((p) => [p.name, p.kind, p.ordinal, p.mu, p.sigma, p.games,
      probs[p.name] !== undefined ? `${(probs[p.name] * 100).toFixed(1)}%` : "–"]);
    table("league", ["player", "kind", "rating (ordinal)", "mu", "sigma", "games",
      "chance next"], rows);
  }

  // -- controls ---------------------------------------------------------------------------

  async function control(label, path, body) {
    const msg = $("control-message");
    try {
      const options = { method: "POST" };
      if (body) {
        options.headers = { "Content-Type": "application/json" };
        options.body = JSON.stringify(body);
      }
      const run = await api(path, options);
      msg.textContent = `${label}: the run is ${run.state}`;
      msg.className = "muted";
      pollStatus().catch(() => {});
    } catch (err) {
      if (err instanceof Unauthorized) {
        showLogin("The coordinator refused this token.");
        return;
      }
      msg.textContent = `${label} failed: ${err.message}`;
      msg.className = "error";
    }
  }

  function wireControls() {
    $("pause").addEventListener("click", () => control("pause", "/run/pause"));
    $("resume").addEventListener("click", () => control("resume", "/run/resume"));
    $("stop").addEventListener("click", () => {
      if (window.confirm("Stop this run? The coordinator snapshots and every worker exits.")) {
        control("stop", "/run/stop");
      }
    });
    $("scale-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const body = {};
      const collectors = $("scale-collectors").value.trim();
      const learners = $("scale-learners").value.trim();
      if (collectors !== "") body.collectors = Number(collectors);
      if (learners !== "") body.learners = Number(learners);
      if (!Object.keys(body).length) {
        $("control-message").textContent = "scale: give collectors, learners or both";
        $("control-message").className = "error";
        return;
      }
      control("scale", "/scale", body);
    });
    $("login-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const token = $("token-input").value.trim();
      if (!token) return;
      state.token = token;
      sessionStorage.setItem(TOKEN_KEY, token);
      $("login-error").textContent = "";
      start();
    });
    $("sign-out").addEventListener("click", () => {
      sessionStorage.removeItem(TOKEN_KEY);
      state.token = null;
      showLogin("Token forgotten.");
    });
  }

  // -- curves -----------------------------------------------------------------------------

  async function pollRecords() {
    for (let pages = 0; pages < 50; pages++) {
      const page = await api(`/records?after=${state.cursor}&scope=${RECORD_SCOPES}&limit=5000`);
      onSignedIn();
      if (state.epoch !== page.epoch) {
        // A new coordinator process (a restart): its feed starts again from the kept history.
        const fresh = state.epoch === null;
        state.epoch = page.epoch;
        state.points = {};
        state.cursor = 0;
        if (!fresh) continue;
      }
      for (const record of page.records) {
        for (const [key, value] of Object.entries(record.values)) {
          let series = state.points[key];
          if (!series) { series = new Map(); state.points[key] = series; }
          series.set(record.step, value);
        }
      }
      if (page.records.length) state.dirty = true;
      state.cursor = page.next;
      if (!page.more) break;
    }
    if (state.dirty) drawCharts();
  }

  function chartData(chart) {
    const steps = new Set();
    for (const s of chart.series) {
      const pts = state.points[s.key];
      if (pts) for (const step of pts.keys()) steps.add(step);
    }
    const xs = Array.from(steps).sort((a, b) => a - b);
    let count = 0;
    const ys = chart.series.map((s) => {
      const pts = state.points[s.key];
      return xs.map((x) => {
        const v = pts ? pts.get(x) : undefined;
        if (v === undefined) return null;
        count += 1;
        return v;
      });
    });
    return { data: [xs, ...ys], count };
  }

  function makePlot(name, chart, data) {
    const node = $(chart.el);
    const width = Math.max(node.clientWidth, 300);
    const opts = {
      width, height: 220,
      scales: { x: { time: false } },
      axes: [
        { label: "env step", size: 40 },
        { scale: "y" },
        ...(chart.series.some((s) => s.axis === "y2")
          ? [{ scale: "y2", side: 1, grid: { show: false } }] : []),
      ],
      series: [
        { label: "env step" },
        ...chart.series.map((s) => ({ label: s.label, stroke: s.color, width: 1.5,
          scale: s.axis || "y", spanGaps: true, points: { show: false } })),
      ],
      legend: { live: true },
    };
    node.replaceChildren();
    state.plots[name] = new window.uPlot(opts, data, node);
  }

  function drawCharts() {
    if (!window.uPlot) return;  // the library is still loading: the next poll draws
    state.dirty = false;
    for (const [name, chart] of Object.entries(CHARTS)) {
      const { data, count } = chartData(chart);
      $(chart.el).dataset.points = String(count);
      if (!state.plots[name]) makePlot(name, chart, data);
      else state.plots[name].setData(data);
    }
  }

  window.addEventListener("resize", () => {
    for (const [name, chart] of Object.entries(CHARTS)) {
      const plot = state.plots[name];
      if (plot) plot.setSize({ width: Math.max($(chart.el).clientWidth, 300), height: 220 });
    }
  });

  // -- start ------------------------------------------------------------------------------

  wireControls();
  start();
})();
