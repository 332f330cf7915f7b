(function () {
'use strict';
var S = JSON.parse(document.getElementById('tmpl-summary').textContent);
var C = S.columns, META = S.meta, VOCAB = S.vocab || {}, N = META.shown;
var ROWH = 24, PROMPT_OPEN = 160;
var COLS = [
  ['row', 'row'], ['index', 'index'], ['sample', 'sample'], ['status', 'status'], ['end', 'end'],
  ['turns', 'turns'], ['tool_calls', 'calls'], ['reward', 'reward'], ['cause', 'drift'], ['staleness', 'stale'],
  ['length', 'length'], ['sampled', 'sampled'], ['version', 'version'], ['sequences', 'seqs'], ['problems', 'problems']
];
var $ = function (id) { return document.getElementById(id); };
function el(tag, cls, text) {
  var e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}
function col(name, i) { return name === 'row' ? i : C[name][i]; }
function fmt(v) {
  if (v === null || v === undefined) return '';
  if (typeof v === 'number' && !Number.isInteger(v)) return v.toFixed(3);
  return String(v);
}

// -- header ---------------------------------------------------------------------------------------
$('title').textContent = META.title;
$('meta-line').textContent = META.source + ' (' + META.format + '): ' + N + ' of ' + META.total + ' record(s) shown' +
  (META.unreadable ? ' (' + META.unreadable + ' unreadable)' : '') +
  (META.tokenizer ? '; token text from ' + META.tokenizer : '; no --tokenizer: tokens shown as IDs') +
  (META.verdict ? '; template verdict (tool loop): ' + META.verdict : '');
if (META.note) { $('note').textContent = META.note; $('note').hidden = false; }
if (S.problems.length) {
  var box = $('problems');
  box.appendChild(el('strong', null, S.problem_count + ' problem(s) in the file (the rest is shown):'));
  var ul = el('ul');
  S.problems.forEach(function (p) {
    ul.appendChild(el('li', 'problem', p.where + (p.field ? ': field ' + p.field : '') + ': ' + p.message));
  });
  if (S.problem_count > S.problems.length) ul.appendChild(el('li', null, '... and ' + (S.problem_count - S.problems.length) + ' more'));
  box.appendChild(ul);
  box.hidden = false;
}

// -- histograms -----------------------------------------------------------------------------------
function histogram(title, values, bins, id) {
  // biome-ignore lint/suspicious/noGlobalIsFinite: the columns may hold numeric strings, which count as numbers here
  var xs = values.filter(function (v) { return v !== null && v !== undefined && isFinite(v); });
  if (!xs.length) return;
  var lo = Infinity, hi = -Infinity;
  xs.forEach(function (v) { if (v < lo) lo = v; if (v > hi) hi = v; });
  var counts = new Array(bins).fill(0), w = (hi - lo) / bins || 1;
  xs.forEach(function (v) { counts[Math.min(bins - 1, Math.floor((v - lo) / w))]++; });
  bars(title, counts, function (k) { return fmt(lo + k * w) + ' .. ' + fmt(lo + (k + 1) * w); }, fmt(lo), fmt(hi), id);
}
function bars(title, counts, label, left, right, id) {
  var NS = 'http://www.w3.org/2000/svg', W = 260, H = 70;
  var box = el('div', 'hist'); box.id = id;
  box.appendChild(el('h3', null, title));
  var svg = document.createElementNS(NS, 'svg');
  svg.setAttribute('width', W); svg.setAttribute('height', H + 14);
  var max = Math.max.apply(null, counts) || 1, bw = W / counts.length;
  counts.forEach(function (c, k) {
    var r = document.createElementNS(NS, 'rect'), h = Math.round(H * c / max);
    r.setAttribute('x', k * bw + 0.5); r.setAttribute('width', Math.max(1, bw - 1));
    r.setAttribute('y', H - h); r.setAttribute('height', h);
    var t = document.createElementNS(NS, 'title'); t.textContent = label(k) + ': ' + c;
    r.appendChild(t); svg.appendChild(r);
  });
  [[left, 0, 'start'], [right, W, 'end']].forEach(function (a) {
    var t = document.createElementNS(NS, 'text');
    t.setAttribute('x', a[1]); t.setAttribute('y', H + 11); t.setAttribute('text-anchor', a[2]);
    t.textContent = a[0]; svg.appendChild(t);
  });
  box.appendChild(svg);
  $('hists').appendChild(box);
}
histogram('rewards', C.reward, 20, 'hist-reward');
histogram('lengths (tokens)', C.length, 20, 'hist-length');
var vt = S.version_tokens, vkeys = Object.keys(vt).map(Number).sort(function (a, b) { return a - b; });
if (vkeys.length) bars('sampled tokens by policy version', vkeys.map(function (k) { return vt[k]; }),
  function (k) { return 'version ' + vkeys[k]; }, 'v' + vkeys[0], 'v' + vkeys[vkeys.length - 1], 'hist-version');

// -- table: filter, sort, virtual rows --------------------------------------------------------------
var head = $('thead'), sortKey = null, sortDesc = false, order = new Int32Array(0);
COLS.forEach(function (c) {
  var h = el('div', null, c[1]); h.dataset.key = c[0];
  h.addEventListener('click', function () {
    sortDesc = sortKey === c[0] ? !sortDesc : false; sortKey = c[0];
    Array.prototype.forEach.call(head.children, function (x) { x.className = ''; });
    h.className = 'sorted' + (sortDesc ? ' desc' : '');
    apply();
  });
  head.appendChild(h);
});
function options(select, values) {
  values.forEach(function (v) { var o = el('option', null, v[1]); o.value = v[0]; select.appendChild(o); });
}
var statuses = Array.from(new Set(C.status)).filter(Boolean).sort();
options($('f-status'), [['', 'any status']].concat(statuses.map(function (s) { return [s, s]; })));
var causes = Array.from(new Set(C.cause)).filter(Boolean).sort();
options($('f-drift'), [['', 'any drift'], ['yes', 'drifted'], ['no', 'did not drift'], ['unmeasured', 'not measured']]
  .concat(causes.map(function (c) { return ['cause:' + c, 'cause: ' + c]; })));
function num(id) { var v = $(id).value; return v === '' ? null : Number(v); }
function apply() {
  var st = $('f-status').value, dr = $('f-drift').value, q = $('f-text').value.toLowerCase();
  var rmin = num('f-rmin'), rmax = num('f-rmax'), smin = num('f-smin'), lmin = num('f-lmin'), lmax = num('f-lmax');
  var prob = $('f-prob').checked, out = [];
  for (var i = 0; i < N; i++) {
    if (st && C.status[i] !== st) continue;
    if (dr === 'yes' && C.drift[i] !== true) continue;
    if (dr === 'no' && C.drift[i] !== false) continue;
    if (dr === 'unmeasured' && C.drift[i] !== null) continue;
    if (dr.indexOf('cause:') === 0 && C.cause[i] !== dr.slice(6)) continue;
    if (rmin !== null && !(C.reward[i] !== null && C.reward[i] >= rmin)) continue;
    if (rmax !== null && !(C.reward[i] !== null && C.reward[i] <= rmax)) continue;
    if (smin !== null && !(C.staleness[i] !== null && C.staleness[i] >= smin)) continue;
    if (lmin !== null && !(C.length[i] >= lmin)) continue;
    if (lmax !== null && !(C.length[i] <= lmax)) continue;
    if (prob && !C.problems[i]) continue;
    if (q && (C.status[i] + ' ' + C.end[i] + ' ' + C.cause[i]).toLowerCase().indexOf(q) < 0) continue;
    out.push(i);
  }
  if (sortKey) {
    var k = sortKey, d = sortDesc ? -1 : 1;
    out.sort(function (a, b) {
      var x = col(k, a), y = col(k, b);
      if (x === y) return a - b;
      if (x === null || x === undefined || x === '') return 1;
      if (y === null || y === undefined || y === '') return -1;
      return (typeof x === 'number' && typeof y === 'number' ? x - y : String(x).localeCompare(String(y))) * d;
    });
  }
  order = Int32Array.from(out);
  $('count').textContent = order.length + ' of ' + N + ' samples';
  $('spacer').style.height = (order.length * ROWH) + 'px';
  drawn = {}; $('spacer').textContent = '';
  draw();
}
var drawn = {}, pending = false;
function draw() {
  pending = false;
  var box = $('rows'), first = Math.max(0, Math.floor(box.scrollTop / ROWH) - 5);
  var last = Math.min(order.length, Math.ceil((box.scrollTop + box.clientHeight) / ROWH) + 5), keep = {};
  for (var k = first; k < last; k++) {
    keep[k] = drawn[k] || rowEl(k);
    if (!drawn[k]) $('spacer').appendChild(keep[k]);
  }
  Object.keys(drawn).forEach(function (k) { if (!keep[k]) drawn[k].remove(); });
  drawn = keep;
}
function rowEl(k) {
  var i = order[k], r = el('div', 'row grid');
  r.style.top = (k * ROWH) + 'px'; r.dataset.row = i;
  COLS.forEach(function (c) {
    var v = col(c[0], i), cell;
    if (c[0] === 'cause') {
      cell = el('div');
      if (C.drift[i] && C.drift_at[i] !== null) {
        var j = el('span', 'jump', (C.cause[i] || 'drift') + ' @' + C.drift_at[i]);
        j.dataset.jump = C.drift_at[i]; cell.appendChild(j);
      } else cell.textContent = C.drift[i] === null ? '' : (C.drift[i] ? 'drifted' : 'no');
    } else {
      cell = el('div', c[0] === 'problems' && v ? 'bad' : null, c[0] === 'problems' && !v ? '' : fmt(v));
    }
    r.appendChild(cell);
  });
  return r;
}
$('rows').addEventListener('scroll', function () { if (!pending) { pending = true; requestAnimationFrame(draw); } });
$('rows').addEventListener('click', function (ev) {
  var r = ev.target.closest('.row'); if (!r) return;
  var t = ev.target.closest('.jump');
  location.hash = 'sample=' + r.dataset.row + (t ? '&token=' + t.dataset.jump : '');
});
['f-status', 'f-drift', 'f-prob'].forEach(function (id) { $(id).addEventListener('change', apply); });
['f-text', 'f-rmin', 'f-rmax', 'f-smin', 'f-lmin', 'f-lmax'].forEach(function (id) { $(id).addEventListener('input', apply); });

// -- one sample ---------------------------------------------------------------------------------------
function dec(b64, Type) {
  if (!b64) return null;
  var bin = atob(b64), u8 = new Uint8Array(bin.length);
  for (var i = 0; i < bin.length; i++) u8[i] = bin.charCodeAt(i);
  return new Type(u8.buffer);
}
function detail(row) {
  var node = $('s' + row);
  if (!node) return null;
  try { return JSON.parse(node.textContent); } catch (e) { return {error: String(e)}; }
}
function tokText(id) {
  var t = VOCAB[id];
  return t === undefined ? '\u27e8' + id + '\u27e9' : t;
}
function shown(text) { return text.replace(/\n/g, '\u21b5\n').replace(/\t/g, '\u2192\t'); }
var cur = null, colour = 'origin', CUR_ROW = null;
function callsOf(m) {
  var calls = (m && m.tool_calls) || [];
  return calls.map(function (c) {
    var f = c['function'] || c, a = f.arguments;
    return (f.name || '?') + '(' + (typeof a === 'string' ? a : JSON.stringify(a)) + ')';
  });
}
function preview(messages, start) {
  var parts = [];
  for (var k = start; messages && k < messages.length && messages[k].role === 'tool'; k++) {
    var c = messages[k].content;
    c = typeof c === 'string' ? c : JSON.stringify(c);
    parts.push((messages[k].name ? messages[k].name + ': ' : '') + c.slice(0, 80));
  }
  return parts.join(' | ');
}
// Token arrays of what is drawn: ids, origin (0 prompt, 1 sampled, 2 appended, 3 branch, 4 untrained), loss, lp, ver.
var ORIGIN = ['prompt', 'sampled', 'appended', 'branch context', 'sampled, not trained'];
var OCLS = ['o-prompt', 'o-sampled', 'o-appended', 'o-branch', 'o-untrained'];
function tokensOfSample(d) {
  var ids = dec(d.ids, Int32Array), np = d.np, n = ids.length - np;
  var mask = dec(d.mask, Uint8Array), loss = dec(d.loss, Uint8Array) || mask;
  var lp = dec(d.lp, Float32Array), ver = dec(d.ver, Int32Array);
  var origin = new Uint8Array(ids.length), L = new Int8Array(ids.length).fill(-1);
  var LP = new Float32Array(ids.length).fill(NaN), V = new Int32Array(ids.length).fill(-1);
  for (var t = 0; t < n; t++) {
    origin[np + t] = mask ? (mask[t] ? 1 : 2) : 2;
    if (loss) L[np + t] = loss[t];
    if (lp && mask && mask[t]) LP[np + t] = lp[t];
    if (ver) V[np + t] = ver[t];
  }
  for (t = 0; t < np; t++) L[t] = 0;
  return {ids: ids, origin: origin, loss: L, lp: LP, ver: V};
}
function tokensOfSequence(s) {
  var ids = dec(s.ids, Int32Array), mask = dec(s.mask, Uint8Array), sampled = dec(s.sampled, Uint8Array);
  var lp = dec(s.lp, Float32Array), ver = dec(s.ver, Int32Array), n = ids.length;
  var origin = new Uint8Array(n), L = new Int8Array(n), LP = new Float32Array(n).fill(NaN);
  var ctx = (s.branch.kind !== 'first' && s.branch.token !== null) ? s.branch.token : 0, seen = false;
  for (var t = 0; t < n; t++) {
    if (mask[t]) { origin[t] = 1; seen = true; LP[t] = lp[t]; }
    else if (sampled[t]) { origin[t] = 4; seen = true; }
    else origin[t] = t < ctx ? 3 : (seen ? 2 : 0);
    L[t] = mask[t];
  }
  return {ids: ids, origin: origin, loss: L, lp: LP, ver: ver};
}
function tokEl(T, p) {
  var s = el('span', 'tok ' + OCLS[T.origin[p]] + (T.loss[p] === 1 ? ' loss' : (T.origin[p] === 1 ? ' noloss' : '')), shown(tokText(T.ids[p])));
  s.dataset.p = p;
  return s;
}
function drawTokens(box, T, d, drift) {
  box.textContent = '';
  var n = T.ids.length, np = d ? d.np : 0, spans = d ? d.spans : [], messages = d ? d.messages : null;
  function run(parent, a, b) {
    var frag = document.createDocumentFragment();
    for (var p = a; p < b; p++) {
      if (drift !== null && p === drift.position) {
        var m = el('span', 'drift-marker', '\u2691 drift: ' + drift.cause); m.id = 'drift-marker'; frag.appendChild(m);
      }
      var t = tokEl(T, p);
      if (drift !== null && p === drift.position) t.classList.add('drift');
      frag.appendChild(t);
    }
    parent.appendChild(frag);
  }
  if (np) {
    var pd = el('details', 'block'); pd.open = np <= PROMPT_OPEN || (drift !== null && drift.position < np);
    pd.appendChild(el('summary', null, 'prompt \u00b7 ' + np + ' tokens' + (pd.open ? '' : ' (folded: click to open)')));
    run(pd, 0, np); box.appendChild(pd);
  }
  var at = np;
  (spans || []).forEach(function (s) {
    var a = np + s[3], b = np + s[4];
    if (a > at) run(box, at, a);
    var m = messages && s[2] !== null ? messages[s[2]] : null;
    if (s[0] === 'suffix') {
      var f = el('details', 'fold');
      var text = preview(messages, s[2] === null ? -1 : s[2]);
      f.appendChild(el('summary', null, (text ? 'tool result \u25b8 ' + text : 'appended') + ' \u00b7 ' + (b - a) + ' tokens'));
      run(f, a, b); box.appendChild(f);
    } else {
      callsOf(m).forEach(function (c) { box.appendChild(el('span', 'call', '\u2699 ' + c)); });
      run(box, a, b);
    }
    at = b;
  });
  if (at < n) run(box, at, n);
  paint(box, T);
}
function heat(lp) { var p = Math.exp(lp); return 'hsl(' + Math.round(120 * p) + ', 85%, ' + Math.round(72 + 10 * p) + '%)'; }
var PALETTE = ['#bfe0ff', '#ffd1dc', '#c9f2c7', '#ffe7a8', '#dcd0ff', '#bff3ef', '#ffcfae', '#e5e5a8'];
function paint(box, T) {
  var toks = box.getElementsByClassName('tok');
  for (var k = 0; k < toks.length; k++) {
    var e = toks[k], p = +e.dataset.p, bg = '';
    if (colour === 'logprob' && !Number.isNaN(T.lp[p])) bg = heat(T.lp[p]);
    if (colour === 'version' && T.ver && T.ver[p] >= 0) bg = PALETTE[T.ver[p] % PALETTE.length];
    e.style.backgroundColor = bg;
  }
}
function sampleHead(d, row) {
  var h = $('s-head'); h.textContent = '';
  var i = row;
  h.appendChild(el('div', null, 'row ' + row + ' \u00b7 index ' + fmt(C.index[i]) + ' \u00b7 sample ' + fmt(C.sample[i]) +
    ' \u00b7 ' + C.status[i] + (C.end[i] ? ' (' + C.end[i] + ')' : '') + ' \u00b7 turns ' + fmt(C.turns[i]) +
    ' \u00b7 tool calls ' + fmt(C.tool_calls[i]) + ' \u00b7 reward ' + (C.reward[i] === null ? '-' : fmt(C.reward[i])) +
    ' \u00b7 policy version ' + fmt(C.version[i]) + ' \u00b7 staleness ' + fmt(C.staleness[i]) +
    (d.info && d.info.stale_action ? ' (' + d.info.stale_action + ')' : '') +
    ' \u00b7 ' + C.length[i] + ' tokens (' + fmt(C.sampled[i]) + ' sampled)'));
  var extra = Object.keys(d.info || {}).filter(function (k) { return k !== 'stale_action'; })
    .map(function (k) { return k + ' ' + JSON.stringify(d.info[k]); }).join(' \u00b7 ');
  if (extra) h.appendChild(el('div', 'muted', extra));
  h.appendChild(el('div', 'where', d.where));
  var pb = $('s-problems'); pb.textContent = '';
  (d.problems || []).forEach(function (p) { pb.appendChild(el('li', 'problem', p.where + (p.field ? ': field ' + p.field : '') + ': ' + p.message)); });
  pb.hidden = !(d.problems && d.problems.length);
}
function driftPanel(d, T) {
  var box = $('s-drift'); box.textContent = '';
  var dr = d.drift;
  if (!dr) { box.hidden = true; return; }
  box.hidden = false;
  var top = el('div');
  top.appendChild(el('strong', null, 'First drift at token ' + dr.position + ': ' + dr.cause + ' '));
  var go = el('span', 'jump', 'go to the token'); go.id = 'go-drift';
  go.addEventListener('click', function () { focusToken(dr.position); });
  top.appendChild(go); box.appendChild(top);
  var tbl = el('table'), hr = el('tr');
  ['', 'IDs from token ' + dr.position, 'text'].forEach(function (x) { hr.appendChild(el('th', null, x)); });
  tbl.appendChild(hr);
  var kept = Array.prototype.slice.call(T.ids, dr.position, dr.position + 16);
  var r1 = el('tr'); r1.id = 'drift-kept';
  r1.appendChild(el('th', null, 'kept (sampled / appended)'));
  r1.appendChild(el('td', null, kept.join(' ')));
  r1.appendChild(el('td', null, JSON.stringify(dr.ours)));
  var r2 = el('tr'); r2.id = 'drift-rendered';
  r2.appendChild(el('th', null, 're-rendered'));
  r2.appendChild(el('td', null, dr.rendered_ids ? (dr.rendered_ids.length ? dr.rendered_ids.join(' ') : '(the re-render ends before this token)') :
    '(tmpl view --tokenizer re-renders the IDs)'));
  r2.appendChild(el('td', null, JSON.stringify(dr.rendered)));
  tbl.appendChild(r1); tbl.appendChild(r2); box.appendChild(tbl);
}
function episodePanel(d) {
  var box = $('s-episode'); box.textContent = '';
  var ep = d.episode;
  if (!ep) { box.hidden = true; return; }
  box.hidden = false;
  box.appendChild(el('strong', null, 'Episode: ' + ep.calls.length + ' call(s), ' + ep.sequences.length + ' training sequence(s)'));
  var kids = {}, ids = {};
  ep.calls.forEach(function (c) { ids[c.id] = true; });
  ep.calls.forEach(function (c) { var p = c.parent && ids[c.parent] ? c.parent : ''; if (!kids[p]) kids[p] = []; kids[p].push(c); });
  function tree(p) {
    var ul = el('ul');
    (kids[p] || []).forEach(function (c) {
      var li = el('li', 'call-node', 'call ' + c.id + (c.agent ? ' \u00b7 agent ' + c.agent : '') + (c.turn !== null ? ' \u00b7 turn ' + c.turn : '') +
        ' \u00b7 prompt ' + c.prompt + ' \u00b7 sampled ' + c.sampled + (c.trained ? '' : ' (not trained)'));
      if (c.id !== null && kids[c.id]) li.appendChild(tree(c.id));
      ul.appendChild(li);
    });
    return ul;
  }
  box.appendChild(tree(''));
  var list = el('div');
  ep.sequences.forEach(function (s, k) {
    var row = el('div', 'seq');
    row.dataset.seq = k;
    row.appendChild(el('span', null, 'sequence ' + k + ': ' + s.branch.text + ' \u00b7 calls ' + s.calls.join(', ') + ' \u00b7 ' + s.status));
    var mask = dec(s.mask, Uint8Array), sampled = dec(s.sampled, Uint8Array), n = mask.length;
    var cv = document.createElement('canvas'), W = 300;
    cv.width = W; cv.height = 10; cv.title = 'loss mask of sequence ' + k + ' (' + n + ' tokens)';
    var g = cv.getContext('2d'), ctx = s.branch.kind !== 'first' && s.branch.token !== null ? s.branch.token : 0;
    for (var x = 0; x < W && n; x++) {
      var t = Math.floor(x * n / W);
      g.fillStyle = mask[t] ? '#2f6fb7' : (sampled[t] ? '#7cc47c' : (t < ctx ? '#b79ae0' : '#d8d8d8'));
      g.fillRect(x, 0, 1, 10);
    }
    row.appendChild(cv);
    row.addEventListener('click', function () { showSequence(k); });
    list.appendChild(row);
  });
  box.appendChild(list);
  if (!d.episode_only) {
    var back = el('div', 'seq on', 'the sample as exported (its trajectory)'); back.dataset.seq = '';
    back.addEventListener('click', function () { showSequence(null); });
    list.insertBefore(back, list.firstChild);
  }
}
function showSequence(k) {
  var d = cur.d;
  Array.prototype.forEach.call(document.querySelectorAll('.seq'), function (e) { e.classList.toggle('on', e.dataset.seq === (k === null ? '' : String(k))); });
  if (k === null) { cur.T = tokensOfSample(d); drawTokens($('s-tokens'), cur.T, d, d.drift); }
  else { cur.T = tokensOfSequence(d.episode.sequences[k]); drawTokens($('s-tokens'), cur.T, null, null); }
}
function focusToken(p) {
  var t = document.querySelector('#s-tokens .tok[data-p="' + p + '"]');
  if (!t) return;
  for (var e = t.parentElement; e; e = e.parentElement) if (e.tagName === 'DETAILS') e.open = true;
  var old = document.querySelector('.tok.focus'); if (old) old.classList.remove('focus');
  t.classList.add('focus');
  t.scrollIntoView({block: 'center'});
}
function openSample(row, token) {
  var d = detail(row);
  show('sample');
  if (!d || d.error) {
    $('s-head').textContent = 'sample ' + row + ' is not in this page' + (d ? ': ' + d.error : '');
    $('s-tokens').textContent = ''; return;
  }
  CUR_ROW = row;
  cur = {d: d, T: null};
  sampleHead(d, row);
  if (d.episode_only) { episodePanel(d); $('s-drift').hidden = true; showSequence(d.episode ? d.episode.sequences.length - 1 : null); }
  else { cur.T = tokensOfSample(d); driftPanel(d, cur.T); episodePanel(d); drawTokens($('s-tokens'), cur.T, d, d.drift); }
  if (token !== null && token !== undefined) focusToken(token); else window.scrollTo(0, 0);
}
$('s-colour').addEventListener('change', function () { colour = this.value; if (cur) paint($('s-tokens'), cur.T); });
$('s-tokens').addEventListener('mouseover', function (ev) {
  var t = ev.target.closest('.tok'); if (!t || !cur) return;
  var p = +t.dataset.p, T = cur.T, tip = $('tip');
  var lines = ['token ' + p + ' \u00b7 id ' + T.ids[p], 'text ' + JSON.stringify(tokText(T.ids[p])), ORIGIN[T.origin[p]] +
    (T.loss[p] === 1 ? ' \u00b7 in the loss' : ' \u00b7 not in the loss')];
  if (!Number.isNaN(T.lp[p])) lines.push('logprob ' + T.lp[p].toFixed(4) + ' (p ' + Math.exp(T.lp[p]).toFixed(3) + ')');
  if (T.ver && T.ver[p] >= 0) lines.push('policy version ' + T.ver[p]);
  tip.textContent = lines.join('\n'); tip.hidden = false;
  var r = t.getBoundingClientRect();
  tip.style.left = Math.min(r.left, window.innerWidth - 320) + 'px'; tip.style.top = (r.bottom + 6) + 'px';
});
$('s-tokens').addEventListener('mouseout', function () { $('tip').hidden = true; });
$('s-prev').addEventListener('click', function () { if (CUR_ROW > 0) location.hash = 'sample=' + (CUR_ROW - 1); });
$('s-next').addEventListener('click', function () { if (CUR_ROW < N - 1) location.hash = 'sample=' + (CUR_ROW + 1); });

// -- tabs and routes ------------------------------------------------------------------------------------
function show(which) {
  $('view-table').hidden = which !== 'table'; $('view-sample').hidden = which !== 'sample';
  $('tab-table').classList.toggle('on', which === 'table'); $('tab-sample').classList.toggle('on', which === 'sample');
  if (which === 'table') draw();
}
$('tab-table').addEventListener('click', function () { location.hash = 'table'; });
$('tab-sample').addEventListener('click', function () { location.hash = 'sample=' + (CUR_ROW === null ? (order.length ? order[0] : 0) : CUR_ROW); });
function route() {
  var h = location.hash.slice(1), m = /^sample=(\d+)(?:&token=(\d+))?$/.exec(h);
  if (m) openSample(+m[1], m[2] === undefined ? null : +m[2]); else show('table');
}
window.addEventListener('hashchange', route);
apply();
route();
window.tmplColumns = C;
window.tmplReadyMs = performance.now();
document.body.dataset.ready = '1';
})();
