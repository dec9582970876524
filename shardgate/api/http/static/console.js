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
    function field(path, value, onchange, opts) {
      let input;
      if (opts) {
        input = el("select", {"data-path": path});
        for (const o of opts) input.append(el("option", {value: o}, o));
        if (!opts.includes(value)) input.append(el("option", {value}, value));
        input.value = value;
      } else input = el("input", {"data-path": path, value: value ?? "", size: 18});
      input.addEventListener("input", () => { onchange(input.value); setDoc(doc, "form"); });
      return input;
    }
    function renderForm() {
      form.replaceChildren();
      const typeNames = types.map(t => t.type);
      const vfs = el("fieldset", {}, el("legend", {}, "Vindexes"));
      const vindexes = doc.vindexes || {};
      for (const [name, v] of Object.entries(vindexes)) {
        const row = el("div", {class: "vindex", "data-name": name}, el("b", {}, name));
        row.append(field(`vindexes.${name}.type`, v.type || "", x => { v.type = x; }, typeNames));
        const spec = types.find(t => t.type === v.type);
        const params = v.params || {};
        for (const p of (spec ? spec.params : [])) {
          row.append(el("label", {}, p.name + (p.required ? "*" : "")),
            field(`vindexes.${name}.params.${p.name}`, params[p.name] || "", x => {
              v.params = v.params || {}; if (x) v.params[p.name] = x; else delete v.params[p.name];
            }));
        }
        row.append(el("label", {}, "owner"), field(`vindexes.${name}.owner`, v.owner || "", x => {
          if (x) v.owner = x; else delete v.owner; }));
        vfs.append(row);
      }
      const tfs = el("fieldset", {}, el("legend", {}, "Tables"));
      for (const [tname, t] of Object.entries(doc.tables || {})) {
        const row = el("div", {class: "table", "data-name": tname}, el("b", {}, tname));
        (t.column_vindexes || []).forEach((cv, i) => {
          row.append(el("span", {}, ` #${i} column`),
            field(`tables.${tname}.column_vindexes[${i}].column`, cv.column || "", x => { cv.column = x; }),
            el("span", {}, "vindex"),
            field(`tables.${tname}.column_vindexes[${i}].name`, cv.name || "", x => { cv.name = x; }));
        });
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
      if (key === shown) return;  // unchanged: keep the page still under the pointer
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
            el("td", {}, s.fired_per_s ?? ""), el("td", {}, s.acked_per_s ?? ""),
            el("td", {}, s.receivers ?? ""), el("td", {}, paused ? "paused" : (s.leader ? "running" : "standby")),
            el("td", {},
              el("button", {class: "requeue", onclick: act(q, "requeue_failed", {shard: s.shard})}, "requeue failed"),
              el("button", {class: "purge", onclick: act(q, "purge_acked", {shard: s.shard})}, "purge acked"),
              el("button", {class: paused ? "resume" : "pause",
                            onclick: act(q, paused ? "resume" : "pause", {shard: s.shard})},
                 paused ? "resume" : "pause"))));
        }
        box.append(t);
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
  function workflowsPage() {
    tablePage($("#workflows"), "/api/workflows", ["name", "type", "state", "progress", "version"],
      "no workflows");
  }

  return {vschemaEditor, killButtons, queuesPage, streamsPage, workflowsPage, api};
})();
