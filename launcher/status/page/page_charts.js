// ddprun's live page: the job summary (step N of M, throughput, ETA, goodput, the metrics) and
// the metric curves over the run (window.DDP.charts). The curves come from api/history: the
// job's metrics as its nodes' histories combine them (summed for *_per_s, averaged otherwise),
// each drawn over steps and over wall time with the restarts marked, and listed in a table.
'use strict';
(function () {
  const { el, svg, setText, setAttr, num, fmtDur, fmtClock, fmtRate, fmtValue } = window.DDP.util;
  const $ = (id) => document.getElementById(id);
  const MAX_CHARTS = 12, W = 300, H = 120, L = 44, R = 6, T = 8, B = 18;
  const FIRST = ['loss', 'val_loss', 'samples_per_s', 'tokens_per_s', 'lr'];
  const cards = new Map(); // metric -> its card

  const isRate = (k) => k.length > 6 && k.endsWith('_per_s');

  function summary(job) {
    const step = num(job.step) && job.step >= 0
      ? job.step + (job.total_steps > 0 ? ' of ' + job.total_steps : '') : '–';
    setText($('job-step'), step);
    const m = job.metrics || {}, rates = [];
    if (job.samples_per_s > 0) rates.push(fmtRate(job.samples_per_s).replace('/s', ' samples/s'));
    for (const k of Object.keys(m).sort()) {
      if (isRate(k) && k !== 'samples_per_s') rates.push(fmtValue(m[k]) + ' ' + k.slice(0, -6) + '/s');
    }
    setText($('job-throughput'), rates.length ? rates.join(' · ') : '–');
    setText($('job-eta'), !num(job.eta_s) || job.eta_s < 0 ? '–'
      : job.eta_s === 0 ? 'done' : fmtDur(job.eta_s) + ' (at ' + fmtClock(job.now + job.eta_s) + ')');
    setText($('job-goodput'), num(job.goodput) && job.wall_s > 0
      ? (job.goodput * 100).toFixed(1) + ' % (lost ' + (job.lost_s > 0 ? fmtDur(job.lost_s) : '0 s') +
        ' of ' + fmtDur(job.wall_s) + ' to restarts)' : '–');
    const plain = Object.keys(m).filter((k) => !isRate(k)).sort();
    setText($('job-metrics'), plain.length ? plain.map((k) => k + ' ' + fmtValue(m[k])).join(' · ') : '–');
  }

  function makeCard(key) {
    const c = { root: el('div', 'curve-card'), sig: '' };
    c.root.setAttribute('data-metric', key);
    c.title = el('h3', '', key);
    const pair = el('div', 'curve-pair');
    c.step = makeChart('step', key + ' over steps');
    c.time = makeChart('time', key + ' over wall time (dashes: restarts)');
    pair.append(c.step.root, c.time.root);
    c.details = el('details');
    c.summary = el('summary', '', 'values');
    c.table = el('table');
    const head = el('tr');
    head.append(el('th', '', 'step'), el('th', '', 'time'), el('th', '', key));
    c.table.append(el('thead'), el('tbody'));
    c.table.tHead.appendChild(head);
    c.details.append(c.summary, c.table);
    c.root.append(c.title, pair, c.details);
    return c;
  }
  function makeChart(axis, label) {
    const root = svg('svg', { class: 'curve', viewBox: '0 0 ' + W + ' ' + H, preserveAspectRatio: 'none',
      role: 'img', 'aria-label': label, 'data-axis': axis });
    svg('line', { class: 'axis', x1: L, y1: H - B + 0.5, x2: W - R, y2: H - B + 0.5 }, root);
    svg('line', { class: 'axis', x1: L - 0.5, y1: T, x2: L - 0.5, y2: H - B }, root);
    const g = { root, marks: svg('g', {}, root), line: svg('polyline', { points: '' }, root),
      ymax: svg('text', { x: L - 3, y: T + 7, 'text-anchor': 'end' }, root),
      ymin: svg('text', { x: L - 3, y: H - B, 'text-anchor': 'end' }, root),
      x0: svg('text', { x: L, y: H - 4 }, root),
      x1: svg('text', { x: W - R, y: H - 4, 'text-anchor': 'end' }, root) };
    return g;
  }

  // pts: [[step, time, value]]; xi: 0 (step) or 1 (time)
  function drawChart(g, pts, xi, restarts, fmtX) {
    let xmin = Infinity, xmax = -Infinity, ymin = Infinity, ymax = -Infinity;
    for (const p of pts) {
      xmin = Math.min(xmin, p[xi]); xmax = Math.max(xmax, p[xi]);
      ymin = Math.min(ymin, p[2]); ymax = Math.max(ymax, p[2]);
    }
    if (ymax === ymin) { ymax += Math.abs(ymax) * 0.05 || 1; ymin -= Math.abs(ymin) * 0.05 || 1; }
    const xs = Math.max(xmax - xmin, 1e-9);
    const x = (v) => (L + (v - xmin) / xs * (W - L - R)).toFixed(1);
    const y = (v) => (H - B - (v - ymin) / (ymax - ymin) * (H - B - T)).toFixed(1);
    setAttr(g.line, 'points', pts.map((p) => x(p[xi]) + ',' + y(p[2])).join(' '));
    setText(g.ymax, fmtValue(ymax));
    setText(g.ymin, fmtValue(ymin));
    setText(g.x0, fmtX(xmin));
    setText(g.x1, fmtX(xmax));
    g.marks.replaceChildren();
    for (const at of restarts) {
      if (at < xmin || at > xmax) continue;
      svg('line', { class: 'restart', x1: x(at), x2: x(at), y1: T, y2: H - B }, g.marks);
    }
  }

  function drawCard(c, key, pts, restarts) {
    const last = pts[pts.length - 1];
    const sig = pts.length + ':' + last.join(',') + ':' + restarts.length;
    if (sig === c.sig) return;
    c.sig = sig;
    drawChart(c.step, pts, 0, [], (v) => 'step ' + Math.round(v));
    drawChart(c.time, pts, 1, restarts, fmtClock);
    setAttr(c.root, 'data-last', last[2]);
    setText(c.title, key + ': ' + fmtValue(last[2]) + ' at step ' + last[0]);
    setText(c.summary, 'values (' + pts.length + ' points)');
    const body = c.table.tBodies[0];
    body.replaceChildren();
    for (const p of pts) {
      const tr = el('tr');
      tr.setAttribute('data-step', p[0]);
      tr.setAttribute('data-value', p[2]);
      tr.append(el('td', '', String(p[0])), el('td', '', fmtClock(p[1])), el('td', '', fmtValue(p[2])));
      body.appendChild(tr);
    }
  }

  function draw(h) {
    const series = (h && h.job) || {};
    const keys = Object.keys(series).filter((k) => Array.isArray(series[k]) && series[k].length)
      .sort((a, b) => {
        const ia = FIRST.indexOf(a), ib = FIRST.indexOf(b);
        return (ia < 0 ? 99 : ia) - (ib < 0 ? 99 : ib) || a.localeCompare(b);
      }).slice(0, MAX_CHARTS);
    const box = $('curves');
    if (!keys.length) return;
    if (box.firstElementChild && !box.firstElementChild.classList.contains('curve-card')) box.replaceChildren();
    const restarts = (h.restarts || []).map((r) => r.at).filter(num);
    keys.forEach((k, i) => {
      let c = cards.get(k);
      if (!c) cards.set(k, (c = makeCard(k)));
      if (box.children[i] !== c.root) box.insertBefore(c.root, box.children[i] || null);
      drawCard(c, k, series[k], restarts);
    });
    for (const [k, c] of cards) if (!keys.includes(k)) { c.root.remove(); cards.delete(k); }
  }

  let inflight = false;
  async function refresh(url) {
    if (inflight) return;
    inflight = true;
    try { draw(await window.DDP.getJson(url)); } catch (e) { /* the status poll says why */ }
    finally { inflight = false; }
  }

  window.DDP.charts = { summary, refresh };
})();
