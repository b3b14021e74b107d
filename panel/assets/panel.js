"use strict";
// The warden panel: fetches the panel's JSON twin from the address it was
// served at and redraws the models in place, every refresh_ms.
(() => {
  const SVG = "http://www.w3.org/2000/svg";
  const main = document.getElementById("models");
  const statusLine = document.getElementById("status");
  let refreshMS = 2000; // until the JSON says otherwise
  let lastGood = null;

  function jsonAddress() {
    const params = new URLSearchParams(location.search);
    params.set("format", "json");
    return location.pathname + "?" + params;
  }

  // el builds an element; attrs may hold text, className, title and data-* keys.
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    setAttrs(node, attrs);
    node.append(...children);
    return node;
  }

  function svgEl(tag, attrs) {
    const node = document.createElementNS(SVG, tag);
    setAttrs(node, attrs);
    return node;
  }

  function setAttrs(node, attrs) {
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "text") node.textContent = v;
      else if (k === "className") node.setAttribute("class", v);
      else node.setAttribute(k, v);
    }
  }

  const integer = (v) => String(Math.round(v));
  const number = (v) => (Number.isInteger(v) ? String(v) : v.toFixed(1));
  const percent = (ratio) => (ratio * 100).toFixed(1) + "%";
  // orUnknown shows null (a value the servers do not publish) as a dash.
  const orUnknown = (ratio) => (ratio === null || ratio === undefined ? "—" : percent(ratio));
  const pad2 = (n) => String(n).padStart(2, "0");
  const clock = (d) => pad2(d.getHours()) + ":" + pad2(d.getMinutes());
  const clockSeconds = (d) => clock(d) + ":" + pad2(d.getSeconds());

  // si writes a rate compactly: 0, 2.5, 456, 7.8k, 12k, 1.2M.
  function si(v) {
    if (v >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (v >= 1e4) return Math.round(v / 1e3) + "k";
    if (v >= 1e3) return (v / 1e3).toFixed(1) + "k";
    if (v >= 10 || Number.isInteger(v)) return String(Math.round(v));
    return v.toFixed(1);
  }

  // The replica table: key (also the cell's data-col), heading, cell text,
  // and an optional tooltip, class and condition on the model.
  const loadControlOn = (m) => m.load_control.enabled;
  const hostTier = (m) => m.replicas.some((r) => r.host_tier_gib !== null);
  const columns = [
    ["replica", "Replica", (r, mode) => (mode === "ranks" ? "rank " + r.rank + " · " + r.address : r.address)],
    ["in_flight", "In flight", (r) => integer(r.in_flight)],
    ["sticky", "Sticky", (r) => integer(r.sticky)],
    ["spilled_in", "Spilled in", (r) => integer(r.spilled_in)],
    ["client_pinned", "Client-pinned", (r) => integer(r.client_pinned)],
    ["running", "Running", (r) => (r.metrics_known ? number(r.running) : "–")],
    ["waiting", "Waiting", (r) => (r.metrics_known ? number(r.waiting) : "–")],
    ["kv_used", "KV used", (r) => (r.metrics_known ? percent(r.kv_used) : "–")],
    ["prefix_hit_rate", "Prefix hits (5 min)", (r) => orUnknown(r.prefix_hit_rate), (r) => (r.prefix_hit_rate === null ? "unknown: no prefix-cache query counted in the last 5 minutes, or no prefix-cache counters from this replica" : "")],
    ["host_hit_rate", "Host-tier hits (5 min)", (r) => orUnknown(r.host_hit_rate), (r) => (r.host_tier_gib === null ? "no host-memory KV tier reported" : "prompt tokens loaded from its " + number(r.host_tier_gib) + " GiB host-memory KV tier"), undefined, hostTier],
    ["healthy", "Healthy", (r) => (r.healthy ? "yes" : "no"), (r) => r.health, (r) => (r.healthy ? "good" : "bad")],
    ["sessions", "Conversations", (r) => integer(r.sessions)],
    ["active_sessions", "Active", (r) => integer(r.active_sessions), () => "conversations that sent a request lately"],
    ["residents", "Residents", (r) => integer(r.residents), (r) => residentsTip(r), undefined, loadControlOn],
    ["process", "Process", processText, (r) => (r.process ? "pid " + r.process.pid : "not launched by warden")],
  ];

  // A launched vLLM server's state, e.g. "ready" or "restarting (3 restarts)".
  function processText(r) {
    if (!r.process) return "–";
    const n = r.process.restarts;
    return n ? r.process.state + " (" + n + (n === 1 ? " restart)" : " restarts)") : r.process.state;
  }

  // residentsTip: the residents' estimated prompts against the replica's KV cache.
  function residentsTip(r) {
    const of = r.kv_capacity_tokens === null ? "" : " of " + si(r.kv_capacity_tokens) + " KV capacity";
    return "conversations load control keeps cached here: " + si(r.resident_tokens) + " tokens" + of;
  }

  function replicaTable(m) {
    const shown = columns.filter(([, , , , , when]) => !when || when(m));
    const head = el("tr", {}, ...shown.map(([key, title]) => el("th", { text: title, scope: "col", "data-col": key })));
    const rows = m.replicas.map((r) =>
      el("tr", { "data-replica": r.id }, ...shown.map(([key, , text, tip, cls]) => {
        const attrs = { text: text(r, m.mode), "data-col": key };
        if (tip) attrs.title = tip(r);
        if (cls) attrs.className = cls(r);
        return el("td", attrs);
      })),
    );
    return el("div", { className: "table-wrap", "data-table": "replicas" }, el("table", {}, el("thead", {}, head), el("tbody", {}, ...rows)));
  }

  // flowTable shows each flow's share of load control's queue, the most
  // recently active first (at most flowsShown, then the flows folded out
  // of those counted apart); none before load control saw a turn.
  const flowsShown = 16;
  const flowColumns = [["flow", "Flow"], ["waiting", "Waiting"], ["admitted", "Admitted"], ["queued", "Queued"], ["refused", "Refused"], ["waited_s", "Waited (s)"]];
  function flowTable(lc) {
    if (!lc.enabled || lc.flows.length === 0) return [];
    const o = lc.other_flows;
    const shown = lc.flows.slice(0, flowsShown);
    if (o.admitted + o.queued + o.refused > 0) shown.push(o);
    const by = lc.flow_header ? "their " + lc.flow_header + " header" : "their API key (Authorization, else x-api-key)";
    const more = lc.flows.length > flowsShown ? "; " + (lc.flows.length - flowsShown) + " more in the admin JSON" : "";
    const head = el("tr", {}, ...flowColumns.map(([key, title]) => el("th", { text: title, scope: "col", "data-col": key })));
    const rows = shown.map((f) => el("tr", { "data-flow": f.flow }, ...flowColumns.map(([key]) =>
      el("td", { "data-col": key, text: key === "flow" ? f.flow : key === "waited_s" ? number(f.waited_s) : integer(f[key]) }))));
    return [
      el("p", { className: "note muted", "data-stat": "flows", text: "Fair share: turns by flow, people told apart by " + by + ", hashed" + more }),
      el("div", { className: "table-wrap", "data-table": "flows" }, el("table", {}, el("thead", {}, head), el("tbody", {}, ...rows))),
    ];
  }

  function badges(m) {
    const badge = (key, text, cls) => el("span", { className: "badge" + (cls ? " " + cls : ""), "data-badge": key, text });
    return el("div", { className: "badges" },
      badge("affinity", "Affinity " + (m.affinity ? "on" : "off"), m.affinity ? "on" : "off"),
      spillBadge(m, badge),
      maxNumSeqsBadge(m, badge),
      badge("sticky", "Sticky " + m.sticky_percent.toFixed(1) + "%"),
      badge("in_flight", "In flight " + m.in_flight),
      badge("sessions", "Conversations " + m.sessions),
      ...pinStoreBadge(m.pin_store, badge),
      ...queueBadge(m.load_control, badge),
    );
  }

  // spillBadge shows the manual threshold in force or, for auto, what moves
  // are costed with.
  function spillBadge(m, badge) {
    if (!m.spill_threshold_auto) {
      return badge("spill", "Spill threshold " + m.spill_threshold + " manual");
    }
    const b = badge("spill", "Moves by expected cost");
    b.title = m.prefill_tokens_per_second
      ? "prefill " + Math.round(m.prefill_tokens_per_second).toLocaleString("en-US") + " tokens/s" +
        (m.turn_seconds ? ", turns of " + m.turn_seconds.toFixed(1) + " s" : "")
      : "no move for load until the replicas' counters show their prefill rate";
    return b;
  }

  // maxNumSeqsBadge shows the max_num_seqs warden routes with and where it
  // came from: vLLM does not publish it.
  function maxNumSeqsBadge(m, badge) {
    const sources = { config: "set", process: "from --max-num-seqs", vllm_default: "vLLM's default" };
    const b = badge("max_num_seqs", "max_num_seqs " + m.max_num_seqs + " (" + (sources[m.max_num_seqs_source] || m.max_num_seqs_source) + ")");
    b.title = m.max_num_seqs_source === "vllm_default"
      ? "what vllm serve runs without --max-num-seqs on a GPU under 70 GiB; set max_num_seqs if yours differs (1024 on an H100)"
      : "";
    return b;
  }

  // queueBadge shows the turns load control holds, and whether it steps
  // aside; none when it is off.
  function queueBadge(lc, badge) {
    if (!lc.enabled) return [];
    const b = badge("queue", "Queue " + lc.waiting + (lc.stepped_aside ? " · stepped aside" : ""));
    b.title = "turns waiting for room in a KV cache (at most " + lc.max_queue + ", each at most " + lc.max_wait_s + " s); " +
      lc.queued + " waited, " + lc.forced + " sent after max_wait, " + lc.refused + " refused; " +
      Math.round(100 * lc.lack_share) + "% of the recent turns lacked room, " +
      Math.round(100 * lc.late_share) + "% of the idle conversations' residency expired before they came back" +
      (lc.stepped_aside ? ", so every turn is admitted at once" : "");
    return [b];
  }

  // workingSet compares the resident conversations' prompts with the
  // replicas' KV caches, and says so when they do not fit; it names the
  // prefix they share, counted once per replica, and where it was read.
  function workingSet(ws, lc) {
    if (!ws) return [];
    const capacity = ws.kv_capacity_tokens === null ? "a KV capacity not known yet" : si(ws.kv_capacity_tokens) + " tokens of KV cache";
    const shared = lc.shared_prefix_tokens === null
      ? "every prompt counted whole until the replies or the requests tell the prefix conversations share"
      : "the " + si(lc.shared_prefix_tokens) + " tokens conversations share counted once per replica (read from the " + lc.shared_prefix_source + ")";
    const line = el("p", { className: "note muted", "data-stat": "working_set",
      text: "Working set: " + si(ws.resident_tokens) + " tokens resident in " + capacity + "; " + shared });
    if (ws.kv_capacity_tokens === null || ws.resident_tokens <= ws.kv_capacity_tokens) return [line];
    return [line, el("p", { className: "note warn", "data-stat": "working_set_exceeded",
      text: "The resident conversations hold more than the replicas' KV caches: some of their prompts will be computed again." })];
  }

  // replyUsage says what the replies read by warden_stop_reason reported:
  // how much of their prompt the turns of resident conversations found
  // cached against the other turns, and the bytes per token learned. None
  // before a reply was read.
  function replyUsage(lc) {
    if (!lc.enabled || lc.replies.read === 0) return [];
    const r = lc.replies;
    const percent = (p) => p === null ? "—" : p.toFixed(1) + "%";
    const cached = r.cache_reported > 0
      ? "Turns of resident conversations found " + percent(r.resident.cached_percent) + " of their prompt cached, other turns " +
        percent(r.non_resident.cached_percent)
      : "The replies report no cached part (vLLM needs --enable-prompt-tokens-details)";
    return [el("p", { className: "note muted", "data-stat": "reply_usage",
      text: cached + "; " + r.bytes_per_token.toFixed(2) + " bytes per token, from " + r.read.toLocaleString("en-US") + " replies" })];
  }

  // pinStoreBadge shows whether the shared pin store answers; none when the
  // model's pins are local.
  function pinStoreBadge(ps, badge) {
    if (!ps) return [];
    const b = badge("pin_store", "Shared pins " + (ps.up ? "up" : "down"), ps.up ? "on" : "off");
    b.title = "Redis " + ps.address + (ps.last_error ? " · last error: " + ps.last_error : "");
    return [b];
  }

  function since(m) {
    const extra = [m.requests + " requests"];
    if (m.unkeyed > 0) extra.push(m.unkeyed + " without a session key");
    if (m.no_replica > 0) extra.push(m.no_replica + " with no usable replica");
    const ps = m.pin_store;
    if (ps) extra.push("shared pins: " + ps.claims + " claimed, " + ps.claims_lost + " followed from another instance, " +
      ps.skipped + " routed locally while the store was down");
    return el("p", { className: "since muted", title: new Date(m.since).toString() },
      "Counters since " + m.since_human + " · " + extra.join(" · "));
  }

  // niceCeil rounds a positive maximum up to 1, 2, 2.5 or 5 times a power of ten.
  function niceCeil(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    const f = v / p;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 2.5 ? 2.5 : f <= 5 ? 5 : 10) * p;
  }

  // chart draws prompt tokens/s as stacked cached and computed bars (left
  // axis) and completion tokens/s as a line (right axis).
  function chart(stats, generatedAt, readout) {
    const W = 900, H = 230, L = 56, R = 56, T = 18, B = 24;
    const pw = W - L - R, ph = H - T - B;
    const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "prompt and completion tokens per second" });
    const n = stats.at.length;
    if (n === 0) {
      svg.append(svgEl("text", { x: W / 2, y: H / 2, "text-anchor": "middle", className: "empty", text: "No token counters yet: the chart fills in as the engines report traffic." }));
      return svg;
    }
    const step = stats.step_seconds;
    const cachedRate = stats.cached_tokens_per_s, computedRate = stats.computed_tokens_per_s, genRate = stats.generation_tokens_per_s;
    const end = (Math.floor(Date.parse(generatedAt) / 1000 / step) + 1) * step;
    const span = Math.min(stats.window_seconds, Math.max(300, end - stats.at[0]));
    const start = end - span;
    const X = (t) => L + ((t - start) / span) * pw;
    let promptMax = 0, genMax = 0;
    for (let i = 0; i < n; i++) {
      promptMax = Math.max(promptMax, cachedRate[i] + computedRate[i]);
      genMax = Math.max(genMax, genRate[i]);
    }
    promptMax = niceCeil(promptMax);
    genMax = niceCeil(genMax);
    const Yp = (v) => T + ph - (v / promptMax) * ph;
    const Yg = (v) => T + ph - (v / genMax) * ph;

    for (let k = 0; k <= 4; k++) {
      const y = T + ph - (k / 4) * ph;
      svg.append(svgEl("line", { x1: L, x2: W - R, y1: y, y2: y, className: "grid" }));
      svg.append(svgEl("text", { x: L - 6, y: y + 4, "text-anchor": "end", text: si((promptMax * k) / 4) }));
      svg.append(svgEl("text", { x: W - R + 6, y: y + 4, text: si((genMax * k) / 4) }));
    }
    svg.append(svgEl("text", { x: 0, y: T - 6, text: "prompt/s" }));
    svg.append(svgEl("text", { x: W, y: T - 6, "text-anchor": "end", text: "completion/s" }));
    const tick = [60, 120, 300, 600, 900, 1800, 3600].find((s) => span / s <= 6);
    for (let t = Math.ceil(start / tick) * tick; t <= end; t += tick) {
      svg.append(svgEl("text", { x: X(t), y: H - 6, "text-anchor": "middle", text: clock(new Date(t * 1000)) }));
    }

    // One path of bars per series keeps the DOM small at 720 steps.
    let cached = "", computed = "", line = "";
    const barWidth = Math.max(X(step) - X(0), 0.5);
    const gap = barWidth > 3 ? 1 : 0;
    const bar = (x, top, bottom) => (bottom - top > 0 ? `M${x},${top}h${barWidth - gap}V${bottom}h${gap - barWidth}Z` : "");
    for (let i = 0; i < n; i++) {
      const x = X(stats.at[i]);
      cached += bar(x, Yp(cachedRate[i]), Yp(0));
      computed += bar(x, Yp(cachedRate[i] + computedRate[i]), Yp(cachedRate[i]));
      const continues = i > 0 && stats.at[i] - stats.at[i - 1] <= step;
      const endsHere = i === n - 1 || stats.at[i + 1] - stats.at[i] > step;
      const point = `${x + barWidth / 2},${Yg(genRate[i])}`;
      line += (continues ? "L" : "M") + point + (!continues && endsHere ? "h0.01" : "");
    }
    svg.append(svgEl("path", { d: cached, className: "series-cached" }));
    svg.append(svgEl("path", { d: computed, className: "series-computed" }));
    svg.append(svgEl("path", { d: line, className: "series-generation", "stroke-linecap": "round" }));

    svg.addEventListener("mousemove", (ev) => {
      const box = svg.getBoundingClientRect();
      const t = start + (((ev.clientX - box.left) / box.width) * W - L) / pw * span;
      let i = stats.at.findIndex((at) => at > t) - 1;
      if (i < 0) i = t < stats.at[0] ? -1 : n - 1;
      if (i < 0 || t - stats.at[i] > step) {
        readout.textContent = "";
        return;
      }
      readout.textContent = `${clockSeconds(new Date(stats.at[i] * 1000))}: cached ${si(cachedRate[i])}/s, computed ${si(computedRate[i])}/s, completion ${si(genRate[i])}/s`;
    });
    svg.addEventListener("mouseleave", () => { readout.textContent = ""; });
    return svg;
  }

  function stats(m, generatedAt) {
    const readout = el("span", { className: "muted readout" });
    const key = (cls, text) => el("span", {}, el("span", { className: "key " + cls }), text);
    const caption = el("figcaption", {},
      el("strong", { text: "Tokens per second, last hour" }),
      key("cached", "prompt, cached"),
      key("computed", "prompt, computed"),
      key("generation", "completion"),
      el("span", { "data-stat": "hit_share", text: "Cached share of prompt tokens: " + orUnknown(m.stats.hit_share) }),
      readout,
    );
    return el("figure", { className: "chart" }, caption, chart(m.stats, generatedAt, readout));
  }

  function renderModel(m, generatedAt) {
    return el("section", { className: "model", "data-model": m.model },
      el("div", { className: "model-head" },
        el("h2", { text: m.model }),
        el("span", { className: "muted", text: m.mode === "ranks" ? "one server, ranks" : "one server per replica" }),
        badges(m),
      ),
      replicaTable(m),
      ...workingSet(m.working_set, m.load_control),
      ...replyUsage(m.load_control),
      ...flowTable(m.load_control),
      since(m),
      stats(m, generatedAt),
    );
  }

  function render(data) {
    if (data.models.length === 0) {
      main.replaceChildren(el("p", { className: "muted", text: "No model is configured: add a model to the warden global option." }));
      return;
    }
    main.replaceChildren(...data.models.map((m) => renderModel(m, data.generated_at)));
  }

  async function refresh() {
    try {
      const resp = await fetch(jsonAddress(), { headers: { Accept: "application/json" }, cache: "no-store", credentials: "same-origin" });
      if (!resp.ok) throw new Error("HTTP " + resp.status);
      const data = await resp.json();
      refreshMS = data.refresh_ms || refreshMS;
      render(data);
      lastGood = new Date();
      statusLine.className = "muted";
      statusLine.textContent = "updated " + clockSeconds(lastGood) + " · every " + refreshMS / 1000 + " s";
    } catch (err) {
      statusLine.className = "stale";
      statusLine.textContent = "update failed (" + err.message + ")" + (lastGood ? "; showing data from " + clockSeconds(lastGood) : "");
    }
  }

  async function loop() {
    if (!document.hidden) await refresh();
    setTimeout(loop, refreshMS);
  }

  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) refresh();
  });
  loop();
})();
