// shardgate console: light JavaScript over the gate's JSON APIs (no framework, no CDN).
"use strict";
const sg = (() => {
  const $ = (sel, root = document) => root.querySelector(sel);
  const el = (tag, attrs = {}, ...kids) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (k === "class") e.className = v; else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else if (v !== undefined && v !== null) e.setAttribute(k, v);
    }
    for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
    return e;
  };
  async function api(method, url, body) {
    const r = await fetch(url, {method, headers: {"Content-Type": "application/json"},
                                 body: body === undefined ? undefined : JSON.stringify(body)});
    const data = await r.json().catch(() => ({}));
    if (!r.ok) { const err = new Error(data.message || r.statusText); err.data = data; throw err; }
    return data;
  }

  // ---- small charts (inline SVG, drawn here: no library, no CDN) ----------------
  const SVG = "http://www.w3.org/2000/svg";
  const COLORS = ["#2f6fde", "#d9480f", "#2b8a3e", "#862e9c"];
  const svgEl = (tag, attrs) => {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    return e;
  };
  const fmt = (v) => v === null || v === undefined ? "–"
    : Math.abs(v) >= 100 ? v.toFixed(0) : Math.abs(v) >= 10 ? v.toFixed(1) : v.toFixed(2);
  // A line chart of ``series`` ([{name, values}], null: no value) scaled to its maximum.
  function chart(title, series, opts = {}) {
    const W = 240, H = 60, unit = opts.unit || "";
    const values = series.flatMap(s => s.values.filter(v => v !== null && v !== undefined));
    const max = Math.max(0, ...values);
    const top = max > 0 ? max * 1.15 : 1;
    const svg = svgEl("svg", {viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", class: "plot"});
    svg.append(svgEl("line", {x1: 0, y1: H - 0.5, x2: W, y2: H - 0.5, class: "axis"}));
    const caption = el("figcaption", {}, el("span", {class: "title"}, title));
    series.forEach((s, k) => {
      const n = s.values.length, color = COLORS[k % COLORS.length];
      const x = (i) => n <= 1 ? W - 2 : 2 + i * (W - 4) / (n - 1);
      const y = (v) => H - 2 - (v / top) * (H - 4);
      let d = "", pen = "M", last = null;
      s.values.forEach((v, i) => {
        if (v === null || v === undefined) { pen = "M"; return; }
        d += `${pen}${x(i).toFixed(1)},${y(v).toFixed(1)} `; pen = "L"; last = [i, v];
      });
      if (d) svg.append(svgEl("path", {d, stroke: color, class: "line", "data-series": s.name}));
      if (last) svg.append(svgEl("circle", {cx: x(last[0]), cy: y(last[1]), r: 2, fill: color}));
      caption.append(el("span", {class: "value", style: `color:${color}`},
        last ? `${s.name} ${fmt(last[1])}${unit}` : `${s.name}: none`));
    });
    return el("figure", {class: "chart", "data-chart": opts.id || title, "data-points": values.length,
                         "data-max": max, title: `${title}: highest ${fmt(max)}${unit}`}, caption, svg);
  }

  // ---- cluster charts: per keyspace and per shard, from /api/stats -------------------
  function clusterCharts() {
    const root = $("#charts"); if (!root) return;
    const lag = {};  // "ks/shard" and "ks" -> lag samples since the page opened
    const keep = (k, v) => { (lag[k] = lag[k] || []).push(v); if (lag[k].length > 120) lag[k].shift(); };
    function row(label, s, lagKey, lagName) {
      const charts = [
        chart("QPS", [{name: "qps", values: s.qps}], {id: "qps"}),
        chart("errors", [{name: "error rate", values: s.error_rate.map(r => r * 100)}], {id: "errors", unit: "%"}),
        chart("latency", [{name: "p50", values: s.p50_ms}, {name: "p99", values: s.p99_ms}], {id: "latency", unit: " ms"}),
      ];
      if (lagKey) charts.push(chart(lagName, [{name: "lag", values: lag[lagKey] || []}], {id: "lag", unit: " s"}));
      return el("div", {class: "chart-row", "data-keyspace": s.keyspace, "data-shard": s.shard},
        el("div", {class: "row-label", title: label}, label,
           el("small", {}, `${s.total.count} calls, ${s.total.errors} errors`)), ...charts);
    }
    async function refresh() {
      const st = await api("GET", "/api/stats?minutes=5");
      const byKs = {};
      for (const c of st.consumers) byKs[c.keyspace] = Math.max(byKs[c.keyspace] || 0, c.lag_seconds);
      for (const l of st.stream_lag) keep(`${l.keyspace}/${l.shard}`, l.reader_lag_seconds);
      for (const s of st.keyspaces) keep(s.keyspace, byKs[s.keyspace] ?? null);
      const out = [el("h3", {}, `per keyspace (statements through the gate, per ${st.bucket_s} s)`)];
      for (const s of st.keyspaces) out.push(row(s.keyspace || "(no keyspace)", s, s.keyspace, "stream consumers' lag"));
      out.push(el("h3", {}, "per shard (the gate's calls to each shard)"));
      for (const s of st.shards) out.push(row(`${s.keyspace}/${s.shard}`, s, `${s.keyspace}/${s.shard}`, "change-stream reader lag"));
      if (!st.keyspaces.length && !st.shards.length) out.push(el("p", {}, "no statements in the last minutes"));
      root.replaceChildren(...out);
    }
    refresh(); setInterval(refresh, 5000);
  }

  // ---- VSchema editor ------------------------------------------------------------
  function vschemaEditor() {
    const root = $(".editor"); if (!root) return;
    const ks = root.dataset.keyspace;
    let saved = null, version = null, doc = null, types = [], mode = "form", timer = null;
    let last = {errors: [], warnings: []};
    const json = $("#json"), form = $("#form"), findings = $("#findings"), diff = $("#diff");
    const status = $("#status"), save = $("#save");

    function setDoc(next, from) {
      doc = next;
      if (from !== "json") json.value = JSON.stringify(doc, null, 2);
      if (from !== "form") renderForm();
      renderRelations();
      download();
      clearTimeout(timer); timer = setTimeout(check, 250);
    }
    function download() {
      $("#download").href = "data:application/json," + encodeURIComponent(JSON.stringify(doc, null, 2));
    }
    // An input (or a select of ``opts``) sized to its value, so a long name is not cut.
    function field(path, value, onchange, opts) {
      let input;
      if (opts) {
        input = el("select", {"data-path": path});
        for (const o of opts) input.append(el("option", {value: o}, o));
        if (!opts.includes(value)) input.append(el("option", {value}, value));
        input.value = value;
      } else {
        const fit = () => Math.min(48, Math.max(12, String(input.value).length + 2));
        input = el("input", {"data-path": path, value: value ?? ""});
        input.size = fit();
        input.addEventListener("input", () => { input.size = fit(); });
      }
      input.title = String(value ?? "");
      input.addEventListener("input", () => { onchange(input.value); setDoc(doc, "form"); });
      return input;
    }
    // A label kept on one line with its input (the pair wraps as a whole).
    const labelled = (text, input) => el("label", {class: "field"}, el("span", {}, text), input);
    // a long name wraps after its underscores first (<wbr>), mid-word only if it must
    const nameCell = (name) => el("b", {class: "name", title: name},
      ...name.split(/(?<=_)/).flatMap((part, i) => i ? [el("wbr"), part] : [part]));
    function renderForm() {
      form.replaceChildren();
      const typeNames = types.map(t => t.type);
      const vfs = el("fieldset", {}, el("legend", {}, "Vindexes"));
      const vindexes = doc.vindexes || {};
      for (const [name, v] of Object.entries(vindexes)) {
        const fields = el("div", {class: "fields"});
        const row = el("div", {class: "vindex row", "data-name": name}, nameCell(name), fields);
        fields.append(labelled("type", field(`vindexes.${name}.type`, v.type || "", x => { v.type = x; }, typeNames)));
        const spec = types.find(t => t.type === v.type);
        const params = v.params || {};
        for (const p of (spec ? spec.params : [])) {
          fields.append(labelled(p.name + (p.required ? "*" : ""),
            field(`vindexes.${name}.params.${p.name}`, params[p.name] || "", x => {
              v.params = v.params || {}; if (x) v.params[p.name] = x; else delete v.params[p.name];
            })));
        }
        fields.append(labelled("owner", field(`vindexes.${name}.owner`, v.owner || "", x => {
          if (x) v.owner = x; else delete v.owner; })));
        vfs.append(row);
      }
      const tfs = el("fieldset", {}, el("legend", {}, "Tables"));
      for (const [tname, t] of Object.entries(doc.tables || {})) {
        const fields = el("div", {class: "fields"});
        const row = el("div", {class: "table row", "data-name": tname}, nameCell(tname), fields);
        if (t.type) fields.append(el("span", {class: "tag"}, t.type));
        (t.column_vindexes || []).forEach((cv, i) => {
          fields.append(el("span", {class: "group"},
            labelled(`#${i} column`, field(`tables.${tname}.column_vindexes[${i}].column`, cv.column || "", x => { cv.column = x; })),
            labelled("vindex", field(`tables.${tname}.column_vindexes[${i}].name`, cv.name || "", x => { cv.name = x; }))));
        });
        // auto_increment: the column the gate fills from a sequence table (both empty: none)
        const ai = t.auto_increment || {};
        const setAi = (k) => (x) => {
          const next = Object.assign({}, t.auto_increment || {});
          if (x) next[k] = x; else delete next[k];
          if (next.column || next.sequence) t.auto_increment = next; else delete t.auto_increment;
        };
        fields.append(el("span", {class: "group auto-increment"},
          labelled("auto_increment column", field(`tables.${tname}.auto_increment.column`, ai.column || "", setAi("column"))),
          labelled("sequence", field(`tables.${tname}.auto_increment.sequence`, ai.sequence || "", setAi("sequence")))));
        tfs.append(row);
      }
      form.append(vfs, tfs);
      markFields(last.errors, "field-error"); markFields(last.warnings, "field-warning");
    }
    function markFields(list, cls) {
      for (const f of list) {
        for (const input of form.querySelectorAll("[data-path]")) {
          const p = input.dataset.path;
          if (f.path && (p === f.path || p.startsWith(f.path + ".") || f.path.startsWith(p))) {
            input.classList.add(cls); input.title = f.message;
          }
        }
      }
    }
    function renderRelations() {
      const rel = $("#relations"); rel.replaceChildren();
      const list = el("ul");
      for (const [tname, t] of Object.entries(doc.tables || {})) {
        for (const cv of (t.column_vindexes || [])) {
          const v = (doc.vindexes || {})[cv.name] || {};
          list.append(el("li", {}, `${tname}.${cv.column || (cv.columns || []).join(",")} → ${cv.name} (${v.type || "?"})`));
        }
      }
      for (const [vname, v] of Object.entries(doc.vindexes || {})) {
        if (v.owner) list.append(el("li", {}, `${v.owner} owns ${vname} (${v.type})`));
      }
      for (const [tname, t] of Object.entries(doc.tables || {})) {
        const ai = t.auto_increment;
        if (ai && ai.column) list.append(el("li", {}, `${tname}.${ai.column} ← sequence ${ai.sequence || "?"}`));
      }
      rel.append(list);
    }
    function mark(list, cls) {
      for (const f of list) {
        findings.append(el("li", {class: cls}, (f.path ? f.path + ": " : "") + f.message));
      }
      markFields(list, cls === "error" ? "field-error" : "field-warning");
    }
    function showDiff(text) {
      diff.replaceChildren();
      for (const line of text.split("\n")) {
        const cls = line.startsWith("+") && !line.startsWith("+++") ? "add"
          : line.startsWith("-") && !line.startsWith("---") ? "del" : "";
        diff.append(el("span", {class: cls}, line + "\n"));
      }
    }
    async function check() {
      let body = doc;
      if (mode === "json") {
        try { body = JSON.parse(json.value); doc = body; renderForm(); }
        catch (e) { findings.replaceChildren(el("li", {class: "error"}, "not JSON: " + e.message)); save.disabled = true; return; }
      }
      const r = await api("POST", `/api/vschema/${ks}/check`, body);
      last = r;
      findings.replaceChildren();
      for (const input of form.querySelectorAll("[data-path]")) {
        input.classList.remove("field-error", "field-warning"); input.removeAttribute("title");
      }
      mark(r.errors, "error"); mark(r.warnings, "warning");
      if (!r.errors.length && !r.warnings.length) findings.append(el("li", {class: "ok"}, "no problems found"));
      showDiff(r.diff);
      save.disabled = r.errors.length > 0 || !r.diff;
    }
    json.addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(check, 250); });
    $("#mode-json").onclick = () => { mode = "json"; json.hidden = false; form.hidden = true; };
    $("#mode-form").onclick = () => { mode = "form"; json.hidden = true; form.hidden = false; renderForm(); };
    $("#upload").onchange = async (e) => {
      const text = await e.target.files[0].text();
      try { setDoc(JSON.parse(text)); } catch (err) { status.textContent = "not JSON: " + err.message; }
    };
    save.onclick = async () => {
      try {
        const r = await api("PUT", `/api/vschema/${ks}`, {vschema: doc, version});
        version = r.version; saved = JSON.parse(JSON.stringify(doc));
        status.textContent = `saved (version ${r.version})`; status.className = "ok";
        check();
      } catch (e) { status.textContent = "not saved: " + e.message; status.className = "warning"; }
    };
    Promise.all([api("GET", "/api/vindex_types"), api("GET", `/api/vschema/${ks}`)]).then(([t, v]) => {
      types = t; saved = v.vschema; version = v.version;
      setDoc(JSON.parse(JSON.stringify(saved)));
    });
  }

  // ---- queries -------------------------------------------------------------------
  function killButtons() {
    for (const b of document.querySelectorAll("button.kill")) {
      b.onclick = async () => { await api("POST", `/api/live/${b.dataset.id}/kill`); location.reload(); };
    }
  }

  // ---- queues --------------------------------------------------------------------
  function queuesPage() {
    const root = $("#queues");
    const act = (q, action, body) => async () => {
      await api("POST", `/api/queues/${q.keyspace}/${q.queue}/${action}`, body || {});
      refresh();
    };
    const show = (v) => typeof v === "object" && v !== null ? JSON.stringify(v) : (v ?? "");
    const rate = (v) => typeof v === "number" ? v.toFixed(1) : "";
    function segmentedTable(q) {
      const t = el("table", {class: "segmented-shards"});
      t.append(el("tr", {}, ...["shard", "datasets", "jobs by state", "busiest keys",
        "blocked keys (first failed job)", "job id", ""].map(h => el("th", {}, h))));
      for (const s of q.shards) {
        const id = el("input", {class: "job-id", size: 12, placeholder: "job id"});
        const job = (action) => async () => {
          if (!id.value) return;
          await api("POST", `/api/queues/${q.keyspace}/${q.queue}/${action}`,
                    {shard: s.shard, ids: [id.value], reason: "console"});
          id.value = "";
        };
        t.append(el("tr", {"data-shard": s.shard},
          el("td", {}, s.shard), el("td", {"data-k": "datasets"}, (s.datasets || []).length),
          el("td", {"data-k": "jobs_by_state"}, show(s.jobs_by_state)),
          el("td", {}, show(s.pending_per_key)), el("td", {"data-k": "blocked_keys"}, show(s.blocked_keys)),
          el("td", {}, id),
          el("td", {}, el("button", {class: "retry-job", onclick: job("retry_job")}, "retry job"),
                       el("button", {class: "abort-job", onclick: job("abort_job")}, "abort job"),
                       el("button", {class: "pause", onclick: act(q, "pause", {shard: s.shard})}, "pause"),
                       el("button", {class: "resume", onclick: act(q, "resume", {shard: s.shard})}, "resume"))));
      }
      return t;
    }
    function inboxes(list) {
      const box = el("section", {class: "inboxes"}, el("h2", {}, "Inbox stores"));
      if (!list.length) { box.append(el("p", {}, "no inbox stores")); return box; }
      const t = el("table", {class: "inbox-stores"});
      t.append(el("tr", {}, ...["keyspace", "inbox", "buckets", "options", "messages / pointers"].map(h => el("th", {}, h))));
      for (const i of list) {
        const counts = el("td", {"data-k": "counts"},
          el("button", {class: "count", onclick: async () => {
            const r = await api("GET", `/api/inboxes/${i.keyspace}/${i.name}?counts=1`);
            counts.textContent = show({messages: r.messages, pointers: r.pointers});
          }}, "count"));
        t.append(el("tr", {"data-inbox": i.name}, el("td", {}, i.keyspace), el("td", {}, i.name),
          el("td", {}, i.bucket_count ?? ""), el("td", {}, show(i.options || i.error)), counts));
      }
      box.append(t);
      return box;
    }
    // depth and throughput of a queue table over the samples the gate kept (/api/queues)
    function queueCharts(q) {
      const h = q.history || [];
      return el("div", {class: "charts"},
        chart("pending", [{name: "pending", values: h.map(p => p[1])}], {unit: ""}),
        chart("throughput", [{name: "fired/s", values: h.map(p => p[4])},
                             {name: "acked/s", values: h.map(p => p[5])}], {unit: "/s"}));
    }
    let shown = "";
    async function refresh() {
      const queues = await api("GET", "/api/queues");
      const failedBy = {};
      for (const q of queues) {
        failedBy[q.queue] = await api("GET", `/api/queues/${q.keyspace}/${q.queue}/failed`).catch(() => []);
      }
      const inboxList = await api("GET", "/api/inboxes").catch(() => []);
      const key = JSON.stringify([queues.map(q => [q.queue, (q.shards || []).map ? q.shards.map(
        s => [s.shard, s.depth, s.paused, s.leader, s.receivers, s.jobs_by_state, s.blocked_keys])
        : q.shards]), failedBy, inboxList.map(i => [i.keyspace, i.name, i.bucket_count])]);
      if (key === shown) {  // unchanged: keep the page still under the pointer, charts move
        for (const q of queues) {
          const old = root.querySelector(`section.queue[data-queue="${q.queue}"] .charts`);
          if (old) old.replaceWith(queueCharts(q));
        }
        return;
      }
      shown = key;
      const out = el("div");
      if (!queues.length) out.append(el("p", {}, "no queues"));
      for (const q of queues) {
        const box = el("section", {class: "queue", "data-queue": q.queue});
        box.append(el("h2", {}, `${q.keyspace}.${q.queue}` + (q.storage === "segmented" ? " (segmented)" : "")));
        if (typeof q.shards === "string") { box.append(el("p", {class: "warning"}, q.shards)); out.append(box); continue; }
        if (q.storage === "segmented") { box.append(segmentedTable(q)); out.append(box); continue; }
        const t = el("table", {class: "queue-shards"});
        t.append(el("tr", {}, ...["shard", "pending", "in flight", "acked", "failed", "oldest due (s)",
          "fired/s", "acked/s", "receivers", "dispatch", ""].map(h => el("th", {}, h))));
        for (const s of q.shards) {
          const d = s.depth || {};
          const paused = !!s.paused;
          t.append(el("tr", {"data-shard": s.shard},
            el("td", {}, s.shard), el("td", {"data-k": "pending"}, d.to_be_fired ?? ""),
            el("td", {"data-k": "fired"}, d.fired ?? ""), el("td", {"data-k": "acked"}, d.acked ?? ""),
            el("td", {"data-k": "failed"}, d.failed ?? ""),
            el("td", {}, (s.lag_seconds ?? 0).toFixed ? (s.lag_seconds ?? 0).toFixed(2) : ""),
            el("td", {"data-k": "fired_per_second"}, rate(s.fired_per_second)),
            el("td", {"data-k": "acked_per_second"}, rate(s.acked_per_second)),
            el("td", {}, s.receivers ?? ""), el("td", {}, paused ? "paused" : (s.leader ? "running" : "standby")),
            el("td", {},
              el("button", {class: "requeue", onclick: act(q, "requeue_failed", {shard: s.shard})}, "requeue failed"),
              el("button", {class: "purge", onclick: act(q, "purge_acked", {shard: s.shard})}, "purge acked"),
              el("button", {class: paused ? "resume" : "pause",
                            onclick: act(q, paused ? "resume" : "pause", {shard: s.shard})},
                 paused ? "resume" : "pause"))));
        }
        box.append(t, queueCharts(q));
        const failed = failedBy[q.queue];
        if (failed.length) {
          const ft = el("table", {class: "failed"});
          ft.append(el("tr", {}, ...["failed event", "shard", "attempts", ""].map(h => el("th", {}, h))));
          for (const f of failed) ft.append(el("tr", {"data-id": f.id}, el("td", {}, f.id), el("td", {}, f.shard),
            el("td", {}, f.epoch), el("td", {}, el("button", {class: "retry",
              onclick: act(q, "retry", {shard: f.shard, ids: [f.id]})}, "retry"))));
          box.append(ft);
        }
        out.append(box);
      }
      out.append(inboxes(inboxList));
      root.replaceChildren(out);
    }
    refresh(); setInterval(refresh, 1000);
  }

  function tablePage(root, url, columns, empty) {
    async function refresh() {
      const rows = await api("GET", url);
      if (!rows.length) { root.replaceChildren(el("p", {}, empty)); return; }
      const t = el("table", {class: "rows"});
      t.append(el("tr", {}, ...columns.map(c => el("th", {}, c))));
      for (const r of rows) t.append(el("tr", {}, ...columns.map(c => el("td", {"data-k": c},
        typeof r[c] === "object" && r[c] !== null ? JSON.stringify(r[c]) :
        typeof r[c] === "number" && !Number.isInteger(r[c]) ? r[c].toFixed(3) : r[c] ?? ""))));
      root.replaceChildren(t);
    }
    refresh(); setInterval(refresh, 1000);
  }
  function streamsPage() {
    tablePage($("#streams"), "/api/streams",
      ["id", "keyspace", "key_range", "events", "lag_seconds", "position"],
      "no change-stream consumers connected");
  }
  // ---- workflows: progress, VDiff, switch and complete (confirmed, admin only) ------
  const CONFIRM = {
    switch_reads: (w) => `Serve the reads of ${w.name} from its target shards?`,
    switch_writes: (w) => `Switch the writes of ${w.name} to its target shards? The sources ` +
      "refuse writes for the cut-over (gates hold them meanwhile).",
    complete: (w) => `Complete ${w.name}? The source shards leave the keyspace and the ` +
      "workflow record is deleted; this cannot be undone.",
  };
  function workflowsPage() {
    const root = $("#workflows"), status = $("#wf-status");
    async function act(w, action) {
      const ask = CONFIRM[action];
      if (ask && !window.confirm(ask(w))) { status.textContent = `${action}: not confirmed, nothing done`; status.className = ""; return; }
      status.textContent = `${action} of ${w.name}: running…`; status.className = "";
      try {
        const r = await api("POST", `/api/workflows/${encodeURIComponent(w.name)}/${action}`);
        status.textContent = `${action} of ${w.name}: done` + (r.result && r.result.message ? ` (${r.result.message})` : "");
        status.className = "ok";
      } catch (e) {
        status.textContent = `${action} of ${w.name} refused: ${e.message}`; status.className = "warning";
      }
      refresh(true);
    }
    function vdiff(v) {
      if (!v) return el("p", {class: "muted"}, "no VDiff yet");
      const t = el("table", {class: "vdiff"});
      t.append(el("tr", {}, ...["table", "processed", "matching", "mismatched", "extra source", "extra target", ""].map(h => el("th", {}, h))));
      for (const r of v.tables || []) {
        const clean = !r.mismatched && !r.extra_source && !r.extra_target;
        t.append(el("tr", {"data-table": r.table}, el("td", {}, r.table), el("td", {}, r.processed),
          el("td", {}, r.matching), el("td", {}, r.mismatched), el("td", {}, r.extra_source),
          el("td", {}, r.extra_target), el("td", {class: clean ? "ok" : "slow"}, clean ? "clean" : "differs")));
      }
      return el("div", {}, el("p", {}, `last VDiff ${new Date(v.at * 1000).toLocaleString()}`), t);
    }
    let shown = "";
    async function refresh(force) {
      const list = await api("GET", "/api/workflows");
      const key = JSON.stringify(list.map(w => [w.name, w.version]));
      if (!force && key === shown) return;
      shown = key;
      if (!list.length) { root.replaceChildren(el("p", {}, "no workflows")); return; }
      const out = [];
      for (const w of list) {
        const box = el("section", {class: "workflow", "data-workflow": w.name});
        const pct = typeof w.progress === "number" ? Math.round(w.progress * 100) : null;
        box.append(el("h2", {}, w.name),
          el("p", {}, el("span", {class: "tag", "data-k": "state"}, w.state), ` ${w.type}`,
            w.reads_switched ? " · reads switched" : "", w.journal ? " · writes switched (journal written)" : "",
            w.error ? ` · last error: ${w.error}` : ""),
          el("div", {class: "progress"}, el("progress", {max: 100, value: pct ?? 0}),
            el("span", {}, pct === null ? "" : `${pct}%` + (w.estimate ? ` · ${w.rows_copied} of ~${w.estimate} rows copied` : ""))));
        const streams = Object.entries(w.streams || {});
        if (streams.length) {
          const t = el("table", {class: "streams"});
          t.append(el("tr", {}, ...["stream", "state", "lag s", "error"].map(h => el("th", {}, h))));
          for (const [n, s] of streams) t.append(el("tr", {}, el("td", {}, n), el("td", {}, s.state ?? ""),
            el("td", {}, typeof s.lag_s === "number" ? s.lag_s.toFixed(2) : ""), el("td", {}, s.error ?? "")));
          box.append(t);
        }
        if (w.kind === "reshard" || w.kind === "movetables") box.append(vdiff(w.last_vdiff));
        if (w.actions.length) box.append(el("div", {class: "actions"}, ...w.actions.map(a =>
          el("button", {class: `wf-action ${a}`, "data-action": a, onclick: () => act(w, a)}, a.replace("_", " ")))));
        out.push(box);
      }
      root.replaceChildren(...out);
    }
    refresh(); setInterval(refresh, 2000);
  }

  return {vschemaEditor, killButtons, queuesPage, streamsPage, workflowsPage, clusterCharts, chart, api};
})();
