/* TITO viewer: plain JavaScript, no framework, no build step, nothing from the network.
 *
 * Reads the JSON under /ui/api (the gateway's live sessions, or a samples.parquet under
 * `tito view`: the same shapes) and draws the sessions list, the v2 tree, the samples
 * preview and the token strip. The strip is virtualized: it is cut into chunks of CHUNK
 * tokens, each fetched as one page and drawn only while it is near the visible area
 * (an IntersectionObserver); a chunk out of sight keeps its measured height and drops
 * its elements, so a 100,000-token trajectory never has more than a few thousand token
 * elements in the page. Every text from the trajectory is set with textContent.
 */
"use strict";

(function () {
  const API = "/ui/api";
  const CHUNK = 1024;
  const PAGES_KEPT = 32;
  const LIST_PAGE = 200;
  const REFRESH_MS = 5000;
  const ORIGIN = { p: "prompt", b: "bridge", g: "generated" };
  const FOLD_DEFAULT = { think: false, tool_call: true, tool_result: true };
  const NEWLINES = /^[ \t\r]*\n\s*$/;  // a line break token: marked with a visible ↵

  const state = {
    source: null,
    listLimit: LIST_PAGE,
    listed: new Map(),
    sid: null,
    leaf: null,
    context: null,
    overview: null,
    strip: null,
    folded: new Map(),
    foldDefault: Object.assign({}, FOLD_DEFAULT),
    colour: "origin",
  };

  const $ = (id) => document.getElementById(id);

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (value === null || value === undefined) continue;
      if (key === "class") node.className = value;
      else if (key === "data") Object.assign(node.dataset, value);
      else if (key === "title") node.title = value;
      else node.setAttribute(key, value);
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  async function getJSON(path, params) {
    const url = new URL(API + path, location.origin);
    for (const [key, value] of Object.entries(params || {})) {
      if (value !== null && value !== undefined) url.searchParams.set(key, value);
    }
    const resp = await fetch(url, { headers: { Accept: "application/json" },
                                    credentials: "same-origin" });
    let body = null;
    try { body = await resp.json(); } catch (err) { body = null; }
    if (!resp.ok) {
      const message = body && body.error ? body.error.message : "HTTP " + resp.status;
      const error = new Error(message);
      error.status = resp.status;
      throw error;
    }
    return body;
  }

  // -- formatting -----------------------------------------------------------------------
  function fmtAge(seconds) {
    if (seconds === null || seconds === undefined || !isFinite(seconds)) return "";
    if (seconds < 60) return Math.max(0, Math.round(seconds)) + " s";
    if (seconds < 3600) return Math.round(seconds / 60) + " min";
    if (seconds < 86400) return (seconds / 3600).toFixed(1) + " h";
    return (seconds / 86400).toFixed(1) + " d";
  }
  function fmtLatency(seconds) {
    if (seconds === null || seconds === undefined) return "latency n/a";
    return seconds < 1 ? Math.round(seconds * 1000) + " ms" : seconds.toFixed(2) + " s";
  }
  function fmtInt(n) { return n === null || n === undefined ? "" : Number(n).toLocaleString("en-US"); }
  function shortId(id) { return id.length > 14 ? id.slice(0, 12) + "…" : id; }
  function heat(logprob) {
    const p = Math.exp(logprob);
    return "hsl(" + Math.round(120 * p) + ", 80%, " + Math.round(88 - 28 * (1 - p)) + "%)";
  }

  // -- routing: #s=<id>&ctx=<agent context>&leaf=<node> ---------------------------------------
  function parseHash() {
    const params = new URLSearchParams(location.hash.replace(/^#/, ""));
    const leaf = params.get("leaf");
    return { sid: params.get("s"), leaf: leaf === null || leaf === "" ? null : Number(leaf),
             context: params.get("ctx") || null };
  }
  function go(sid, leaf, context) {
    const params = new URLSearchParams({ s: sid });
    if (context) params.set("ctx", context);
    if (leaf !== null && leaf !== undefined) params.set("leaf", String(leaf));
    location.hash = params.toString();
  }
  function route() {
    const { sid, leaf, context } = parseHash();
    if (sid) openSession(sid, leaf, context);
  }

  // -- sessions list ----------------------------------------------------------------------
  async function loadSessions() {
    const data = await getJSON("/sessions", { limit: state.listLimit });
    state.source = data.source;
    renderSource(data.source, data.page.total);
    renderSessions(data.sessions, data.now, data.page);
    return data;
  }

  function renderSource(source, total) {
    const parts = source.kind === "file"
      ? ["file " + source.name, fmtInt(total) + " samples",
         source.has_text ? "tokenizer " + (source.tokenizer || "") : "no tokenizer: ids shown"]
      : ["gateway · " + source.family, "sessions " + source.session_version,
         fmtInt(total) + " live"];
    $("source").textContent = parts.join(" · ");
    $("sessions-title").textContent = source.kind === "file" ? "Samples" : "Sessions";
    $("sessions-last").textContent = source.kind === "file" ? "reward" : "age";
    $("sessions-first").textContent = source.kind === "file" ? "sample" : "session";
    $("auto-refresh").parentElement.hidden = source.kind === "file";
    document.body.dataset.source = source.kind;
  }

  function renderSessions(items, now, page) {
    const body = $("sessions").tBodies[0];
    state.listed = new Map(items.map((item) => [item.id, item]));
    body.replaceChildren(...items.map((item) => sessionRow(item, now)));
    $("sessions-empty").hidden = items.length > 0;
    $("sessions-more").hidden = page.next_offset === null;
  }

  function sessionRow(item, now) {
    const last = state.source && state.source.kind === "file"
      ? (item.reward === null || item.reward === undefined ? "" : String(item.reward))
      : fmtAge(now - item.last_active);
    const row = el("tr", { data: { sid: item.id, status: item.status },
                           class: item.id === state.sid ? "selected" : null },
      el("td", { class: "id", title: item.id }, item.label || shortId(item.id)),
      el("td", {}, item.version || ""),
      el("td", { class: "num" }, item.turns === null ? "" : fmtInt(item.turns)),
      el("td", { class: "num" }, fmtInt(item.tokens)),
      el("td", { class: "status-" + item.status }, item.status || ""),
      el("td", { class: "num" }, last));
    row.addEventListener("click", () => go(item.id, null, null));
    return row;
  }

  // -- one session -------------------------------------------------------------------------
  async function openSession(sid, leaf, context) {
    state.sid = sid;
    state.leaf = leaf;
    state.context = context || null;
    for (const row of $("sessions").tBodies[0].rows) {
      row.classList.toggle("selected", row.dataset.sid === sid);
    }
    $("placeholder").hidden = true;
    $("session").hidden = false;
    document.body.dataset.state = "loading";
    const base = "/sessions/" + encodeURIComponent(sid);
    try {
      const [overview, preview] = await Promise.all([
        getJSON(base, { leaf: leaf, context: state.context }),
        getJSON(base + "/samples", { context: state.context })]);
      if (state.sid !== sid || state.leaf !== leaf || state.context !== (context || null)) return;
      state.overview = overview;
      showError(null);
      renderSummary(overview);
      renderTree(overview);
      renderSamples(preview);
      startStrip(sid, overview.tree ? overview.leaf : null, overview.strip, state.context);
      document.body.dataset.state = "ready";
    } catch (err) {
      if (state.sid !== sid) return;
      showError(err.message);
      if (state.strip) state.strip.destroy();
      state.strip = null;
      $("strip").replaceChildren();
      document.body.dataset.state = "error";
    }
  }

  function showError(message) {
    $("error").hidden = !message;
    $("error").textContent = message || "";
  }

  function fact(label, value) {
    return el("span", { class: "fact" }, label + " ", el("b", {}, value));
  }

  function renderSummary(ov) {
    const s = ov.summary, strip = ov.strip;
    const facts = [
      fact(ov.version === "file" ? "sample" : "session", ov.version === "file" ? (s.label || ov.id) : ov.id),
      fact("version", ov.version),
      fact("status", s.status || ""),
      fact("tokens", fmtInt(strip.num_tokens)),
      fact("turns", fmtInt(strip.num_turns)),
      fact("prompt / bridge / generated", [strip.origins.prompt, strip.origins.bridge,
                                           strip.origins.generated].map(fmtInt).join(" / ")),
      fact("loss mask on", fmtInt(strip.mask_on)),
    ];
    if (strip.not_in_sample) facts.push(fact("not in the sample", fmtInt(strip.not_in_sample)));
    if (s.contexts && s.contexts.length > 1) facts.push(contextPicker(ov, s));
    if (ov.tree) facts.push(fact("path to node", String(ov.leaf)));
    if (s.reward !== undefined && s.reward !== null) facts.push(fact("reward", String(s.reward)));
    if (s.now && s.last_active) facts.push(fact("idle", fmtAge(s.now - s.last_active)));
    $("summary").replaceChildren(...facts);
  }

  // an agent context of the session (main agent, sub-agents, side requests): one at a time
  function contextPicker(ov, s) {
    const select = el("select", { id: "context" }, ...s.contexts.map((c) => el("option", {
      value: c.context_id, selected: c.context_id === s.context ? "selected" : null },
      c.context_id + " · " + c.role + (c.parent_agent_id ? " of " + c.parent_agent_id : "") +
      " · " + fmtInt(c.num_turns) + (c.num_turns === 1 ? " turn" : " turns"))));
    select.addEventListener("change", () => go(ov.id, null, select.value));
    return el("label", { class: "fact" }, "agent context ", select);
  }

  function renderTree(ov) {
    const section = $("tree-section");
    if (!ov.tree) { section.hidden = true; $("tree").replaceChildren(); return; }
    section.hidden = false;
    const nodes = new Map(ov.tree.nodes.map((n) => [n.id, n]));
    const onPath = new Set();
    for (let id = ov.leaf; id !== null && id !== undefined && nodes.has(id); id = nodes.get(id).parent) {
      onPath.add(id);
    }
    const items = [];
    const stack = ov.tree.nodes.filter((n) => n.parent === null).map((n) => n.id).reverse();
    while (stack.length) {
      const node = nodes.get(stack.pop());
      items.push(treeItem(node, onPath, ov.leaf));
      for (const child of node.children.slice().reverse()) if (nodes.has(child)) stack.push(child);
    }
    $("tree").replaceChildren(...items);
    const leaves = ov.tree.nodes.filter((n) => n.leaf).length;
    $("tree-note").textContent = "(" + nodes.size + " nodes, " + leaves +
      " leaves; click a node to show its path)";
  }

  function treeItem(node, onPath, selected) {
    const parts = [(node.depth ? "└ " : "") + "#" + node.id, node.finish_reason,
                   fmtInt(node.output_len) + " generated", fmtInt(node.num_tokens) + " tok"];
    if (node.truncated) parts.push("cut by length");
    const badges = [];
    if (node.leaf) {
      badges.push(el("span", { class: "state state-" + node.state }, node.state));
      if (node.trimmed && node.state !== "trimmed") {
        badges.push(el("span", { class: "state state-cut" }, "cut by max_seq_len"));
      }
    }
    const item = el("li", {
      data: { node: node.id, depth: node.depth, leaf: node.leaf ? "1" : "0",
              state: node.state || "" },
      class: node.id === selected ? "selected" : onPath.has(node.id) ? "on-path" : null,
    }, parts.join(" · "), ...badges);
    item.style.paddingLeft = (6 + Math.min(node.depth, 24) * 14) + "px";  // CSSOM: CSP-safe
    item.addEventListener("click", () => go(state.sid, node.id, state.context));
    return item;
  }

  function renderSamples(preview) {
    const rows = preview.samples.map((s) => {
      const mismatch = Object.entries(s.mismatch).filter(([, n]) => n > 0)
        .map(([kind, n]) => kind + ": " + n).join(", ") || "none";
      return el("tr", { data: { status: s.status, leaf: s.leaf === null ? "" : s.leaf } },
        el("td", { class: "num" }, s.index),
        el("td", {}, s.leaf === null ? "" : "#" + s.leaf),
        el("td", { class: "status-" + s.status }, s.status),
        el("td", { class: "num" }, fmtInt(s.tokens)),
        el("td", { class: "num" }, fmtInt(s.prompt_length)),
        el("td", { class: "num" }, fmtInt(s.response_length)),
        el("td", { class: "num" }, fmtInt(s.loss_mask_ones) + " (" +
           (100 * s.mask_coverage).toFixed(1) + "%)"),
        el("td", { class: "num" }, s.reward === null ? "" : String(s.reward)),
        el("td", { class: s.strict_mismatches > 0 ? "bad" : null,
                   title: s.mismatch_detail.map((m) => m.type + ": " + (m.detail || "")).join("\n") },
           s.mismatch_error ? "error: " + s.mismatch_error : mismatch));
    });
    $("samples").tBodies[0].replaceChildren(...rows);
    const note = preview.error ? "assembly failed: " + preview.error
      : preview.empty_reason ? "no samples (" + preview.empty_reason + ")" : "";
    $("samples-note").hidden = !note;
    $("samples-note").textContent = note;
  }

  // -- the strip ---------------------------------------------------------------------------
  function startStrip(sid, leaf, info, context) {
    if (state.strip) state.strip.destroy();
    state.strip = new Strip($("strip"), sid, leaf, info.num_tokens, context);
    $("strip-note").textContent = "(" + fmtInt(info.num_tokens) + " tokens" +
      (info.has_text ? "" : "; no tokenizer: ids shown") + ")";
  }

  class Strip {
    constructor(root, sid, leaf, total, context) {
      this.root = root;
      this.sid = sid;
      this.leaf = leaf;
      this.context = context || null;
      this.total = total;
      this.pages = new Map();
      this.rendered = new Set();
      this.loading = new Set();
      this.pxPerToken = 1.2;
      this.dead = false;
      root.replaceChildren();
      root.scrollTop = 0;
      root.dataset.total = String(total);
      root.classList.toggle("heat", state.colour === "logprob");
      this.chunks = [];
      for (let k = 0; k * CHUNK < total; k++) {
        const chunk = el("div", { class: "chunk pending", data: { chunk: k, state: "pending" } });
        chunk.style.height = this.estimate(k) + "px";
        this.chunks.push(chunk);
      }
      root.append(...this.chunks);
      if (!total) root.append(el("span", { class: "muted" }, "(no tokens)"));
      this.observer = new IntersectionObserver((entries) => this.onView(entries),
                                               { root: root, rootMargin: "1500px 0px" });
      for (const chunk of this.chunks) this.observer.observe(chunk);
    }

    estimate(k) {
      const n = Math.min(CHUNK, this.total - k * CHUNK);
      return Math.max(24, Math.round(n * this.pxPerToken));
    }

    onView(entries) {
      for (const entry of entries) {
        const k = Number(entry.target.dataset.chunk);
        if (entry.isIntersecting) this.show(k);
        else this.hide(k, entry.boundingClientRect.height);
      }
    }

    async page(k) {
      if (this.pages.has(k)) return this.pages.get(k);
      const page = await getJSON("/sessions/" + encodeURIComponent(this.sid) + "/tokens",
                                 { offset: k * CHUNK, limit: CHUNK, leaf: this.leaf,
                                   context: this.context });
      this.pages.set(k, page);
      while (this.pages.size > PAGES_KEPT) this.pages.delete(this.pages.keys().next().value);
      return page;
    }

    async show(k) {
      if (this.rendered.has(k) || this.loading.has(k)) return;
      this.loading.add(k);
      try {
        const page = await this.page(k);
        if (!this.dead) this.render(k, page);
      } catch (err) {
        if (!this.dead) this.chunks[k].textContent = "failed to load tokens: " + err.message;
      } finally {
        this.loading.delete(k);
      }
    }

    render(k, page) {
      const chunk = this.chunks[k];
      chunk.replaceChildren(buildChunk(page));
      chunk.classList.remove("pending");
      chunk.dataset.state = "rendered";
      chunk.style.height = "";  // no layout is forced here: the observer measures it later
      this.rendered.add(k);
      this.root.dataset.rendered = String(this.rendered.size);
    }

    hide(k, height) {
      if (!this.rendered.has(k)) return;
      const chunk = this.chunks[k];
      const tokens = Math.min(CHUNK, this.total - k * CHUNK);
      if (height > 0) this.pxPerToken = 0.7 * this.pxPerToken + 0.3 * height / tokens;
      chunk.style.height = height + "px";
      chunk.replaceChildren();
      chunk.classList.add("pending");
      chunk.dataset.state = "pending";
      this.rendered.delete(k);
      this.root.dataset.rendered = String(this.rendered.size);
    }

    redraw() {
      this.root.classList.toggle("heat", state.colour === "logprob");
      for (const k of this.rendered) {
        if (this.pages.has(k)) this.render(k, this.pages.get(k));
      }
    }

    destroy() {
      this.dead = true;
      this.observer.disconnect();
    }
  }

  function buildChunk(page) {
    const frag = document.createDocumentFragment();
    const ends = new Map(page.turns.map((t) => [t.end, t]));
    const blocks = page.blocks.slice().sort((a, b) => a.start - b.start);
    let b = 0;
    let block = null;
    let parent = frag;
    for (let j = 0; j < page.ids.length; j++) {
      const i = page.offset + j;
      if (block === null) {
        while (b < blocks.length && blocks[b].end <= i) b++;
        if (b < blocks.length && blocks[b].start <= i) {
          block = blocks[b];
          parent = openBlock(block, i > block.start);
          frag.append(parent);
        }
      }
      parent.append(tokenElement(page, j, i));
      if (block !== null && i + 1 >= block.end) {
        block = null;
        parent = frag;
        b++;
      }
      const turn = ends.get(i + 1);
      if (turn) {
        block = null;
        parent = frag;
        frag.append(turnSeparator(turn));
      }
    }
    return frag;
  }

  function tokenElement(page, j, i) {
    const o = page.origin[j], m = page.mask[j], logprob = page.logprob[j];
    const text = page.text ? page.text[j] : "⟨" + page.ids[j] + "⟩";
    const span = document.createElement("span");
    span.className = "t o-" + o + " m-" + m + (text === "" ? " empty" : "") +
      (NEWLINES.test(text) ? " nl" : "");
    span.dataset.i = i;
    span.dataset.id = page.ids[j];
    span.dataset.origin = ORIGIN[o];
    span.dataset.mask = m;
    if (logprob !== null) {
      span.dataset.logprob = logprob;
      if (state.colour === "logprob") span.style.background = heat(logprob);
    }
    span.textContent = text;
    return span;
  }

  function isFolded(block) {
    const key = String(block.start);
    return state.folded.has(key) ? state.folded.get(key) : !!state.foldDefault[block.kind];
  }

  function blockHead(block, folded, continued) {
    return (folded ? "▸ " : "▾ ") + block.label + (continued ? " (cont.)" : "") +
      " · " + fmtInt(block.end - block.start) + " tokens";
  }

  function openBlock(block, continued) {
    const folded = isFolded(block);
    const wrap = el("span", { class: "blk blk-" + block.kind + (folded ? " folded" : ""),
                              data: { block: block.start, kind: block.kind,
                                      end: block.end, continued: continued ? "1" : "0" } });
    const head = el("span", { class: "blk-head", role: "button", tabindex: "0" },
                    blockHead(block, folded, continued));
    head.addEventListener("click", () => toggleBlock(block));
    head.addEventListener("keydown", (event) => {
      if (event.key === "Enter" || event.key === " ") { event.preventDefault(); toggleBlock(block); }
    });
    wrap.append(head);
    return wrap;
  }

  function toggleBlock(block) {
    const folded = !isFolded(block);
    state.folded.set(String(block.start), folded);
    for (const wrap of $("strip").querySelectorAll('.blk[data-block="' + block.start + '"]')) {
      wrap.classList.toggle("folded", folded);
      wrap.firstChild.textContent = blockHead(block, folded, wrap.dataset.continued === "1");
    }
  }

  function turnSeparator(turn) {
    const parts = ["end of turn " + (turn.turn + 1)];
    if (turn.node_id !== null && turn.node_id !== undefined) parts.push("node #" + turn.node_id);
    parts.push("finish " + (turn.finish_reason || "?"), fmtLatency(turn.e2e_latency),
               fmtInt(turn.end - turn.gen_start) + " generated");
    if (turn.weight_version) parts.push("weights " + turn.weight_version);
    return el("span", { class: "turn-sep finish-" + turn.finish_reason,
                        data: { turn: turn.turn, finish: turn.finish_reason || "" } },
              parts.join(" · "));
  }

  // -- tooltip -------------------------------------------------------------------------------
  function tooltip(event) {
    const tip = $("tip");
    const token = event.target.closest ? event.target.closest(".t[data-i]") : null;
    if (!token) { tip.hidden = true; return; }
    const lines = ["#" + token.dataset.i + "  id " + token.dataset.id + "  " + token.dataset.origin,
                   "loss mask " + ({ "1": "1", "0": "0", "-": "- (prompt)",
                                     x: "not in the sample" })[token.dataset.mask]];
    if (token.dataset.logprob !== undefined) {
      const lp = Number(token.dataset.logprob);
      lines.push("logprob " + lp.toFixed(4) + "  p=" + Math.exp(lp).toFixed(3));
    }
    lines.push(JSON.stringify(token.textContent));
    tip.textContent = lines.join("\n");
    tip.hidden = false;
    tip.style.left = Math.min(event.clientX + 14, window.innerWidth - 300) + "px";
    tip.style.top = (event.clientY + 16) + "px";
  }

  // -- wiring --------------------------------------------------------------------------------
  async function refresh() {
    try {
      await loadSessions();
    } catch (err) {
      $("source").textContent = "cannot list sessions: " + err.message;
      return;
    }
    const item = state.sid ? state.listed.get(state.sid) : null;
    const ov = state.overview;
    if (item && ov && ov.id === state.sid && ov.version !== "file" &&
        (item.turns !== ov.summary.turns || item.status !== ov.summary.status ||
         (item.nodes || 0) !== (ov.summary.nodes || 0) ||
         (item.contexts || 0) !== (ov.summary.contexts || []).length ||
         item.last_active !== ov.summary.last_active)) {
      openSession(state.sid, state.leaf, state.context);
    }
  }

  function init() {
    $("refresh").addEventListener("click", refresh);
    $("sessions-more").addEventListener("click", () => {
      state.listLimit += LIST_PAGE;
      refresh();
    });
    $("colour").addEventListener("change", (event) => {
      state.colour = event.target.value;
      $("heat-key").hidden = state.colour !== "logprob";
      if (state.strip) state.strip.redraw();
    });
    $("unfold").addEventListener("click", () => {
      state.folded.clear();
      state.foldDefault = { think: false, tool_call: false, tool_result: false };
      if (state.strip) state.strip.redraw();
    });
    $("fold").addEventListener("click", () => {
      state.folded.clear();
      state.foldDefault = Object.assign({}, FOLD_DEFAULT);
      if (state.strip) state.strip.redraw();
    });
    $("strip").addEventListener("mouseover", tooltip);
    $("strip").addEventListener("mousemove", tooltip);
    $("strip").addEventListener("mouseleave", () => { $("tip").hidden = true; });
    window.addEventListener("hashchange", route);
    setInterval(() => {
      if (!document.hidden && state.source && state.source.kind !== "file" &&
          $("auto-refresh").checked) refresh();
    }, REFRESH_MS);
    loadSessions().then(route, (err) => {
      $("source").textContent = "cannot list sessions: " + err.message;
    });
  }

  init();
})();
