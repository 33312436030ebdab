/* zqsync dashboard: polls /api/state every interval, the journals every few intervals. */
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
    const tbody = body("fleet"), durations = body("durations");
    for (const w of workers) {
      const procs = w.processes.length ? w.processes : [null];
      for (const p of procs) {
        const row = tbody.insertRow();
        row.dataset.endpoint = w.endpoint;
        cell(row, w.endpoint);
        cell(row, p ? p.state : w.state, "state-" + (p && w.state !== "stopping" ? p.state : w.state)).title = w.error || "";
        cell(row, p ? (p.prefork ? "supervisor pid " : "pid ") + p.pid : "");
        cell(row, p ? p.in_flight : "", "num");
        cell(row, p ? fixed(p.jobs_per_s, 1) : "", "num");
        cell(row, p ? fixed(p.calls_per_s, 1) : "", "num");
        cell(row, p ? duration(p.uptime) : "");
        cell(row, p ? p.counters.jobs_succeeded + p.counters.jobs_failed : "", "num jobs-done");
        cell(row, p ? p.counters.calls_received : "", "num");
        if (!p) continue;
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
        cell(row, c.in_flight, "num"); cell(row, ""); cell(row, ""); cell(row, duration(c.uptime));
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
    status.className = response.ok ? "" : "failed";
    status.textContent = response.ok ? path.slice(5) + " on " + answer.endpoint + ": " + JSON.stringify(answer.result)
                                     : (answer.error || response.statusText);
    refreshJournals();
  }

  function jobRow(tbody, endpoint, job, columns) {
    const row = tbody.insertRow();
    row.dataset.id = job.id;
    cell(row, endpoint); cell(row, job.id); cell(row, job.task); cell(row, job.args);
    columns.forEach(([text, cls]) => cell(row, text, cls));
    return row.insertCell();
  }

  async function refreshJournals() {
    const [, counts] = await api("/api/jobs");
    const [, dead] = await api("/api/jobs?state=dead");
    const [, pending] = await api("/api/jobs?state=pending");
    const ctable = body("journal-counts"), dtable = body("dead"), ptable = body("pending");
    for (const answer of counts.workers) {
      const row = ctable.insertRow(), c = (answer.result || {}).counts || {};
      row.dataset.endpoint = answer.endpoint;
      cell(row, answer.endpoint);
      if (answer.error) { cell(row, answer.error, "error").colSpan = 6; continue; }
      cell(row, c.pending || 0, "num"); cell(row, answer.result.running.length, "num"); cell(row, c.dead || 0, "num");
      cell(row, c.done || 0, "num"); cell(row, c.cancelled || 0, "num");
      if (c.dead) button(row.insertCell(), "Requeue all dead", () =>
        act("/api/requeue", { endpoint: answer.endpoint }, "Requeue all " + c.dead + " dead jobs of " + answer.endpoint + "?"));
    }
    for (const answer of dead.workers) {
      for (const job of (answer.result || {}).rows || []) {
        const td = jobRow(dtable, answer.endpoint, job, [[job.attempts, "num"], [job.error, "error"]]);
        td.previousSibling.title = job.error || "";
        button(td, "Requeue", () => act("/api/requeue", { endpoint: answer.endpoint, ids: [job.id] }, "Requeue job " + job.id + "?"));
      }
    }
    for (const answer of pending.workers) {
      for (const job of (answer.result || {}).rows || []) {
        const due = job.due && job.due * 1000 > Date.now() ? new Date(job.due * 1000).toLocaleString() : "now";
        const td = jobRow(ptable, answer.endpoint, job, [[due]]);
        button(td, "Cancel", () => act("/api/cancel", { endpoint: answer.endpoint, id: job.id }, "Cancel job " + job.id + "?"));
      }
    }
  }

  async function refresh() {
    try {
      const [, state] = await api("/api/state");
      drawFleet(state.workers);
      drawHistory(state.history);
      document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
      if (polls++ % JOURNAL_EVERY === 0) await refreshJournals();
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
      act("/api/purge", { endpoint: w.dataset.endpoint, older_than: hours * 3600 }, null);
    }
  };
  document.getElementById("lookup").onsubmit = async (event) => {
    event.preventDefault();
    const id = document.getElementById("lookup-id").value.trim();
    const [response, answer] = await api("/api/job/" + encodeURIComponent(id));
    document.getElementById("lookup-result").textContent = response.ok
      ? JSON.stringify(answer.found.map((a) => a.result), null, 2) : "no worker knows job " + id;
  };
  refresh();
})();
