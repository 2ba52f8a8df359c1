// lockd's console: what is held now, under a prefix, and one lock,
// semaphore or run in detail, followed live. Plain JavaScript (an ES
// module), no framework and no build step: lockd serves this file as it is
// (src/http/pages/console.rs). docs/console.md describes the page.
//
// Rules this file keeps:
// - Everything is asked of lockd's API, by relative URLs (`locks?...`), so
//   a proxy's path prefix is kept.
// - The API key lives in sessionStorage and goes in an Authorization
//   header, never in a URL (nor in the fragment, nor in a log).
// - Text from the server is set with textContent, never as HTML.
// - No inline style: the page's Content-Security-Policy refuses it; classes
//   and the `hidden` attribute do the work.

const KEY_STORE = 'lockd.console.apiKey';
const TICK_MS = 250;
const REFRESH_MS = 5000;
const PAGE_LIMIT = 100;
const MAX_PAGE_LIMIT = 1000;
const MAX_EVENTS = 200;
const INSPECT_CONCURRENCY = 4;

/** The three kinds of lease the console shows, and their routes. */
const KINDS = {
  locks: { title: 'Lock', list: 'locks', field: 'locks', name: 'name', empty: 'No lock is held' },
  semaphores: { title: 'Semaphore', list: 'semaphores', field: 'semaphores', name: 'name', empty: 'No semaphore has a permit held' },
  runs: { title: 'Run', list: 'runs', field: 'runs', name: 'key', empty: 'No run' },
};

const $ = (id) => document.getElementById(id);

// ---------------------------------------------------------------- DOM

/** An element: `props` are attributes (`class`, `text`, `on*` listeners,
 * `dataset`), `children` nodes or text. Never HTML. */
function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k === 'text') el.textContent = String(v);
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

/** A table with a header row; below 640 px wide the stylesheet shows each
 * row as a card, each cell under its column's label (`data-label`). The
 * ARIA roles keep it a table for screen readers either way. */
function table(caption, columns, rows) {
  return h('table', { class: 'cards', role: 'table' },
    h('caption', { class: 'sr-only', text: caption }),
    h('thead', { role: 'rowgroup' },
      h('tr', { role: 'row' }, columns.map((c) => h('th', { scope: 'col', role: 'columnheader', text: c.label })))),
    h('tbody', { role: 'rowgroup' },
      rows.map((row) => h('tr', { role: 'row', dataset: row.dataset || {} },
        columns.map((c) => h('td', { role: 'cell', 'data-label': c.label, class: c.class }, c.cell(row)))))));
}

function setStatus(id, text, kind = '') {
  const el = $(id);
  el.textContent = text;
  el.classList.toggle('error', kind === 'error');
}

/** Says `text` to screen readers, politely (a change, not a tick). */
function announce(text) {
  const el = $('announce');
  el.textContent = '';
  setTimeout(() => { el.textContent = text; }, 50);
}

// ---------------------------------------------------------------- formats

function formatLeft(ms) {
  if (ms <= 0) return 'lapsed';
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)} s`;
  const s = Math.floor(ms / 1000);
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${String(s % 60).padStart(2, '0')} s`;
  return `${Math.floor(m / 60)} h ${String(m % 60).padStart(2, '0')} min`;
}

/** What a screen reader is told of a lease: coarse, so that it changes
 * a few times, not four times a second. */
function coarseLeft(ms) {
  if (ms <= 0) return 'The lease has lapsed.';
  if (ms < 10_000) return 'Under 10 seconds of lease left.';
  if (ms < 60_000) return `About ${Math.ceil(ms / 10_000) * 10} seconds of lease left.`;
  const m = Math.ceil(ms / 60_000);
  return `About ${m} minute${m === 1 ? '' : 's'} of lease left.`;
}

function formatDuration(ms) {
  if (typeof ms !== 'number') return '—';
  if (ms < 1000) return `${ms} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)} s`;
  return formatLeft(ms);
}

function time(iso) {
  if (!iso) return '—';
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return String(iso);
  const sameDay = d.toDateString() === new Date().toDateString();
  const text = sameDay ? d.toLocaleTimeString() : d.toLocaleString();
  return h('time', { datetime: iso, title: iso, text });
}

function owner(value) {
  return value === null || value === undefined || value === '' ? h('span', { class: 'muted', text: '(no owner)' }) : String(value);
}

function meta(value) {
  if (value === null || value === undefined) return h('span', { class: 'muted', text: '—' });
  return h('code', { class: 'meta', text: JSON.stringify(value) });
}

/** A lease's time left, counting down live ([tick]); `deadline` is on
 * performance.now()'s clock: the answer's ttl_ms from when it arrived, so
 * that a browser whose clock is off still counts right. */
function lease(deadline) {
  if (typeof deadline !== 'number') return h('span', { class: 'muted', text: '—' });
  const left = deadline - performance.now();
  return h('span', { class: 'lease', dataset: { deadline: String(deadline) }, text: formatLeft(left) });
}

/** The deadline of a lease `item` (ttl_ms, else expires_at) that arrived
 * at `received` (performance.now()). */
function deadlineOf(item, received) {
  if (typeof item?.ttl_ms === 'number') return received + item.ttl_ms;
  if (item?.expires_at) {
    const at = Date.parse(item.expires_at);
    if (!Number.isNaN(at)) return received + (at - Date.now());
  }
  return undefined;
}

function tick() {
  const now = performance.now();
  for (const el of document.querySelectorAll('.lease[data-deadline]')) {
    const left = Number(el.dataset.deadline) - now;
    const text = formatLeft(left);
    if (el.textContent !== text) el.textContent = text;
    el.classList.toggle('lapsed', left <= 0);
  }
  for (const el of document.querySelectorAll('.lease-coarse[data-deadline]')) {
    const text = coarseLeft(Number(el.dataset.deadline) - now);
    if (el.textContent !== text) el.textContent = text;
  }
}

// ---------------------------------------------------------------- API

const keys = {
  get() {
    try { return sessionStorage.getItem(KEY_STORE) || ''; } catch { return ''; }
  },
  set(key) {
    try { sessionStorage.setItem(KEY_STORE, key); } catch { /* storage off: this page only */ }
    memoryKey = key;
  },
  forget() {
    try { sessionStorage.removeItem(KEY_STORE); } catch { /* nothing kept */ }
    memoryKey = '';
  },
};
let memoryKey = '';
const currentKey = () => keys.get() || memoryKey;

/** A refusal of lockd (an RFC 9457 problem document) or no answer
 * (status 0). */
class Problem extends Error {
  constructor(status, body) {
    super((body && (body.detail || body.title)) || `lockd answered ${status}`);
    this.status = status;
    this.type = (body && body.type) || '';
  }
}

function headers(extra = {}) {
  const key = currentKey();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

/** `path` (relative: `locks?prefix=a`) resolved against the page. */
const url = (path) => new URL(path, document.baseURI);

/** One request to the API: its JSON, or a Problem. A 401 asks for a key. */
async function api(path, { method = 'GET', signal } = {}) {
  let response;
  try {
    response = await fetch(url(path), { method, headers: headers({ Accept: 'application/json' }), cache: 'no-store', signal });
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new Problem(0, { detail: 'lockd did not answer (is it running, and reachable from this browser?)' });
  }
  const text = await response.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch { body = null; }
  if (response.status === 401) askForKey(body && body.detail);
  if (!response.ok) throw new Problem(response.status, body);
  return body;
}

function problemText(p) {
  if (p.status === 0) return p.message;
  if (p.status === 401) return 'This lockd needs an API key: give one above.';
  return `lockd answered ${p.status}: ${p.message}`;
}

const enc = encodeURIComponent;
const itemPath = (kind, name) => `${KINDS[kind].list}/${enc(name)}`;

// ---------------------------------------------------------------- keys

/** Whether a break was refused (403) with the key in use: the break
 * buttons are then hidden until the key changes. */
let notAdmin = false;

function showKeyState() {
  const key = currentKey();
  $('key-label').textContent = key ? 'Using an API key' : 'No API key given';
  $('forget-key').hidden = !key;
}

function askForKey(reason) {
  const panel = $('key-panel');
  $('key-reason').textContent = reason
    ? `This lockd needs an API key. It says: ${reason}`
    : 'This lockd needs an API key.';
  if (panel.hidden) {
    panel.hidden = false;
    $('key-input').focus();
  }
}

function useKey(event) {
  event.preventDefault();
  const input = $('key-input');
  const key = input.value.trim();
  if (!key) return;
  keys.set(key);
  input.value = '';
  notAdmin = false;
  $('key-panel').hidden = true;
  showKeyState();
  announce('API key set.');
  route();
}

function forgetKey() {
  keys.forget();
  notAdmin = false;
  showKeyState();
  announce('API key forgotten.');
  route();
}

// ---------------------------------------------------------------- routes

/** The view the fragment names: `#/locks?prefix=a` (a list) or
 * `#/locks/NAME` (one lock). Never a key or a token. */
function parseHash() {
  const raw = location.hash.replace(/^#\/?/, '');
  const [path, query = ''] = raw.split('?');
  const parts = path.split('/').filter(Boolean);
  const kind = Object.hasOwn(KINDS, parts[0] || '') ? parts[0] : 'locks';
  let name = null;
  if (parts.length > 1) {
    try { name = decodeURIComponent(parts.slice(1).join('/')); } catch { name = parts.slice(1).join('/'); }
  }
  const prefix = new URLSearchParams(query).get('prefix') || '';
  return { kind, name, prefix };
}

const listHash = (kind, prefix) => `#/${kind}${prefix ? `?prefix=${enc(prefix)}` : ''}`;

/** The current view's requests and streams: aborted when it changes. */
let view = { abort: new AbortController() };
let lastList = { kind: 'locks', prefix: '' };

function leaveView() {
  view.abort.abort();
  view = { abort: new AbortController() };
  if (list) clearTimeout(list.timer);
  if (detail) {
    clearTimeout(detail.refreshTimer);
    clearTimeout(detail.historyTimer);
  }
  list = null;
  detail = null;
}

function route() {
  const was = $('detail-view').hidden ? 'list' : 'detail';
  leaveView();
  const where = parseHash();
  if (where.name) {
    showDetail(where, was === 'list');
  } else {
    showList(where, was === 'detail');
  }
}

// ---------------------------------------------------------------- the list

let list = null;

function showList({ kind, prefix }, focus) {
  lastList = { kind, prefix };
  $('detail-view').hidden = true;
  $('list-view').hidden = false;
  document.title = 'lockd console';
  for (const a of document.querySelectorAll('.kinds a')) {
    a.href = listHash(a.dataset.kind, prefix);
    if (a.dataset.kind === kind) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  $('home').href = listHash('locks', prefix);
  $('prefix-input').value = prefix;
  $('list-title').textContent = `${KINDS[kind].title}s held${prefix ? ` under “${prefix}”` : ''}`;
  list = { kind, prefix, items: [], cursor: null, timer: null };
  $('list').replaceChildren();
  $('more').hidden = true;
  setStatus('list-status', 'Loading…');
  if (focus) $('list-title').focus();
  loadList({ more: false });
}

/** Loads the list: the first page, or `more` the next one. A refresh
 * asks for as many as are shown, in one page (up to 1000). */
async function loadList({ more }) {
  const mine = list;
  const { signal } = view.abort;
  const k = KINDS[mine.kind];
  const query = new URLSearchParams();
  if (mine.prefix) query.set('prefix', mine.prefix);
  if (more && mine.cursor) {
    query.set('limit', String(PAGE_LIMIT));
    query.set('cursor', mine.cursor);
  } else {
    query.set('limit', String(Math.min(MAX_PAGE_LIMIT, Math.max(PAGE_LIMIT, mine.items.length))));
  }
  try {
    const body = await api(`${k.list}?${query}`, { signal });
    const received = performance.now();
    const items = (body && body[k.field]) || [];
    for (const item of items) {
      item.$deadline = deadlineOf(item, received);
      for (const permit of item.permits || []) permit.$deadline = deadlineOf(permit, received);
    }
    if (mine.kind === 'locks') await inspectShared(items, signal);
    if (mine !== list) return;
    mine.items = more ? mine.items.concat(items) : items;
    mine.cursor = (body && body.next_cursor) || null;
    renderList();
  } catch (p) {
    if (p.name === 'AbortError' || mine !== list) return;
    if (mine.kind === 'runs' && (p.status === 404 || p.status === 405)) {
      setStatus('list-status', 'Listing runs is not available on this server (it has no GET /runs). Open a run by its key: #/runs/KEY.', 'error');
    } else {
      setStatus('list-status', problemText(p), 'error');
    }
  } finally {
    // One refresh pending at a time, whatever asked for this load.
    if (mine === list && !signal.aborted) {
      clearTimeout(mine.timer);
      mine.timer = setTimeout(refreshList, REFRESH_MS);
    }
  }
}

/** The list again, every REFRESH_MS while the page is seen. */
function refreshList() {
  if (!list) return;
  if (document.hidden) {
    list.timer = setTimeout(refreshList, REFRESH_MS);
    return;
  }
  loadList({ more: false });
}

/** A shared lock's listing item names one holder of several: its holders
 * and whether a writer waits come from GET /locks/{name}. */
async function inspectShared(items, signal) {
  const shared = items.filter((i) => i.mode === 'shared');
  let next = 0;
  const worker = async () => {
    while (next < shared.length) {
      const item = shared[next++];
      try {
        const detail = await api(itemPath('locks', item.name), { signal });
        const received = performance.now();
        item.$holders = (detail.holders || []).map((holder) => ({ ...holder, $deadline: deadlineOf(holder, received) }));
        item.$writerWaiting = detail.writer_waiting;
      } catch (p) {
        if (p.name === 'AbortError') throw p;
      }
    }
  };
  await Promise.all(Array.from({ length: INSPECT_CONCURRENCY }, worker));
}

function nameLink(kind, name) {
  return h('a', { href: `#/${kind}/${enc(name)}`, dataset: { focusKey: `${kind}/${name}` }, class: 'name', text: name });
}

/** The holders of a lock, as a list (a shared lock's several). */
function holderList(holders) {
  return h('ul', { class: 'holders' }, holders.map((x) => h('li', {},
    owner(x.owner), ' ', meta(x.meta), ' ',
    h('span', { class: 'fence', text: `fence ${x.fence}` }), ' ',
    lease(x.$deadline))));
}

const LIST_COLUMNS = {
  locks: [
    { label: 'Name', cell: (l) => nameLink('locks', l.name) },
    { label: 'Mode', cell: (l) => l.mode },
    { label: 'Holders', cell: (l) => (l.$holders && l.$holders.length ? holderList(l.$holders) : h('span', {}, owner(l.owner), ' ', meta(l.meta))) },
    { label: 'Fence', class: 'num', cell: (l) => String(l.fence) },
    { label: 'Lease left', cell: (l) => lease(l.$deadline) },
    { label: 'Waiting', cell: (l) => waiting(l) },
  ],
  semaphores: [
    { label: 'Name', cell: (s) => nameLink('semaphores', s.name) },
    { label: 'Permits', cell: (s) => `${s.holders} of ${s.limit} held` },
    { label: 'Holders', cell: (s) => holderList(s.permits || []) },
  ],
  runs: [
    { label: 'Key', cell: (r) => nameLink('runs', r.key) },
    { label: 'State', cell: (r) => r.state },
    { label: 'Attempt', class: 'num', cell: (r) => (r.attempt ?? '—').toString() },
    { label: 'Owner', cell: (r) => owner(r.owner) },
    { label: 'Meta', cell: (r) => meta(r.meta) },
    { label: 'Fence', class: 'num', cell: (r) => (r.fence ?? '—').toString() },
    { label: 'Lease left', cell: (r) => (r.state === 'running' ? lease(r.$deadline) : h('span', { class: 'muted', text: '—' })) },
  ],
};

function waiting(l) {
  if (l.mode !== 'shared') return h('span', { class: 'muted', text: '—' });
  if (l.$writerWaiting === undefined) return h('span', { class: 'muted', text: '?' });
  return l.$writerWaiting ? 'a writer waits' : 'no writer waits';
}

function renderList() {
  const { kind, prefix, items, cursor } = list;
  const k = KINDS[kind];
  const focused = document.activeElement && document.activeElement.dataset && document.activeElement.dataset.focusKey;
  const target = $('list');
  if (items.length === 0) {
    target.replaceChildren(h('p', { class: 'empty', text: `${k.empty}${prefix ? ` under “${prefix}”` : ''}.` }));
  } else {
    target.replaceChildren(table(`${k.title}s held`, LIST_COLUMNS[kind],
      items.map((item) => ({ ...item, dataset: { name: item[k.name] } }))));
  }
  $('more').hidden = !cursor;
  const count = `${items.length} ${items.length === 1 ? k.title.toLowerCase() : `${k.title.toLowerCase()}s`}`;
  setStatus('list-status', `${count}${cursor ? ', more to load' : ''}; refreshed ${new Date().toLocaleTimeString()}.`);
  if (focused) {
    const again = target.querySelector(`[data-focus-key="${CSS.escape(focused)}"]`);
    if (again) again.focus();
  }
}

// ---------------------------------------------------------------- one item

let detail = null;

function showDetail({ kind, name }, focus) {
  const k = KINDS[kind];
  $('list-view').hidden = true;
  $('detail-view').hidden = false;
  $('back').href = listHash(kind, lastList.prefix);
  $('detail-title').textContent = `${k.title} ${name}`;
  document.title = `${name} · lockd console`;
  detail = { kind, name, events: 0, watching: false, refreshTimer: null, historyTimer: null };
  $('detail-state').replaceChildren();
  $('events').replaceChildren();
  $('history').replaceChildren();
  setStatus('detail-status', '');
  setStatus('history-status', 'Loading…');
  if (focus) $('detail-title').focus();
  loadState();
  loadHistory();
  watch();
}

/** Reads the item's state (`refresh`) or history again in `ms`, once
 * (debounced: a burst of events reads once). */
function soon(what, ms) {
  const mine = detail;
  if (!mine) return;
  const key = `${what}Timer`;
  clearTimeout(mine[key]);
  mine[key] = setTimeout(() => {
    if (mine === detail) (what === 'refresh' ? loadState : loadHistory)();
  }, ms);
}

async function loadState() {
  const mine = detail;
  const { signal } = view.abort;
  try {
    const body = await api(itemPath(mine.kind, mine.name), { signal });
    if (mine !== detail) return;
    renderState(body, performance.now());
  } catch (p) {
    if (p.name === 'AbortError' || mine !== detail) return;
    if (p.status === 404) renderState(null, performance.now());
    else $('detail-state').replaceChildren(h('p', { class: 'error', text: problemText(p) }));
  } finally {
    // Without a live watch, read it again now and then.
    if (mine === detail && !signal.aborted && !mine.watching) soon('refresh', REFRESH_MS);
  }
}

function breakButton(target) {
  if (notAdmin) return h('span', { class: 'muted', text: currentKey() ? 'no admin key' : 'breaks need an admin key' });
  const who = target.owner ? `${target.owner}` : 'the unnamed holder';
  return h('button', {
    type: 'button',
    class: 'danger',
    'aria-label': `Break the lease of ${who}, fence ${target.fence}`,
    onclick: () => confirmBreak(target),
  }, 'Break…');
}

function summary(rows) {
  return h('dl', { class: 'summary' }, rows.filter(Boolean).flatMap(([term, value]) => [h('dt', { text: term }), h('dd', {}, value)]));
}

/** The lease that ends last, for screen readers: a polite live region that
 * changes a few times over a lease, not on every tick. */
function leaseSummary(deadline) {
  if (typeof deadline !== 'number') return null;
  return h('p', { class: 'lease-summary', 'aria-live': 'polite' },
    'Lease left: ',
    h('span', { 'aria-hidden': 'true' }, lease(deadline)),
    h('span', { class: 'sr-only lease-coarse', dataset: { deadline: String(deadline) }, text: coarseLeft(deadline - performance.now()) }));
}

const HOLDER_COLUMNS = (kind, name) => [
  { label: 'Owner', cell: (x) => owner(x.owner) },
  { label: 'Meta', cell: (x) => meta(x.meta) },
  { label: 'Fence', class: 'num', cell: (x) => String(x.fence) },
  { label: 'Granted', cell: (x) => time(x.granted_at) },
  { label: 'Lease left', cell: (x) => lease(x.$deadline) },
  { label: 'Break', cell: (x) => breakButton({ kind, name, fence: x.fence, owner: x.owner, mode: x.mode }) },
];

function renderState(body, received) {
  const { kind, name } = detail;
  const out = [];
  if (kind === 'locks') {
    if (!body || !body.held) {
      out.push(h('p', { class: 'empty', text: 'Nobody holds this lock now.' }));
    } else {
      const shared = body.mode === 'shared';
      const holders = shared
        ? (body.holders || []).map((x) => ({ ...x, mode: 'shared', $deadline: deadlineOf(x, received) }))
        : [{ ...body, $deadline: deadlineOf(body, received) }];
      out.push(summary([
        ['Mode', body.mode],
        ['Fence', String(body.fence)],
        ['Holders', String(body.holder_count ?? holders.length)],
        shared && ['Writer waiting', body.writer_waiting ? 'yes: new readers wait behind it' : 'no'],
      ]));
      out.push(leaseSummary(deadlineOf(body, received)));
      out.push(table(`Holders of ${name}`, HOLDER_COLUMNS(kind, name), holders));
    }
  } else if (kind === 'semaphores') {
    if (!body || !(body.permits || []).length) {
      out.push(h('p', { class: 'empty', text: 'No permit of this semaphore is held now.' }));
    } else {
      const permits = body.permits.map((x) => ({ ...x, $deadline: deadlineOf(x, received) }));
      out.push(summary([['Permits', `${body.holders} of ${body.limit} held`]]));
      const last = Math.max(...permits.map((x) => x.$deadline ?? -Infinity));
      out.push(leaseSummary(Number.isFinite(last) ? last : undefined));
      out.push(table(`Permits of ${name}`, HOLDER_COLUMNS(kind, name), permits));
    }
  } else if (!body) {
    out.push(h('p', { class: 'empty', text: 'lockd knows no run with this key now.' }));
  } else {
    const running = body.state === 'running';
    out.push(summary([
      ['State', body.state],
      ['Attempt', body.attempt === undefined ? '—' : String(body.attempt)],
      ['Fence', body.fence === undefined ? '—' : String(body.fence)],
      running && ['Owner', owner(body.owner)],
      running && ['Meta', meta(body.meta)],
      running && ['Granted', time(body.granted_at)],
      body.completed_at && ['Completed', time(body.completed_at)],
      'result' in body && ['Result', meta(body.result)],
    ]));
    if (running) {
      const deadline = deadlineOf(body, received);
      out.push(leaseSummary(deadline));
      out.push(h('p', {}, breakButton({ kind, name, fence: body.fence, owner: body.owner })));
    }
  }
  $('detail-state').replaceChildren(...out.filter(Boolean));
}

// ---------------------------------------------------------------- history

const HISTORY_COLUMNS = (kind) => [
  { label: 'Fence', class: 'num', cell: (e) => String(e.fence) },
  kind === 'locks' && { label: 'Mode', cell: (e) => e.mode || '—' },
  { label: 'Owner', cell: (e) => owner(e.owner) },
  { label: 'Meta', cell: (e) => meta(e.meta) },
  { label: kind === 'runs' ? 'Started' : 'Granted', cell: (e) => time(e.granted_at) },
  { label: 'Held for', cell: (e) => formatDuration(e.held_ms) },
  { label: 'Ended', cell: (e) => (e.ended ? h('span', {}, h('span', { class: `ended ended-${e.ended}`, text: e.ended }), ' ', time(e.ended_at)) : h('span', { class: 'held', text: 'held now' })) },
  { label: 'Broken by', cell: (e) => (e.broken_by ? String(e.broken_by) : h('span', { class: 'muted', text: '—' })) },
].filter(Boolean);

async function loadHistory() {
  const mine = detail;
  const { signal } = view.abort;
  try {
    const body = await api(`${itemPath(mine.kind, mine.name)}/history`, { signal });
    if (mine !== detail) return;
    const entries = (body && body.entries) || [];
    const kept = body && body.history_length;
    setStatus('history-status', entries.length
      ? `The last ${entries.length} lease${entries.length === 1 ? '' : 's'}, newest first${kept ? ` (lockd keeps ${kept})` : ''}.`
      : 'No lease in the history yet.');
    $('history').replaceChildren(entries.length ? table(`History of ${mine.name}`, HISTORY_COLUMNS(mine.kind), entries) : '');
  } catch (p) {
    if (p.name === 'AbortError' || mine !== detail) return;
    // 404 or 405: no history route; an older lockd's path check refuses
    // the sub-resource with a 400 that says a name is one path segment. Any
    // other refusal (a bad name, a key without `read`) is shown as it is.
    const older = p.status === 400 && /one path segment/.test(p.message || '');
    if (p.status === 404 || p.status === 405 || older) {
      setStatus('history-status', 'This server keeps no history (it has no GET …/history).');
    } else {
      setStatus('history-status', problemText(p), 'error');
    }
  }
}

// ---------------------------------------------------------------- watch

/** A parser of a text/event-stream (the HTML standard's rules: `event`,
 * `data`, `id` fields, comments, an empty line ends an event), fed text
 * as it comes; calls `onEvent({event, data, id})`. */
function sseParser(onEvent) {
  let buffer = '';
  let event = '';
  let data = [];
  let lastId = '';
  return (chunk) => {
    buffer += chunk;
    for (;;) {
      const at = buffer.search(/\r\n|\r|\n/);
      if (at < 0) return;
      // A \r at the end may be the first half of \r\n: wait for more.
      if (buffer[at] === '\r' && at === buffer.length - 1) return;
      const line = buffer.slice(0, at);
      buffer = buffer.slice(at + (buffer[at] === '\r' && buffer[at + 1] === '\n' ? 2 : 1));
      if (line === '') {
        if (data.length) onEvent({ event: event || 'message', data: data.join('\n'), id: lastId });
        event = '';
        data = [];
      } else if (!line.startsWith(':')) {
        const colon = line.indexOf(':');
        const field = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? '' : line.slice(colon + 1);
        if (value.startsWith(' ')) value = value.slice(1);
        if (field === 'event') event = value;
        else if (field === 'data') data.push(value);
        else if (field === 'id' && !value.includes('\0')) lastId = value;
      }
    }
  };
}

const sleep = (ms, signal) => new Promise((resolve) => {
  const t = setTimeout(resolve, ms);
  signal.addEventListener('abort', () => { clearTimeout(t); resolve(); }, { once: true });
});

/** Follows the item's watch (GET …/events) with fetch, which can send the
 * Authorization header EventSource cannot: reconnects after a pause that
 * doubles from 0.5 s to 15 s (with jitter), sending Last-Event-ID. */
async function watch() {
  const mine = detail;
  const { signal } = view.abort;
  const path = `${itemPath(mine.kind, mine.name)}/events`;
  let pause = 500;
  let lastId = '';
  while (!signal.aborted && mine === detail) {
    setStatus('watch-status', 'Connecting…');
    let ended = 'The stream ended.';
    try {
      const extra = { Accept: 'text/event-stream' };
      if (lastId) extra['Last-Event-ID'] = lastId;
      const response = await fetch(url(path), { headers: headers(extra), cache: 'no-store', signal });
      if (!response.ok) {
        let body = null;
        try { body = await response.json(); } catch { body = null; }
        const p = new Problem(response.status, body);
        if (response.status === 401) {
          askForKey(p.message);
          setStatus('watch-status', 'Not watching: this lockd needs an API key.', 'error');
          return;
        }
        if (![429, 500, 502, 503, 504].includes(response.status)) {
          setStatus('watch-status', `Not watching: ${problemText(p)}`, 'error');
          mine.watching = false;
          soon('refresh', REFRESH_MS);
          return;
        }
        ended = problemText(p);
      } else {
        mine.watching = true;
        setStatus('watch-status', 'Live: following every change.');
        const parse = sseParser((ev) => {
          lastId = ev.id || lastId;
          pause = 500;
          onEvent(mine, ev);
        });
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          parse(value);
        }
      }
    } catch (e) {
      if (signal.aborted || e.name === 'AbortError') return;
      ended = 'The connection to lockd was lost.';
    }
    mine.watching = false;
    if (signal.aborted || mine !== detail) return;
    const wait = Math.round(pause * (0.5 + Math.random() / 2));
    setStatus('watch-status', `${ended} Connecting again in ${(wait / 1000).toFixed(1)} s…`);
    await sleep(wait, signal);
    pause = Math.min(pause * 2, 15_000);
  }
}

function describe(data) {
  if (!data || typeof data !== 'object') return '';
  const parts = [];
  if ('held' in data && !data.held) parts.push('free');
  if (data.state) parts.push(`state ${data.state}`);
  if (data.owner !== undefined && data.owner !== null) parts.push(`owner ${data.owner}`);
  if (data.fence !== undefined && data.fence !== 0) parts.push(`fence ${data.fence}`);
  if (data.mode) parts.push(data.mode);
  if (typeof data.holders === 'number') parts.push(`${data.holders} holder${data.holders === 1 ? '' : 's'} left`);
  if (data.limit !== undefined) parts.push(`limit ${data.limit}`);
  if (data.holder_count !== undefined) parts.push(`${data.holder_count} holder${data.holder_count === 1 ? '' : 's'}`);
  if (data.broken_by) parts.push(`broken by ${data.broken_by}`);
  return parts.join(', ');
}

function onEvent(mine, ev) {
  let data = null;
  try { data = JSON.parse(ev.data); } catch { data = ev.data; }
  const log = $('events');
  const item = h('li', { class: `event event-${ev.event}`, dataset: { event: ev.event } },
    time(new Date().toISOString()), ' ',
    h('strong', { text: ev.event }), ' ',
    h('span', { text: describe(data) }));
  log.prepend(item);
  while (log.children.length > MAX_EVENTS) log.lastElementChild.remove();
  mine.events += 1;
  if (ev.event !== 'state' || mine.events > 1) {
    announce(`${mine.name}: ${ev.event}${data && data.fence ? `, fence ${data.fence}` : ''}.`);
  }
  soon('refresh', 150);
  soon('history', 400);
}

// ---------------------------------------------------------------- break

let breaking = null;

function confirmBreak(target) {
  breaking = target;
  const what = `${KINDS[target.kind].title} “${target.name}”`;
  const who = target.owner ? `“${target.owner}”` : 'an unnamed holder';
  $('break-what').textContent = `${what}: the lease of ${who}, fence ${target.fence}${target.mode ? ` (${target.mode})` : ''}.`;
  $('break-title').textContent = `Break ${who}'s lease?`;
  const dialog = $('break-dialog');
  // showModal keeps the last returnValue, which Escape does not change.
  dialog.returnValue = '';
  dialog.showModal();
}

async function onBreakClosed() {
  const dialog = $('break-dialog');
  const target = breaking;
  breaking = null;
  if (!target || dialog.returnValue !== 'break') return;
  const query = new URLSearchParams({ force: 'true' });
  // The fence named in the dialog: a lease granted since (a newer holder)
  // is not broken by mistake.
  if (target.fence !== undefined && target.fence !== null) query.set('fence', String(target.fence));
  setStatus('detail-status', 'Breaking…');
  try {
    const body = await api(`${itemPath(target.kind, target.name)}?${query}`, { method: 'DELETE', signal: view.abort.signal });
    const broken = (body && body.broken) || [];
    const text = broken.length
      ? `Broke ${broken.map((b) => `fence ${b.fence} (${b.owner ?? 'no owner'})`).join(', ')}.`
      : 'Broken.';
    setStatus('detail-status', text);
    announce(text);
  } catch (p) {
    if (p.name === 'AbortError') return;
    if (p.status === 403 && !currentKey()) {
      // No key given: this lockd has none, and then breaks nothing (but in
      // --dev). Its answer says so.
      notAdmin = true;
      setStatus('detail-status', `Not broken: ${problemText(p)}`, 'error');
    } else if (p.status === 403) {
      notAdmin = true;
      setStatus('detail-status', `Your key has no admin permission: lockd refused to break the lease (${p.message}).`, 'error');
    } else {
      setStatus('detail-status', `Not broken: ${problemText(p)}`, 'error');
    }
  }
  if (detail) {
    loadState();
    loadHistory();
  }
}

// ---------------------------------------------------------------- start

function start() {
  memoryKey = keys.get();
  showKeyState();
  $('key-form').addEventListener('submit', useKey);
  $('forget-key').addEventListener('click', forgetKey);
  $('prefix-form').addEventListener('submit', (event) => {
    event.preventDefault();
    const prefix = $('prefix-input').value.trim();
    const wanted = listHash(parseHash().kind, prefix);
    if (location.hash === wanted) route();
    else location.hash = wanted;
  });
  $('refresh').addEventListener('click', () => {
    if (list && !$('list-view').hidden) loadList({ more: false });
  });
  $('more').addEventListener('click', () => loadList({ more: true }));
  $('break-dialog').addEventListener('close', onBreakClosed);
  window.addEventListener('hashchange', route);
  document.addEventListener('visibilitychange', () => {
    if (!document.hidden && list && !$('list-view').hidden) loadList({ more: false });
  });
  setInterval(tick, TICK_MS);
  route();
}

start();
