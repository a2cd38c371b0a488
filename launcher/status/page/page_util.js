// ddprun's live page: the helpers its scripts share (window.DDP.util). Text always goes through
// textContent and data through setAttribute: nothing from the records is ever markup.
'use strict';
(function () {
  const SVGNS = 'http://www.w3.org/2000/svg';
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function svg(tag, attrs, parent) {
    const e = document.createElementNS(SVGNS, tag);
    for (const k in attrs) e.setAttribute(k, String(attrs[k]));
    if (parent) parent.appendChild(e);
    return e;
  }
  function setText(e, t) { t = String(t); if (e.textContent !== t) e.textContent = t; }
  function setAttr(e, k, v) { v = String(v); if (e.getAttribute(k) !== v) e.setAttribute(k, v); }
  function setBadge(e, state) { setText(e, state || 'unknown'); setAttr(e, 'data-state', state || 'unknown'); }
  const num = (x) => typeof x === 'number' && isFinite(x);
  function fmtDur(s) {
    if (!num(s) || s <= 0) return '–';
    if (s < 1e-3) return (s * 1e6).toFixed(0) + ' µs';
    if (s < 1) return (s * 1e3).toFixed(s < 0.01 ? 2 : 1) + ' ms';
    if (s < 120) return s.toFixed(2) + ' s';
    if (s < 7200) return (s / 60).toFixed(1) + ' min';
    return (s / 3600).toFixed(1) + ' h';
  }
  function fmtBytes(b) {
    if (!num(b)) return '–';
    const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (b >= 1024 && i < u.length - 1) { b /= 1024; ++i; }
    return (i ? b.toFixed(b < 10 ? 1 : 0) : b.toFixed(0)) + ' ' + u[i];
  }
  const fmtPct = (f) => num(f) ? (f * 100).toFixed(0) + ' %' : '–';
  const pad = (n) => String(n).padStart(2, '0');
  function fmtClock(unix) {
    if (!num(unix) || unix <= 0) return '–';
    const d = new Date(unix * 1000);
    return pad(d.getHours()) + ':' + pad(d.getMinutes()) + ':' + pad(d.getSeconds());
  }
  function fmtRate(x) {
    if (!num(x) || x <= 0) return '–';
    if (x >= 1e6) return (x / 1e6).toFixed(2) + 'M/s';
    if (x >= 1e4) return (x / 1e3).toFixed(1) + 'k/s';
    return (x >= 100 ? x.toFixed(0) : x.toFixed(1)) + '/s';
  }
  // A metric's value: 4 significant digits, exponent form when very small or large.
  function fmtValue(v) {
    if (!num(v)) return '–';
    const a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(3);
    return String(Number(v.toPrecision(4)));
  }
  window.DDP = window.DDP || {};
  window.DDP.util = { el, svg, setText, setAttr, setBadge, num, fmtDur, fmtBytes, fmtPct, fmtClock,
    fmtRate, fmtValue };
})();
