/* zqsync dashboard: polls /api/v1/state every interval, the jobs and journals every few intervals. */
"use strict";
(function () {
  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  const interval = 1000 * parseFloat(document.querySelector('meta[name="interval"]').content);
  const JOURNAL_EVERY = 3;
  let polls = 0;

  function cell(row, text, cls) {
    const td = row.insertCell();
    td.textContent = text === null || text === undefined ? "" : String(text);
    if (cls) td.className = cls;
    return td;
  }
  function fixed(value, digits) { return typeof value === "number" ? value.toFixed(digits) : ""; }
  function duration(seconds) {
    if (typeof seconds !== "number") return "";
    const d = Math.floor(seconds / 86400), h = Math.floor(seconds % 86400 / 3600), m = Math.floor(seconds % 3600 / 60);
    return d ? d + "d " + h + "h" : h ? h + "h " + m + "m" : m + "m " + Math.floor(seconds % 60) + "s";
  }
  function body(table) { const tbody = document.querySelector("#" + table + " tbody"); tbody.replaceChildren(); return tbody; }
  function button(td, label, onclick) {
    const b = document.createElement("button"); b.textContent = label; b.onclick = onclick; td.appendChild(b); return b;
  }

  function chart(id, series) {
    const el = document.getElementById(id);
    const values = (u, ticks) => ticks.map((v) => +v.toPrecision(3));
    const opts = { width: 560, height: 220, series: [{}].concat(series), axes: [{}, { size: 60, values: values }] };
    return new uPlot(opts, [[]].concat(series.map(() => [])), el);
  }
  const throughput = chart("chart-throughput", [
    { label: "jobs/s", stroke: "#1f77b4", width: 2 }, { label: "calls/s", stroke: "#ff7f0e", width: 2 }]);
  const latency = chart("chart-latency", [
    { label: "p50", stroke: "#2ca02c", width: 2 }, { label: "p99", stroke: "#d62728", width: 2 }]);
  window.zqsyncCharts = { throughput: throughput, latency: latency };  // for scripts and the browser test

  function drawFleet(workers) {
    const tbody = body("fleet"), durations = body("durations"), queues = body("queues");
    for (const w of workers) {
      const procs = w.processes.length ? w.processes : [null];
      for (const p of procs) {
        const row = tbody.insertRow();
        row.dataset.endpoint = w.endpoint;
        cell(row, w.endpoint);
        cell(row, p ? p.state : w.state, "state-" + (p && w.state !== "stopping" ? p.state : w.state)).title = w.error || "";
        cell(row, p ? (p.prefork ? "supervisor pid " : "pid ") + p.pid : "");
        cell(row, p ? p.in_flight : "", "num");
        cell(row, p ? p.queued : "", "num queued");
        cell(row, p ? p.delayed : "", "num");
        cell(row, p ? fixed(p.jobs_per_s, 1) : "", "num");
        cell(row, p ? fixed(p.calls_per_s, 1) : "", "num");
        cell(row, p ? duration(p.uptime) : "");
        cell(row, p ? p.counters.jobs_succeeded + p.counters.jobs_failed : "", "num jobs-done");
        cell(row, p ? p.counters.calls_received : "", "num");
        if (!p) continue;
        for (const [name, q] of Object.entries(p.queues)) {
          const qrow = queues.insertRow();
          qrow.dataset.queue = name;
          [w.endpoint, name, q.endpoint].forEach((t) => cell(qrow, t));
          cell(qrow, q.concurrency, "num"); cell(qrow, q.running, "num"); cell(qrow, q.waiting ? "yes" : "no");
        }
        for (const [task, d] of Object.entries(p.durations)) {
          const drow = durations.insertRow();
          [w.endpoint, "pid " + p.pid, task].forEach((t) => cell(drow, t));
          cell(drow, d.count, "num"); cell(drow, fixed(1000 * d.p50, 3), "num"); cell(drow, fixed(1000 * d.p99, 3), "num");
        }
      }
      for (const c of w.children) {
        const row = tbody.insertRow();
        row.dataset.child = w.endpoint;
        cell(row, "");
        cell(row, c.state, "state-" + c.state);
        cell(row, "child pid " + c.pid);
        cell(row, c.in_flight, "num"); [1, 2, 3, 4].forEach(() => cell(row, "")); cell(row, duration(c.uptime));
        cell(row, c.jobs_done, "num"); cell(row, c.calls, "num");
      }
    }
  }

  function drawHistory(history) {
    const t = history.map((s) => s.t);
    throughput.setData([t, history.map((s) => s.jobs_per_s), history.map((s) => s.calls_per_s)]);
    latency.setData([t, history.map((s) => 1000 * s.p50), history.map((s) => 1000 * s.p99)]);
  }

  async function api(path, options) {
    const response = await fetch(path, Object.assign({ credentials: "same-origin" }, options || {}));
    if (response.status === 401) { window.location = "/login"; throw new Error("logged out"); }
    return [response, await response.json()];
  }

  async function act(path, payload, question) {
    if (question && !window.confirm(question)) return;
    const status = document.getElementById("action-result");
    const [response, answer] = await api(path, {
      method: "POST", headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf },
      body: JSON.stringify(payload) });
    status.className = response.ok && !answer.why_not ? "" : "failed";
    status.textContent = response.ok ? answer.endpoint + ": " + answer.did + (answer.why_not ? " (" + answer.why_not + ")" : "")
                                     : (answer.error || response.statusText);
    refreshJobs();
    refreshJournals();
  }

  function since(epoch) { return typeof epoch === "number" ? new Date(epoch * 1000).toLocaleTimeString() : ""; }

  async function refreshJobs() {
    const query = new URLSearchParams({ limit: "50" });
    const task = document.getElementById("filter-task").value.trim();
    const state = document.getElementById("filter-state").value;
    const ago = document.getElementById("filter-since").value;
    if (task) query.set("task", task);
    if (state) query.set("state", state);
    const [, recent] = await api("/api/v1/recent?" + query);
    const [, running] = await api("/api/v1/recent?state=running&limit=1000");
    const rtable = body("running"), ftable = body("recent");
    for (const answer of running.workers) {
      const result = answer.result;
      if (!result) continue;
      for (const job of result.running) {
        const row = rtable.insertRow();
        row.dataset.id = job.id;
        [answer.endpoint, result.pid, job.id, job.task, job.args].forEach((t) => cell(row, t));
        cell(row, job.attempts, "num"); cell(row, fixed(job.runtime, 1) + " s", "num");
        cell(row, job.confirmed ? "confirmed" : "plain");
        button(row.insertCell(), "Cancel", () => act("/api/v1/cancel", { endpoint: answer.endpoint, id: job.id },
                                                     "Cancel running job " + job.id + " (" + job.task + ")?"));
      }
    }
    for (const answer of recent.workers) {
      const result = answer.result;
      if (!result) continue;
      const cutoff = ago ? result.now - parseFloat(ago) : null;
      for (const job of result.finished) {
        if (cutoff !== null && job.finished_at < cutoff) continue;
        const row = ftable.insertRow();
        row.dataset.id = job.id; row.dataset.state = job.state;
        [answer.endpoint, result.pid, job.id, job.task, job.args].forEach((t) => cell(row, t));
        cell(row, job.state, "state-" + job.state);
        cell(row, job.error || job.result, job.error ? "error" : "").title = job.error || job.result || "";
        cell(row, fixed(1000 * job.runtime, 1) + " ms", "num"); cell(row, since(job.finished_at));
      }
    }
  }

  function jobRow(tbody, endpoint, job, columns) {
    const row = tbody.insertRow();
    row.dataset.id = job.id;
    cell(row, endpoint); cell(row, job.id); cell(row, job.task); cell(row, job.args);
    columns.forEach(([text, cls]) => cell(row, text, cls));
    return row.insertCell();
  }

  async function refreshJournals() {
    const [, counts] = await api("/api/v1/jobs");
    const [, dead] = await api("/api/v1/jobs?state=dead");
    const [, pending] = await api("/api/v1/jobs?state=pending");
    const [, scheduled] = await api("/api/v1/jobs?state=scheduled");
    const ctable = body("journal-counts"), dtable = body("dead"), ptable = body("pending");
    for (const answer of counts.workers) {
      const row = ctable.insertRow(), c = (answer.result || {}).counts || {};
      row.dataset.endpoint = answer.endpoint;
      cell(row, answer.endpoint);
      if (answer.error) { cell(row, answer.error, "error").colSpan = 7; continue; }
      for (const state of ["pending", "scheduled", "running", "dead", "done", "cancelled"]) cell(row, c[state] || 0, "num");
      if (c.dead) button(row.insertCell(), "Requeue all dead", () =>
        act("/api/v1/requeue", { endpoint: answer.endpoint, as_of: answer.result.now },
            "Requeue all " + c.dead + " dead jobs of " + answer.endpoint + "?"));
    }
    for (const answer of dead.workers) {
      for (const job of (answer.result || {}).rows || []) {
        const td = jobRow(dtable, answer.endpoint, job, [[job.attempts, "num"], [job.error, "error"]]);
        td.previousSibling.title = job.error || "";
        button(td, "Requeue", () => act("/api/v1/requeue", { endpoint: answer.endpoint, ids: [job.id], as_of: answer.result.now },
                                        "Requeue job " + job.id + "?"));
      }
    }
    for (const answer of pending.workers.concat(scheduled.workers)) {
      for (const job of (answer.result || {}).rows || []) {
        const due = job.state === "scheduled" && job.due ? new Date(job.due * 1000).toLocaleString() : "now";
        const td = jobRow(ptable, answer.endpoint, job, [[job.state, "state-" + job.state], [due]]);
        button(td, "Cancel", () => act("/api/v1/cancel", { endpoint: answer.endpoint, id: job.id }, "Cancel job " + job.id + "?"));
      }
    }
  }

  async function refresh() {
    try {
      const [, state] = await api("/api/v1/state");
      drawFleet(state.workers);
      drawHistory(state.history);
      document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
      if (polls++ % JOURNAL_EVERY === 0) { await refreshJobs(); await refreshJournals(); }
    } catch (err) {
      document.getElementById("updated").textContent = "update failed: " + err;
    } finally {
      setTimeout(refresh, interval);
    }
  }

  document.getElementById("purge").onclick = () => {
    const hours = parseFloat(document.getElementById("purge-hours").value);
    if (!window.confirm("Delete dead jobs older than " + hours + " hours on every worker?")) return;
    for (const w of document.querySelectorAll("#journal-counts tbody tr")) {
      act("/api/v1/purge", { endpoint: w.dataset.endpoint, older_than: hours * 3600 }, null);
    }
  };
  document.getElementById("recent-filter").onsubmit = (event) => { event.preventDefault(); refreshJobs(); };
  document.getElementById("lookup").onsubmit = async (event) => {
    event.preventDefault();
    const id = document.getElementById("lookup-id").value.trim();
    const [response, answer] = await api("/api/v1/job/" + encodeURIComponent(id));
    document.getElementById("lookup-result").textContent = response.ok
      ? JSON.stringify(answer.found.map((a) => a.result), null, 2) : "no worker knows job " + id;
  };
  refresh();
})();
