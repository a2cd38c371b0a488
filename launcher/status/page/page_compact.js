// ddprun's live page: the view of a large job (window.DDP.compact), shown instead of one card
// per rank above a few dozen ranks. One canvas cell per rank, grouped by node (a block of cells
// per node, left to right, in rows), coloured by state, and running ranks by their step time
// against the job's median; beside it the slowest ranks and every failed, hung or lost one.
// A click on a node's block, or on a rank in a list, opens that node's card below.
'use strict';
(function () {
  const { el, setText, setAttr, fmtDur } = window.DDP.util;
  const CELL = 7, GAP = 3, LIST = 10, PROBLEMS = 50;
  const STATE_COLOURS = { starting: '#7a8aa6', succeeded: '#2b6cb0', failed: '#d43c3c',
    stopped: '#c7831a', hung: '#8e44ad', lost: '#555b66' };
  // Running ranks: step time over the job's median.
  const SPEED = [[1.1, '#1f9d55', 'at the median (≤ 1.1x)'], [1.5, '#9bbf30', 'up to 1.5x'],
    [2.5, '#e0a030', 'up to 2.5x'], [Infinity, '#e0662f', 'slower']];
  let ui = null, layout = null;

  function build(open) {
    const root = document.getElementById('compact');
    ui = { root, open };
    ui.caption = el('p', 'k');
    ui.canvas = el('canvas');
    ui.canvas.id = 'heatmap';
    ui.canvas.setAttribute('role', 'img');
    ui.legend = el('div');
    ui.legend.id = 'heat-legend';
    for (const [, c, what] of SPEED) ui.legend.appendChild(swatch(c, 'running, step time ' + what));
    for (const s in STATE_COLOURS) ui.legend.appendChild(swatch(STATE_COLOURS[s], s));
    const lists = el('div', 'compact-lists');
    const slow = el('div'), bad = el('div');
    ui.slowTitle = el('h3', '', 'slowest ranks');
    ui.badTitle = el('h3', '', 'failed, hung or lost ranks');
    ui.slow = el('ol');
    ui.slow.id = 'slowest';
    ui.bad = el('ol');
    ui.bad.id = 'problems';
    slow.append(ui.slowTitle, ui.slow);
    bad.append(ui.badTitle, ui.bad);
    lists.append(slow, bad);
    ui.openBox = el('div');
    ui.openBox.id = 'open-nodes';
    root.replaceChildren(ui.caption, ui.canvas, ui.legend, lists, ui.openBox);
    ui.canvas.addEventListener('click', (ev) => { const n = nodeAt(ev); if (n) ui.open(n.slot); });
    ui.canvas.addEventListener('mousemove', (ev) => {
      const n = nodeAt(ev);
      setAttr(ui.canvas, 'title', n ? n.host + ' #' + n.slot + ': ' + n.ranks.length + ' ranks, ' + n.state +
        ' (click: its card)' : '');
    });
  }
  function swatch(colour, label) {
    const item = el('span'), sw = el('span', 'swatch');
    sw.style.background = colour;
    item.append(sw, document.createTextNode(label));
    return item;
  }
  function nodeAt(ev) {
    if (!layout) return null;
    const r = ui.canvas.getBoundingClientRect();
    const px = (ev.clientX - r.left) * ui.canvas.width / r.width, py = (ev.clientY - r.top) * ui.canvas.height / r.height;
    const col = Math.floor(px / layout.bw), row = Math.floor(py / (CELL + GAP));
    if (col < 0 || col >= layout.perRow) return null;
    return layout.nodes[row * layout.perRow + col] || null;
  }

  function colour(r, median) {
    if (r.state !== 'running') return STATE_COLOURS[r.state] || STATE_COLOURS.starting;
    if (!(r.step_time_s > 0) || !(median > 0)) return SPEED[0][1];
    const ratio = r.step_time_s / median;
    for (const [bound, c] of SPEED) if (ratio <= bound) return c;
    return SPEED[SPEED.length - 1][1];
  }

  function rankButton(n, r, text) {
    const li = el('li'), b = el('button', '', text);
    li.setAttribute('data-rank', r.rank);
    li.setAttribute('data-slot', n.slot);
    li.setAttribute('data-state', r.state);
    b.addEventListener('click', () => ui.open(n.slot));
    li.appendChild(b);
    return li;
  }

  function render(job, nodes, open) {
    if (!ui) build(open);
    ui.open = open;
    let cells = 1, total = 0;
    const times = [], running = [], problems = [];
    for (const n of nodes) {
      cells = Math.max(cells, Math.min(n.ranks.length, 64));
      total += n.ranks.length;
      for (const r of n.ranks) {
        if (r.state === 'running' && r.step_time_s > 0) { times.push(r.step_time_s); running.push([n, r]); }
        if (r.state === 'failed' || r.state === 'hung' || r.state === 'lost') problems.push([n, r]);
      }
    }
    times.sort((a, b) => a - b);
    const median = times.length ? times[Math.floor(times.length / 2)] : 0;
    const width = Math.max(ui.root.clientWidth - 20, 300);
    const bw = cells * CELL + GAP, perRow = Math.max(1, Math.floor(width / bw));
    const rows = Math.ceil(nodes.length / perRow);
    layout = { bw, perRow, nodes };
    const cw = perRow * bw, ch = Math.max(rows * (CELL + GAP), CELL);
    if (ui.canvas.width !== cw) ui.canvas.width = cw;
    if (ui.canvas.height !== ch) ui.canvas.height = ch;
    ui.canvas.style.width = cw + 'px';
    ui.canvas.style.height = ch + 'px';
    const g = ui.canvas.getContext('2d');
    g.clearRect(0, 0, cw, ch);
    nodes.forEach((n, i) => {
      const x0 = (i % perRow) * bw, y0 = Math.floor(i / perRow) * (CELL + GAP);
      const ranks = n.ranks.slice(0, 64).sort((a, b) => a.local_rank - b.local_rank);
      ranks.forEach((r, j) => {
        g.fillStyle = n.lost ? STATE_COLOURS.lost : colour(r, median);
        g.fillRect(x0 + j * CELL, y0, CELL - 1, CELL);
      });
    });
    setAttr(ui.root, 'data-nodes', nodes.length);
    setAttr(ui.root, 'data-ranks', total);
    setAttr(ui.root, 'data-problems', problems.length);
    setAttr(ui.canvas, 'aria-label', total + ' ranks on ' + nodes.length + ' nodes, ' + problems.length +
      ' failed, hung or lost');
    setText(ui.caption, total + ' ranks on ' + nodes.length + ' nodes, one cell per rank, ' + cells +
      ' to a node; median step time ' + fmtDur(median) + '. Click a node for its card.');
    running.sort((a, b) => b[1].step_time_s - a[1].step_time_s);
    ui.slow.replaceChildren(...running.slice(0, LIST).map(([n, r]) => rankButton(n, r,
      'rank ' + r.rank + ' (' + n.host + ' #' + n.slot + '): ' + fmtDur(r.step_time_s) +
      (median > 0 ? ', ' + (r.step_time_s / median).toFixed(2) + 'x the median' : ''))));
    setText(ui.badTitle, 'failed, hung or lost ranks (' + problems.length + ')');
    problems.sort((a, b) => a[1].rank - b[1].rank);
    ui.bad.replaceChildren(...problems.slice(0, PROBLEMS).map(([n, r]) => rankButton(n, r,
      'rank ' + r.rank + ' (' + n.host + ' #' + n.slot + '): ' + r.state + (r.last_error ? ', ' + r.last_error : ''))));
    if (!problems.length) ui.bad.replaceChildren(el('li', 'empty', 'none'));
  }

  window.DDP.compact = { render, openBox: () => ui.openBox };
})();
