// ddprun's live page, its main script (docs/status.md): polls api/status every second and draws
// the job summary and curves (page_charts.js), the nodes and their ranks (cards, or the compact
// view of a large job: page_compact.js), and the restarts over time.
'use strict';
(function () {
  const POLL_MS = 1000, FETCH_TIMEOUT_MS = 5000, HISTORY = 300, RUNS_EVERY = 10;
  const STATES = ['starting', 'running', 'succeeded', 'failed', 'stopped', 'hung', 'lost'];
  const CAUSE_COLOURS = { exitcode: '#d43c3c', signal: '#e0662f', oom: '#b8321f', hang: '#8e44ad',
    node_lost: '#555b66', spawn: '#c7831a', store_lost: '#2b6cb0', other: '#7a8aa6' };
  const PHASE_COLOURS = { rendezvous: '#7a8aa6', spawn: '#2b6cb0', run: '#1f9d55',
    restart: '#c7831a', stop: '#d43c3c' };
  const query = new URLSearchParams(location.search);
  const runParam = query.get('run');
  const statusUrl = 'api/status' + (runParam ? '?run=' + encodeURIComponent(runParam) : '');
  const historyUrl = 'api/history?scope=job' + (runParam ? '&run=' + encodeURIComponent(runParam) : '');
  const $ = (id) => document.getElementById(id);
  const cards = new Map();   // slot -> node card
  const history = new Map(); // "slot:local_rank" -> [{t, v, r}]
  let polls = 0, lostSince = 0, restartsSig = '';

  const { el, svg, setText, setAttr, setBadge, num, fmtDur, fmtBytes, fmtPct, fmtClock, fmtRate } =
    window.DDP.util;
  const charts = window.DDP.charts, compact = window.DDP.compact;
  // Above this many ranks the page shows the compact view (page_compact.js): cards on demand.
  const COMPACT_AT = 48, HISTORY_EVERY = 5;
  const openCards = new Map(); // slot -> card, in the compact view
  // The browser's own time to draw one poll's answer (ms): the page's update cost, measured.
  window.ddpRender = { last: 0, max: 0, count: 0, total: 0 };

  // ---- one rank tile
  const FIELDS = [['step', 'step'], ['steptime', 'step time'], ['sps', 'samples/s'], ['cpu', 'CPU'],
    ['rss', 'RSS'], ['restarts', 'restarts'], ['exit', 'last exit'], ['gpu', 'GPU'], ['gpumem', 'GPU mem'],
    ['metrics', 'metrics']];
  function makeTile() {
    const t = { root: el('div', 'rank'), f: {}, rows: {} };
    t.root.setAttribute('role', 'group');
    const head = el('div', 'rank-head');
    t.title = el('span', 'rank-title');
    t.sub = el('span', 'rank-sub');
    t.badge = el('span', 'badge');
    head.append(t.title, t.sub, t.badge);
    const fields = el('div', 'fields');
    for (const [key, label] of FIELDS) {
      const k = el('span', 'k', label), v = el('span', 'v');
      v.setAttribute('data-field', key);
      fields.append(k, v);
      t.f[key] = v;
      t.rows[key] = [k, v];
    }
    t.err = el('div', 'err');
    t.err.setAttribute('data-field', 'last-error');
    t.chart = svg('svg', { class: 'spark', viewBox: '0 0 200 40', preserveAspectRatio: 'none',
      role: 'img' });
    t.chartTitle = svg('title', {}, t.chart);
    svg('line', { class: 'axis', x1: 0, y1: 39.5, x2: 200, y2: 39.5 }, t.chart);
    t.marks = svg('g', {}, t.chart);
    t.line = svg('polyline', { points: '' }, t.chart);
    t.max = el('div', 'spark-label');
    t.root.append(head, fields, t.err, t.max, t.chart);
    return t;
  }
  function showRow(t, key, on) { for (const e of t.rows[key]) e.hidden = !on; }

  function updateTile(t, n, r) {
    setAttr(t.root, 'data-rank', r.rank);
    setAttr(t.root, 'data-local-rank', r.local_rank);
    setAttr(t.root, 'data-slot', n.slot);
    setAttr(t.root, 'data-state', r.state);
    setAttr(t.root, 'data-pid', r.pid);
    setAttr(t.root, 'data-restarts', r.restarts);
    setAttr(t.root, 'aria-label', 'rank ' + r.rank + ' ' + r.state);
    setText(t.title, 'rank ' + r.rank);
    setText(t.sub, 'local ' + r.local_rank + (r.pid ? ' · pid ' + r.pid : ''));
    setBadge(t.badge, r.state);
    const step = r.step >= 0 ? String(r.step) + (r.total_steps > 0 ? ' / ' + r.total_steps : '') : '–';
    setText(t.f.step, step);
    setText(t.f.steptime, fmtDur(r.step_time_s));
    setText(t.f.sps, fmtRate(r.samples_per_s));
    setText(t.f.cpu, fmtPct(r.cpu));
    setText(t.f.rss, r.rss_bytes > 0 ? fmtBytes(r.rss_bytes) : '–');
    setText(t.f.restarts, r.restarts);
    const exited = num(r.last_exit);
    showRow(t, 'exit', exited);
    if (exited) setText(t.f.exit, r.last_exit < 0 ? 'signal ' + -r.last_exit : 'code ' + r.last_exit);
    const hasGpu = num(r.gpu_util) || num(r.gpu_mem_used);
    showRow(t, 'gpu', hasGpu);
    showRow(t, 'gpumem', hasGpu);
    if (hasGpu) {
      setText(t.f.gpu, (r.gpu >= 0 ? '#' + r.gpu + ' ' : '') + fmtPct(r.gpu_util));
      setText(t.f.gpumem, fmtBytes(r.gpu_mem_used) + (num(r.gpu_mem_total) ? ' / ' + fmtBytes(r.gpu_mem_total) : ''));
    }
    const mk = Object.keys(r.metrics || {}).sort();
    showRow(t, 'metrics', mk.length > 0);
    setText(t.f.metrics, mk.map((k) => k + ' ' + window.DDP.util.fmtValue(r.metrics[k])).join(' · '));
    setText(t.err, r.last_error ? 'last error: ' + r.last_error : '');
    t.err.hidden = !r.last_error;
    drawSpark(t, history.get(n.slot + ':' + r.local_rank) || []);
  }

  // ---- the step-time chart of one rank (its rolling history; red dashes: restarts)
  function drawSpark(t, h) {
    const pts = h.filter((p) => p.v > 0);
    if (pts.length === 0) {
      setAttr(t.line, 'points', '');
      setText(t.max, 'step time: no data yet');
      setText(t.chartTitle, 'step time history: no data yet');
      t.marks.replaceChildren();
      return;
    }
    if (pts.length === 1) pts.push({ t: pts[0].t + 1, v: pts[0].v }); // a level line, not a dot
    const t0 = Math.min(h[0].t, pts[0].t), span = Math.max(pts[pts.length - 1].t - t0, h[h.length - 1].t - t0, 1);
    let vmax = 0;
    for (const p of pts) vmax = Math.max(vmax, p.v);
    vmax *= 1.15;
    const x = (tt) => ((tt - t0) / span * 198 + 1).toFixed(1);
    setAttr(t.line, 'points', pts.map((p) => x(p.t) + ',' + (39 - p.v / vmax * 37).toFixed(1)).join(' '));
    setText(t.max, 'step time, max ' + fmtDur(vmax / 1.15) + ', last ' + fmtDur(pts[pts.length - 1].v));
    setText(t.chartTitle, 'step time over the last ' + Math.round(span) + ' s');
    t.marks.replaceChildren();
    for (let i = 1; i < h.length; ++i) {
      if (h[i].r !== h[i - 1].r) svg('line', { class: 'restart', x1: x(h[i].t), x2: x(h[i].t), y1: 0, y2: 40 }, t.marks);
    }
  }

  function record(n) {
    for (const r of n.ranks) {
      const key = n.slot + ':' + r.local_rank;
      let h = history.get(key);
      if (!h) history.set(key, (h = []));
      const last = h[h.length - 1];
      if (last && last.t >= n.updated) continue; // the same publication polled again
      h.push({ t: n.updated, v: r.state === 'running' ? r.step_time_s : 0, r: r.restarts });
      if (h.length > HISTORY) h.splice(0, h.length - HISTORY);
    }
  }

  // ---- one node card
  function makeCard() {
    const c = { root: el('div', 'node'), tiles: new Map() };
    const head = el('div', 'node-head');
    c.title = el('span', 'node-title');
    c.badge = el('span', 'badge');
    c.meta = el('span', 'k');
    c.lost = el('span', 'lost-mark', 'LOST: no update for a while');
    c.ranks = el('div', 'ranks');
    c.none = el('p', 'empty', 'no workers');
    head.append(c.title, c.badge, c.meta, c.lost);
    c.root.append(head, c.ranks, c.none);
    return c;
  }
  function updateCard(c, n, now) {
    setAttr(c.root, 'data-slot', n.slot);
    setAttr(c.root, 'data-state', n.state);
    setAttr(c.root, 'data-lost', n.lost ? 1 : 0);
    setText(c.title, n.host + ' · slot ' + n.slot);
    setBadge(c.badge, n.state);
    const parts = ['group rank ' + (n.group_rank >= 0 ? n.group_rank : '–') + ' of ' + n.group_world_size,
      'round ' + (n.round >= 0 ? n.round : '–'), 'restarts ' + n.restart_count + ' / ' + n.max_restarts,
      'agent pid ' + n.agent_pid, 'updated ' + Math.max(0, now - n.updated).toFixed(1) + ' s ago'];
    if (n.job_id) parts.push('job ' + n.job_id);
    setText(c.meta, parts.join(' · '));
    c.lost.hidden = !n.lost;
    const seen = new Set();
    const ranks = n.ranks.slice().sort((a, b) => a.local_rank - b.local_rank);
    ranks.forEach((r, i) => {
      seen.add(r.local_rank);
      let t = c.tiles.get(r.local_rank);
      if (!t) c.tiles.set(r.local_rank, (t = makeTile()));
      if (c.ranks.children[i] !== t.root) c.ranks.insertBefore(t.root, c.ranks.children[i] || null);
      updateTile(t, n, r);
    });
    for (const [lr, t] of c.tiles) if (!seen.has(lr)) { t.root.remove(); c.tiles.delete(lr); }
    c.none.hidden = ranks.length > 0;
    return ranks.length;
  }

  // ---- restarts: failures by cause, a timeline of phases and restarts per node, a list
  function drawRestarts(job) {
    const nodes = job.nodes;
    const tl = $('timeline'), width = Math.round(tl.getBoundingClientRect().width);
    const sig = width + JSON.stringify(nodes.map((n) => [n.slot, n.restarts.length, n.phases.length,
      n.restarts.length ? n.restarts[n.restarts.length - 1].at : 0,
      n.phases.length ? n.phases[n.phases.length - 1].end : 0])) + Math.floor(job.now / 5);
    if (sig === restartsSig) return;
    restartsSig = sig;
    const causes = {};
    for (const n of nodes) for (const k in n.failures_by_cause) causes[k] = Math.max(causes[k] || 0, n.failures_by_cause[k]);
    const ck = Object.keys(causes).filter((k) => causes[k] > 0);
    setText($('causes'), ck.length ? 'failures by cause: ' + ck.map((k) => k + ' ' + causes[k]).join(', ') : 'no failures');

    tl.replaceChildren();
    const W = Math.max((width || 1000) - 2, 400), L = 150, R = 10, ROW = 22, H = 26 + ROW * Math.max(nodes.length, 1);
    tl.setAttribute('viewBox', '0 0 ' + W + ' ' + H);
    tl.setAttribute('height', String(H + 2));
    tl.setAttribute('preserveAspectRatio', 'xMinYMin meet');
    let t0 = job.now;
    for (const n of nodes) {
      if (n.started > 0) t0 = Math.min(t0, n.started);
      for (const p of n.phases) if (p.start > 0) t0 = Math.min(t0, p.start);
    }
    const span = Math.max(job.now - t0, 1);
    const x = (t) => L + (Math.min(Math.max(t, t0), job.now) - t0) / span * (W - L - R);
    const axisY = H - 12;
    svg('text', { x: L, y: H - 2 }, tl).textContent = fmtClock(t0);
    svg('text', { x: W - R, y: H - 2, 'text-anchor': 'end' }, tl).textContent = fmtClock(job.now) + ' (now)';
    svg('line', { class: 'row', x1: L, x2: W - R, y1: axisY, y2: axisY }, tl);
    nodes.forEach((n, i) => {
      const y = 6 + i * ROW;
      const label = n.host + ' #' + n.slot;
      svg('text', { x: 4, y: y + 13 }, tl).textContent = label.length > 24 ? label.slice(0, 23) + '…' : label;
      svg('line', { class: 'row', x1: L, x2: W - R, y1: y + ROW - 2, y2: y + ROW - 2 }, tl);
      for (const p of n.phases) {
        const end = p.end > 0 ? p.end : job.now;
        const r = svg('rect', { class: 'phase', x: x(p.start), y: y + 3, height: ROW - 8,
          width: Math.max(x(end) - x(p.start), 1), fill: PHASE_COLOURS[p.name] || '#7a8aa6' }, tl);
        svg('title', {}, r).textContent = p.name + ' ' + fmtClock(p.start) + '–' + (p.end > 0 ? fmtClock(p.end) : 'now') + (p.detail ? ': ' + p.detail : '');
      }
      for (const e of n.restarts) {
        const c = svg('circle', { class: 'ev', cx: x(e.at), cy: y + ROW / 2 - 1, r: 6,
          fill: CAUSE_COLOURS[e.cause] || '#7a8aa6' }, tl);
        svg('title', {}, c).textContent = fmtClock(e.at) + ' round ' + e.round + ' ' + e.cause + ': ' + e.what;
      }
    });

    const events = [];
    for (const n of nodes) for (const e of n.restarts) events.push([e, n]);
    events.sort((a, b) => b[0].at - a[0].at);
    const body = $('restart-list').tBodies[0];
    body.replaceChildren();
    for (const [e, n] of events.slice(0, 100)) {
      const tr = el('tr');
      tr.setAttribute('data-cause', e.cause);
      tr.append(el('td', '', fmtClock(e.at)), el('td', '', n.host + ' #' + n.slot), el('td', '', String(e.round)),
        el('td', '', e.cause), el('td', '', e.what));
      body.appendChild(tr);
    }
    if (!events.length) {
      const tr = el('tr'), td = el('td', 'empty', 'no restarts so far');
      td.colSpan = 5;
      tr.appendChild(td);
      body.appendChild(tr);
    }
  }

  // ---- one poll's result
  function renderCards(box, nodes, now) {
    let shown = 0;
    const seen = new Set();
    nodes.forEach((n, i) => {
      seen.add(n.slot);
      record(n);
      let c = cards.get(n.slot);
      if (!c) cards.set(n.slot, (c = makeCard()));
      if (box.children[i] !== c.root) box.insertBefore(c.root, box.children[i] || null);
      shown += updateCard(c, n, now);
    });
    for (const [slot, c] of cards) if (!seen.has(slot)) { c.root.remove(); cards.delete(slot); }
    return shown;
  }
  // The compact view's open cards: those the user asked for, kept up to date.
  function renderOpen(box, nodes, now) {
    const bySlot = new Map(nodes.map((n) => [n.slot, n]));
    for (const [slot, c] of openCards) {
      const n = bySlot.get(slot);
      if (!n) { c.root.remove(); openCards.delete(slot); continue; }
      record(n);
      updateCard(c, n, now);
    }
  }
  function openNode(slot, nodes, now) {
    if (openCards.has(slot)) { openCards.get(slot).root.scrollIntoView({ block: 'nearest' }); return; }
    const n = nodes.find((x) => x.slot === slot);
    if (!n) return;
    const c = makeCard();
    openCards.set(slot, c);
    compact.openBox().prepend(c.root);
    record(n);
    updateCard(c, n, now);
  }

  function render(job) {
    const t0 = performance.now();
    setText($('run-id'), job.run_id || '–');
    setBadge($('job-state'), job.state);
    setText($('round'), job.round >= 0 ? job.round : '–');
    setText($('members'), job.members);
    setText($('restarts'), job.restarts);
    setText($('updated'), fmtClock(job.now));
    setAttr($('updated'), 'data-now', job.now);
    document.title = 'ddprun ' + (job.run_id || '') + ': ' + (job.state || 'unknown');
    charts.summary(job);
    const box = $('nodes');
    const nodes = job.nodes.slice().sort((a, b) => a.slot - b.slot);
    let total = 0;
    for (const n of nodes) total += n.ranks.length;
    const big = total > COMPACT_AT;
    $('compact-section').hidden = !big;
    box.parentElement.hidden = big;
    if (!nodes.length) {
      box.replaceChildren(el('p', 'empty', job.run_id ? 'run ' + job.run_id + ' has no nodes yet' : 'no runs yet'));
      cards.clear();
    } else if (box.firstElementChild && !box.firstElementChild.classList.contains('node')) {
      box.replaceChildren();
    }
    if (big) {
      if (cards.size) { box.replaceChildren(); cards.clear(); history.clear(); }
      compact.render(job, nodes, (slot) => openNode(slot, nodes, job.now));
      renderOpen(compact.openBox(), nodes, job.now);
      setText($('rank-count'), total);
    } else {
      for (const [, c] of openCards) c.root.remove();
      openCards.clear();
      setText($('rank-count'), renderCards(box, nodes, job.now));
    }
    drawRestarts(job);
    const ms = performance.now() - t0, r = window.ddpRender;
    r.last = ms; r.max = Math.max(r.max, ms); r.count += 1; r.total += ms;
  }

  function connection(ok, why) {
    const c = $('conn');
    if (ok) {
      lostSince = 0;
      setAttr(c, 'data-ok', 1);
      setText(c, 'live (every ' + POLL_MS / 1000 + ' s)');
    } else {
      if (!lostSince) lostSince = Date.now() / 1000;
      setAttr(c, 'data-ok', 0);
      setText(c, why + ' since ' + fmtClock(lostSince));
    }
  }

  window.DDP.getJson = getJson;
  async function getJson(url) {
    const ctl = new AbortController();
    const timer = setTimeout(() => ctl.abort(), FETCH_TIMEOUT_MS);
    try {
      let res;
      try {
        res = await fetch(url, { cache: 'no-store', signal: ctl.signal });
      } catch (e) {
        throw new Error(e && e.name === 'AbortError' ? 'connection lost: timed out' : 'connection lost');
      }
      if (!res.ok) { // the views answer {"error": "..."}: say it (an unknown run, no store)
        let why = '';
        try { why = String((await res.json()).error || ''); } catch (e) { why = ''; }
        throw new Error('no status (HTTP ' + res.status + (why ? ': ' + why : '') + ')');
      }
      return await res.json();
    } finally {
      clearTimeout(timer);
    }
  }

  async function poll() {
    try {
      const job = await getJson(statusUrl);
      if (!job || !Array.isArray(job.nodes)) throw new Error('not a job status');
      render(job);
      connection(true);
      if (polls % HISTORY_EVERY === 0) charts.refresh(historyUrl, job);
      if (polls++ % RUNS_EVERY === 0) runs(job.run_id);
    } catch (e) {
      connection(false, String((e && e.message) || e));
    }
    setTimeout(poll, POLL_MS);
  }

  // ---- the run picker (ddprund knows every run it has seen; an agent knows its own)
  async function runs(current) {
    let list;
    try { list = (await getJson('api/runs')).runs; } catch (e) { return; }
    const sel = $('run-select');
    if (!Array.isArray(list) || list.length < 2) { sel.hidden = true; return; }
    sel.replaceChildren();
    for (const id of list.slice().reverse()) {
      const o = el('option', '', String(id));
      o.value = String(id);
      o.selected = id === current;
      sel.appendChild(o);
    }
    sel.hidden = false;
  }
  $('run-select').addEventListener('change', (ev) => {
    const q = new URLSearchParams(location.search);
    q.set('run', ev.target.value);
    location.search = q.toString();
  });

  const tlLegend = $('timeline-legend');
  for (const [name, colour, dot] of Object.entries(PHASE_COLOURS).map(([k, c]) => [k, c, false])
    .concat([['a restart (its colour: the cause; hover for what)', CAUSE_COLOURS.signal, true]])) {
    const item = el('span', '', ''), sw = el('span', dot ? 'swatch dot' : 'swatch');
    sw.style.background = colour;
    if (!dot) sw.style.opacity = '0.5';
    item.append(sw, document.createTextNode(name));
    tlLegend.appendChild(item);
  }
  const legend = $('legend');
  legend.appendChild(el('span', '', 'rank states:'));
  for (const s of STATES) { const b = el('span', 'badge'); setBadge(b, s); legend.appendChild(b); }
  poll();
})();
