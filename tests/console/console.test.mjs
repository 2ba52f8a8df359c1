// The console (/ui) and /docs in headless Chromium, driven by Playwright
// (playwright-core, with Debian's chromium), against real lockd servers
// that scripts/console-tests.sh starts and names in the environment:
//
//   LOCKD_URL            a lockd without API keys
//   LOCKD_KEYS_URL       a lockd with API keys: CONSOLE_VIEWER_KEY (read)
//                        and CONSOLE_OPERATOR_KEY (acquire, extend,
//                        release, read)
//   LOCKD_ADMIN_URL      a lockd whose keys file gives CONSOLE_ADMIN_KEY
//                        the `admin` permission
//   CONSOLE_ARTIFACTS    where the screenshots go
//   CHROMIUM             the browser (Debian's chromium, found on PATH)
//
// Every wait is for an event or a selector, bounded by WAIT (generous: the
// machine may be busy), never a fixed sleep standing for one.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

function env(name) {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set: run these tests with scripts/console-tests.sh`);
  return value;
}

const OPEN = env('LOCKD_URL');
const KEYED = env('LOCKD_KEYS_URL');
const VIEWER = env('CONSOLE_VIEWER_KEY');
const OPERATOR = env('CONSOLE_OPERATOR_KEY');
const ADMIN_URL = process.env.LOCKD_ADMIN_URL || '';
const ADMIN = process.env.CONSOLE_ADMIN_KEY || '';
const ARTIFACTS = env('CONSOLE_ARTIFACTS');
const CHROMIUM = env('CHROMIUM');

/** The longest any one wait may take. */
const WAIT = 30_000;
const KEY_STORE = 'lockd.console.apiKey';

let browser;

before(async () => {
  await mkdir(ARTIFACTS, { recursive: true });
  // Playwright gives each launch a fresh, empty profile (--user-data-dir in
  // a new temporary directory); these flags keep Chromium off the network
  // but for the pages under test.
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    timeout: 120_000,
    args: [
      '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
    ],
  });
});

after(async () => {
  await browser?.close();
});

// ------------------------------------------------------------ lockd over HTTP

/** A name of this test run's own under `label`. */
const unique = (label) => `console-test:${label}:${Date.now().toString(36)}${Math.random().toString(36).slice(2, 8)}`;

async function call(base, method, path, { key, token, body } = {}) {
  const headers = {};
  if (key) headers.authorization = `Bearer ${key}`;
  if (token) headers['lock-token'] = token;
  const response = await fetch(new URL(path, base), {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  let json = null;
  try { json = JSON.parse(text); } catch { json = null; }
  return { status: response.status, json, text };
}

async function acquire(base, name, { key, ttl_ms = 300_000, owner, meta, mode } = {}) {
  const reply = await call(base, 'POST', `/locks/${encodeURIComponent(name)}`, { key, body: { ttl_ms, owner, meta, mode } });
  assert.equal(reply.status, 201, `acquire ${name}: ${reply.text}`);
  return reply.json;
}

async function release(base, name, token, key) {
  const reply = await call(base, 'DELETE', `/locks/${encodeURIComponent(name)}`, { key, token });
  assert.equal(reply.status, 204, `release ${name}: ${reply.text}`);
}

/** Polls `check` (async, truthy when done) every 100 ms up to WAIT. */
async function eventually(what, check) {
  const deadline = Date.now() + WAIT;
  let last;
  for (;;) {
    last = await check();
    if (last) return last;
    if (Date.now() > deadline) assert.fail(`not within ${WAIT} ms: ${what}`);
    await new Promise((resolve) => { setTimeout(resolve, 100); });
  }
}

/** The milliseconds a lease cell shows ("12.3 s", "4 min 05 s", "1 h 02 min"). */
function leaseMs(text) {
  const t = (text || '').trim();
  let m = /^(\d+(?:\.\d+)?) s$/.exec(t);
  if (m) return Number(m[1]) * 1000;
  m = /^(\d+) min (\d+) s$/.exec(t);
  if (m) return (Number(m[1]) * 60 + Number(m[2])) * 1000;
  m = /^(\d+) h (\d+) min$/.exec(t);
  if (m) return (Number(m[1]) * 60 + Number(m[2])) * 60_000;
  if (t === 'lapsed') return 0;
  throw new Error(`not a lease left: ${JSON.stringify(t)}`);
}

// ------------------------------------------------------------ the browser

const isApi = (url) => {
  try {
    return /^\/(locks|semaphores|runs)(\/|\?|$)/.test(new URL(url).pathname);
  } catch {
    return false;
  }
};

/** A fresh browser context (its own storage) and page on `base`. The
 * page's problems are gathered: uncaught errors, console errors and
 * warnings, CSP violations, a request to anywhere but `base`. A console
 * error "Failed to load resource" of an API answer is no problem: Chromium
 * logs every fetch answered 4xx so (a free lock's 404, the 401 that asks
 * for a key), and the page handles them. */
async function openPage(t, base, { width = 1280, height = 900 } = {}) {
  const context = await browser.newContext({ viewport: { width, height } });
  t.after(() => context.close());
  await context.addInitScript(() => {
    document.addEventListener('securitypolicyviolation', (e) => {
      console.error(`CSP violation: ${e.violatedDirective} refused ${e.blockedURI || '(inline)'}`);
    });
  });
  const page = await context.newPage();
  page.setDefaultTimeout(WAIT);
  const problems = [];
  const requests = [];
  const origin = new URL(base).origin;
  page.on('pageerror', (e) => problems.push(`uncaught: ${e.message}`));
  page.on('console', (message) => {
    const type = message.type();
    if (type !== 'error' && type !== 'warning') return;
    const text = message.text();
    const where = message.location()?.url || '';
    if (type === 'error' && /^Failed to load resource: the server responded with a status of \d+/.test(text) && isApi(where)) return;
    problems.push(`console ${type}: ${text} (${where})`);
  });
  page.on('request', (request) => {
    requests.push(request);
    const url = request.url();
    if (!url.startsWith('data:') && new URL(url).origin !== origin) problems.push(`a request to another site: ${url}`);
  });
  return {
    page,
    requests,
    assertClean() {
      assert.deepEqual(problems, [], 'console errors, CSP violations or requests elsewhere');
    },
  };
}

async function shot(page, name) {
  await page.screenshot({ path: join(ARTIFACTS, name), fullPage: true });
}

const listUrl = (base, kind, prefix) => `${base}/ui#/${kind}?prefix=${encodeURIComponent(prefix)}`;
const rowOf = (page, name) => page.locator(`#list tr[data-name="${name}"]`);

async function giveKey(page, key) {
  await page.locator('#key-panel').waitFor({ state: 'visible' });
  await page.locator('#key-input').fill(key);
  await page.locator('#key-input').press('Enter');
  await page.locator('#key-panel').waitFor({ state: 'hidden' });
}

async function waitLive(page) {
  await page.waitForFunction(() => document.querySelector('#watch-status')?.textContent.startsWith('Live'));
}

// ------------------------------------------------------------ tests

test('/docs renders offline: everything from lockd, no CSP violation', async (t) => {
  const { page, requests, assertClean } = await openPage(t, OPEN);
  const answer = await page.goto(`${OPEN}/docs`);
  assert.equal(answer.status(), 200);
  await page.getByRole('heading', { name: 'lockd', level: 1 }).waitFor();
  await page.getByText('/locks/{name}').first().waitFor();
  await page.waitForLoadState('networkidle');
  const script = requests.find((r) => r.url().includes('/docs/scalar/'));
  assert.ok(script, 'the page did not load its script from lockd');
  const response = await script.response();
  assert.equal(response.status(), 200);
  assert.equal((await response.allHeaders())['content-encoding'], 'gzip');
  await shot(page, 'docs-desktop.png');
  assertClean();
});

test('a lock taken over HTTP appears with its owner and meta, and its lease counts down', async (t) => {
  const prefix = unique('list');
  const name = `${prefix}:a`;
  const grant = await acquire(OPEN, name, { owner: 'web-1', meta: { host: 'web-1.internal', pid: 4242 } });
  const { page, assertClean } = await openPage(t, OPEN);
  await page.goto(listUrl(OPEN, 'locks', prefix));
  const row = rowOf(page, name);
  await row.waitFor();
  const holders = row.locator('td[data-label="Holders"]');
  assert.match(await holders.textContent(), /web-1/);
  assert.match(await holders.textContent(), /"host":"web-1\.internal"/);
  assert.match(await holders.textContent(), /"pid":4242/);
  assert.equal((await row.locator('td[data-label="Mode"]').textContent()).trim(), 'exclusive');
  assert.equal((await row.locator('td[data-label="Fence"]').textContent()).trim(), String(grant.fence));

  const lease = row.locator('.lease');
  const first = leaseMs(await lease.textContent());
  assert.ok(first > 0 && first <= 300_000, `lease ${first} ms`);
  await eventually('the lease left to count down', async () => leaseMs(await lease.textContent()) < first);

  // A lock taken after the page loaded shows at its next refresh, a
  // shared one with each holder.
  const second = `${prefix}:b`;
  await acquire(OPEN, second, { owner: 'reader-1', mode: 'shared' });
  await acquire(OPEN, second, { owner: 'reader-2', mode: 'shared', meta: { job: 'nightly' } });
  const shared = rowOf(page, second);
  await shared.waitFor();
  await eventually('both readers listed', async () => (await shared.locator('.holders li').count()) === 2);
  assert.match(await shared.textContent(), /reader-1/);
  assert.match(await shared.textContent(), /reader-2/);
  assert.match(await shared.locator('td[data-label="Waiting"]').textContent(), /no writer waits/);
  await shot(page, 'list-desktop.png');
  assertClean();
});

test('opening a lock follows its watch: a release over HTTP arrives live', async (t) => {
  const name = unique('watch');
  const grant = await acquire(OPEN, name, { owner: 'worker-7', meta: { pid: 7 } });
  const { page, assertClean } = await openPage(t, OPEN);
  await page.goto(`${OPEN}/ui#/locks/${name}`);
  await page.locator('#detail-title', { hasText: name }).waitFor();
  await page.locator('#detail-state td[data-label="Owner"]', { hasText: 'worker-7' }).waitFor();
  await waitLive(page);
  await page.locator('#events li[data-event="state"]').waitFor();
  // Its lease counts down here too.
  const lease = page.locator('#detail-state td[data-label="Lease left"] .lease');
  const first = leaseMs(await lease.textContent());
  await eventually('the lease left to count down', async () => leaseMs(await lease.textContent()) < first);
  await shot(page, 'detail-desktop.png');

  await release(OPEN, name, grant.token);
  const released = page.locator('#events li[data-event="released"]');
  await released.waitFor();
  assert.match(await released.textContent(), new RegExp(`fence ${grant.fence}`));
  await page.locator('#detail-state', { hasText: 'Nobody holds this lock now.' }).waitFor();
  // Taken again: acquired arrives, and the new holder shows.
  await acquire(OPEN, name, { owner: 'worker-8' });
  await page.locator('#events li[data-event="acquired"]').waitFor();
  await page.locator('#detail-state td[data-label="Owner"]', { hasText: 'worker-8' }).waitFor();
  assertClean();
});

test('opening a lock shows its history', async (t) => {
  const name = unique('history');
  const first = await acquire(OPEN, name, { owner: 'first-holder', meta: { n: 1 } });
  await release(OPEN, name, first.token);
  const second = await acquire(OPEN, name, { owner: 'second-holder' });
  const { page, assertClean } = await openPage(t, OPEN);
  await page.goto(`${OPEN}/ui#/locks/${name}`);
  const rows = page.locator('#history tbody tr');
  await eventually('two leases in the history', async () => (await rows.count()) >= 2);
  // Newest first: the holder now, then the released one.
  assert.match(await rows.nth(0).textContent(), new RegExp(`${second.fence}`));
  assert.match(await rows.nth(0).locator('td[data-label="Ended"]').textContent(), /held now/);
  assert.match(await rows.nth(1).textContent(), new RegExp(`${first.fence}`));
  assert.match(await rows.nth(1).textContent(), /first-holder/);
  assert.match(await rows.nth(1).locator('td[data-label="Ended"]').textContent(), /released/);
  // A release the page sees live reaches the history too.
  await waitLive(page);
  await release(OPEN, name, second.token);
  await eventually('the second lease ended in the history', async () => /released/.test(await rows.nth(0).locator('td[data-label="Ended"]').textContent()));
  assertClean();
});

test('a server without history or run listing says so (a 404 or 405 answer)', async (t) => {
  const name = unique('nohistory');
  await acquire(OPEN, name, { owner: 'x' });
  const { page, assertClean } = await openPage(t, OPEN);
  const problem = (status, slug) => ({
    status,
    contentType: 'application/problem+json',
    body: JSON.stringify({ type: `urn:lockd:problem:${slug}`, title: 'No', status, detail: 'no' }),
  });
  await page.route((url) => url.pathname.endsWith('/history'), (route) => route.fulfill(problem(405, 'method-not-allowed')));
  await page.route((url) => url.pathname === '/runs', (route) => route.fulfill(problem(404, 'route-not-found')));
  await page.goto(`${OPEN}/ui#/locks/${name}`);
  await page.locator('#history-status', { hasText: 'This server keeps no history' }).waitFor();
  await page.goto(`${OPEN}/ui#/runs`);
  await page.locator('#list-status', { hasText: 'Listing runs is not available on this server' }).waitFor();
  assertClean();
});

// The next three hold the page to the contract of the history, break and
// run-listing answers (docs/console.md) with answers made here, so that
// they check the page alone; the tests above and below check it against lockd.

const json = (status, body, type = 'application/json') => ({ status, contentType: type, body: JSON.stringify(body) });

test('history answers as the contract says are shown newest first, broken ones with who broke them', async (t) => {
  const name = unique('stub-history');
  const held = await acquire(OPEN, name, { owner: 'now-holder' });
  const { page, assertClean } = await openPage(t, OPEN);
  await page.route((url) => url.pathname === `/locks/${encodeURIComponent(name)}/history`, (route) => route.fulfill(json(200, {
    name,
    history_length: 20,
    entries: [
      { fence: held.fence, mode: 'exclusive', owner: 'now-holder', meta: null, granted_at: new Date().toISOString(), expires_at: held.expires_at, ended: null, ended_at: null, held_ms: 1200, broken_by: null },
      { fence: held.fence - 10, mode: 'shared', owner: 'old-holder', meta: { pid: 9 }, granted_at: '2026-12-01T10:00:00Z', expires_at: '2026-12-01T10:00:30Z', ended: 'broken', ended_at: '2026-12-01T10:00:05Z', held_ms: 5000, broken_by: 'ops-admin' },
    ],
  })));
  await page.goto(`${OPEN}/ui#/locks/${name}`);
  const rows = page.locator('#history tbody tr');
  await eventually('two history rows', async () => (await rows.count()) === 2);
  assert.match(await rows.nth(0).locator('td[data-label="Ended"]').textContent(), /held now/);
  assert.match(await rows.nth(0).locator('td[data-label="Fence"]').textContent(), new RegExp(`${held.fence}`));
  assert.match(await rows.nth(1).locator('td[data-label="Owner"]').textContent(), /old-holder/);
  assert.match(await rows.nth(1).locator('td[data-label="Meta"]').textContent(), /"pid":9/);
  assert.match(await rows.nth(1).locator('td[data-label="Mode"]').textContent(), /shared/);
  assert.match(await rows.nth(1).locator('td[data-label="Held for"]').textContent(), /5\.0 s/);
  assert.match(await rows.nth(1).locator('td[data-label="Ended"]').textContent(), /broken/);
  assert.match(await rows.nth(1).locator('td[data-label="Broken by"]').textContent(), /ops-admin/);
  await page.locator('#history-status', { hasText: 'lockd keeps 20' }).waitFor();
  assertClean();
});

test('a break sends DELETE ?force=true with the fence of one shared lease, and shows what was broken', async (t) => {
  const name = unique('stub-break');
  await acquire(OPEN, name, { owner: 'reader-1', mode: 'shared' });
  const second = await acquire(OPEN, name, { owner: 'reader-2', mode: 'shared' });
  const { page, assertClean } = await openPage(t, OPEN);
  const sent = [];
  await page.route((url) => url.pathname === `/locks/${encodeURIComponent(name)}` && url.searchParams.has('force'), (route) => {
    const request = route.request();
    sent.push({ method: request.method(), url: new URL(request.url()) });
    if (sent.length === 1) {
      return route.fulfill(json(200, { name, broken: [{ fence: second.fence, owner: 'reader-2', mode: 'shared' }] }));
    }
    return route.fulfill(json(404, { type: 'urn:lockd:problem:lock-not-held', title: 'Lock is not held', status: 404, detail: 'nobody holds this lock' }, 'application/problem+json'));
  });
  await page.goto(`${OPEN}/ui#/locks/${name}`);
  await page.getByRole('button', { name: /Break the lease of reader-2/ }).click();
  const dialog = page.locator('#break-dialog');
  assert.match(await dialog.textContent(), new RegExp(`reader-2.*fence ${second.fence}.*shared`));
  await dialog.getByRole('button', { name: 'Break it' }).click();
  await page.locator('#detail-status', { hasText: `Broke fence ${second.fence} (reader-2).` }).waitFor();
  assert.equal(sent.length, 1);
  assert.equal(sent[0].method, 'DELETE');
  assert.equal(sent[0].url.searchParams.get('force'), 'true');
  assert.equal(sent[0].url.searchParams.get('fence'), String(second.fence));
  // A problem answer shows its detail.
  await page.getByRole('button', { name: /Break the lease of reader-1/ }).click();
  await dialog.getByRole('button', { name: 'Break it' }).click();
  await page.locator('#detail-status', { hasText: 'nobody holds this lock' }).waitFor();
  assertClean();
});

test('run listings as the contract says are shown with state, attempt, owner, meta and lease', async (t) => {
  const prefix = unique('stub-runs');
  const key = `${prefix}:job`;
  const { page, assertClean } = await openPage(t, OPEN);
  await page.route((url) => url.pathname === '/runs', (route) => {
    assert.equal(new URL(route.request().url()).searchParams.get('prefix'), prefix);
    return route.fulfill(json(200, {
      runs: [{ key, state: 'running', fence: 42, owner: 'hook-9', meta: { delivery: 'abc' }, ttl_ms: 120_000, expires_at: new Date(Date.now() + 120_000).toISOString(), attempt: 2 }],
      next_cursor: null,
    }));
  });
  await page.goto(listUrl(OPEN, 'runs', prefix));
  const row = rowOf(page, key);
  await row.waitFor();
  assert.equal((await row.locator('td[data-label="Attempt"]').textContent()).trim(), '2');
  assert.match(await row.locator('td[data-label="Owner"]').textContent(), /hook-9/);
  assert.match(await row.locator('td[data-label="Meta"]').textContent(), /"delivery":"abc"/);
  assert.ok(leaseMs(await row.locator('.lease').textContent()) > 60_000);
  assertClean();
});

test('a run started over HTTP appears in the runs tab', async (t) => {
  const prefix = unique('runs');
  const key = `${prefix}:delivery-1`;
  const started = await call(OPEN, 'POST', `/runs/${encodeURIComponent(key)}`, { body: { ttl_ms: 300_000, owner: 'hook-1', meta: { delivery: 1 } } });
  assert.equal(started.status, 201, started.text);
  const { page, assertClean } = await openPage(t, OPEN);
  await page.goto(listUrl(OPEN, 'runs', prefix));
  const row = rowOf(page, key);
  await row.waitFor();
  assert.equal((await row.locator('td[data-label="State"]').textContent()).trim(), 'running');
  assert.equal((await row.locator('td[data-label="Attempt"]').textContent()).trim(), '1');
  assert.match(await row.locator('td[data-label="Owner"]').textContent(), /hook-1/);
  assert.match(await row.locator('td[data-label="Meta"]').textContent(), /"delivery":1/);
  leaseMs(await row.locator('.lease').textContent());
  assertClean();
});

test('semaphores: each permit with its owner, meta and lease', async (t) => {
  const prefix = unique('sem');
  const name = `${prefix}:exports`;
  for (const owner of ['exporter-1', 'exporter-2']) {
    const taken = await call(OPEN, 'POST', `/semaphores/${encodeURIComponent(name)}`, { body: { limit: 3, ttl_ms: 300_000, owner, meta: { owner } } });
    assert.equal(taken.status, 201, taken.text);
  }
  const { page, assertClean } = await openPage(t, OPEN);
  await page.goto(listUrl(OPEN, 'semaphores', prefix));
  const row = rowOf(page, name);
  await row.waitFor();
  assert.match(await row.locator('td[data-label="Permits"]').textContent(), /2 of 3 held/);
  assert.equal(await row.locator('.holders li').count(), 2);
  await row.getByRole('link', { name }).click();
  await page.locator('#detail-title', { hasText: name }).waitFor();
  await eventually('two permits in detail', async () => (await page.locator('#detail-state tbody tr').count()) === 2);
  await waitLive(page);
  assertClean();
});

test('with API keys: the key form, sessionStorage, never in a URL, forget', async (t) => {
  const prefix = unique('keys');
  const name = `${prefix}:a`;
  await acquire(KEYED, name, { key: OPERATOR, owner: 'keyed-holder' });
  const { page, requests, assertClean } = await openPage(t, KEYED);
  await page.goto(listUrl(KEYED, 'locks', prefix));
  await page.locator('#key-panel').waitFor({ state: 'visible' });
  assert.equal(await page.evaluate(() => document.activeElement?.id), 'key-input', 'the key input has focus');
  await shot(page, 'key-form-desktop.png');

  // A wrong key is refused, and the form says why.
  await page.locator('#key-input').fill('not-a-key-of-this-lockd');
  await page.locator('#key-input').press('Enter');
  await page.locator('#key-reason', { hasText: 'not known' }).waitFor();

  await page.locator('#key-input').fill(VIEWER);
  await page.getByRole('button', { name: 'Use this key' }).click();
  await page.locator('#key-panel').waitFor({ state: 'hidden' });
  await rowOf(page, name).waitFor();
  assert.equal(await page.evaluate((k) => sessionStorage.getItem(k), KEY_STORE), VIEWER);
  assert.equal(await page.evaluate(() => localStorage.length), 0, 'nothing in localStorage');
  assert.deepEqual(await page.context().cookies(), []);

  // Kept for the tab: a reload needs no form.
  await page.reload();
  await rowOf(page, name).waitFor();
  assert.ok(await page.locator('#key-panel').isHidden());

  // The watch carries the key too (fetch, not EventSource).
  await rowOf(page, name).getByRole('link', { name }).click();
  await waitLive(page);

  // The key is in no URL, and in the Authorization header of the API's requests.
  for (const request of requests) {
    assert.ok(!request.url().includes(VIEWER), `the key is in a URL: ${request.url()}`);
    assert.ok(!request.url().includes(encodeURIComponent(VIEWER)), `the key is in a URL: ${request.url()}`);
  }
  assert.ok(!page.url().includes(VIEWER));
  const watches = requests.filter((r) => r.url().endsWith('/events'));
  assert.ok(watches.length > 0, 'no watch request');
  assert.equal((await watches.at(-1).allHeaders()).authorization, `Bearer ${VIEWER}`);

  // Forgotten: gone from storage, and the form is back.
  await page.getByRole('button', { name: 'Forget key' }).click();
  assert.equal(await page.evaluate((k) => sessionStorage.getItem(k), KEY_STORE), null);
  await page.locator('#key-panel').waitFor({ state: 'visible' });
  assertClean();
});

test('a break with a key without admin permission says "your key has no admin permission"', async (t) => {
  const name = unique('noadmin');
  const grant = await acquire(KEYED, name, { key: OPERATOR, owner: 'busy-holder' });
  const { page, assertClean } = await openPage(t, KEYED);
  await page.goto(`${KEYED}/ui#/locks/${name}`);
  await giveKey(page, VIEWER);
  const button = page.getByRole('button', { name: /Break the lease of busy-holder/ });
  await button.click();
  const dialog = page.locator('#break-dialog');
  await dialog.waitFor({ state: 'visible' });
  assert.match(await dialog.textContent(), /busy-holder/);
  assert.match(await dialog.textContent(), new RegExp(`fence ${grant.fence}`));
  await dialog.getByRole('button', { name: 'Break it' }).click();
  await page.locator('#detail-status', { hasText: /your key has no admin permission/i }).waitFor();
  // Nothing broken; the page offers no break with this key any more.
  const still = await call(KEYED, 'GET', `/locks/${encodeURIComponent(name)}`, { key: OPERATOR });
  assert.equal(still.status, 200);
  assert.equal(still.json.fence, grant.fence);
  await eventually('no break button left', async () => (await page.getByRole('button', { name: /Break the lease/ }).count()) === 0);
  assertClean();
});

test('an operator finds a stuck lock, sees who held it before, and breaks it from the page', async (t) => {
  assert.ok(ADMIN_URL, 'LOCKD_ADMIN_URL is not set');
  const name = unique('break');
  const before = await acquire(ADMIN_URL, name, { key: ADMIN, owner: 'earlier-holder' });
  await call(ADMIN_URL, 'DELETE', `/locks/${encodeURIComponent(name)}`, { key: ADMIN, token: before.token });
  const grant = await acquire(ADMIN_URL, name, { key: ADMIN, owner: 'stuck-holder', meta: { host: 'gone' } });
  const { page, assertClean } = await openPage(t, ADMIN_URL);
  const breaks = [];
  page.on('request', (request) => {
    if (request.method() === 'DELETE') breaks.push(new URL(request.url()));
  });
  await page.goto(`${ADMIN_URL}/ui#/locks/${name}`);
  await giveKey(page, ADMIN);
  await waitLive(page);
  // Who held it before: the earlier holder, released.
  const rows = page.locator('#history tbody tr');
  await eventually('two leases in the history', async () => (await rows.count()) >= 2);
  assert.match(await rows.nth(1).textContent(), /earlier-holder/);
  assert.match(await rows.nth(1).locator('td[data-label="Ended"]').textContent(), /released/);
  await page.getByRole('button', { name: /Break the lease of stuck-holder/ }).click();
  const dialog = page.locator('#break-dialog');
  await dialog.waitFor({ state: 'visible' });
  assert.match(await dialog.textContent(), /stuck-holder/);
  assert.match(await dialog.textContent(), new RegExp(`fence ${grant.fence}`));
  await shot(page, 'break-dialog-desktop.png');
  await dialog.getByRole('button', { name: 'Break it' }).click();
  await page.locator('#detail-status', { hasText: `Broke fence ${grant.fence}` }).waitFor();
  // Watchers hear `broken`; the holder's next extend finds no lease.
  await page.locator('#events li[data-event="broken"]').waitFor();
  await page.locator('#detail-state', { hasText: 'Nobody holds this lock now.' }).waitFor();
  const extend = await call(ADMIN_URL, 'PATCH', `/locks/${encodeURIComponent(name)}`, { key: ADMIN, token: grant.token });
  assert.equal(extend.status, 404, extend.text);
  // The break named the fence the dialog showed, and the history says who
  // broke the lease.
  assert.equal(breaks.length, 1);
  assert.equal(breaks[0].searchParams.get('force'), 'true');
  assert.equal(breaks[0].searchParams.get('fence'), String(grant.fence));
  await eventually('the break in the history', async () => /broken/.test(await rows.nth(0).locator('td[data-label="Ended"]').textContent()));
  assert.match(await rows.nth(0).locator('td[data-label="Broken by"]').textContent(), /admin/);
  // The next holder's fence is larger: storage that checks fences refuses
  // the stuck holder's late write.
  const next = await acquire(ADMIN_URL, name, { key: ADMIN, owner: 'next-holder' });
  assert.ok(BigInt(next.fence) > BigInt(grant.fence), `${next.fence} after ${grant.fence}`);
  assertClean();
});

test('keyboard: Tab and Enter reach a lock, its break dialog, and Escape cancels it', async (t) => {
  const prefix = unique('keys-only');
  const name = `${prefix}:a`;
  const grant = await acquire(OPEN, name, { owner: 'kb-holder' });
  const { page, assertClean } = await openPage(t, OPEN);
  await page.goto(listUrl(OPEN, 'locks', prefix));
  await rowOf(page, name).waitFor();
  // Tab to the lock's link; each stop shows where focus is.
  const focusOn = async (check, what) => {
    for (let i = 0; i < 40; i += 1) {
      await page.keyboard.press('Tab');
      const at = await page.evaluate(() => {
        const el = document.activeElement;
        const style = getComputedStyle(el);
        return { text: el.textContent.trim(), tag: el.tagName, label: el.getAttribute('aria-label') || '', outline: style.outlineStyle };
      });
      assert.notEqual(at.outline, 'none', `no visible focus on <${at.tag}> ${at.text}`);
      if (check(at)) return;
    }
    assert.fail(`Tab never reached ${what}`);
  };
  await focusOn((at) => at.tag === 'A' && at.text === name, `the link to ${name}`);
  await page.keyboard.press('Enter');
  await page.locator('#detail-title', { hasText: name }).waitFor();
  await page.locator('#detail-state td[data-label="Owner"]', { hasText: 'kb-holder' }).waitFor();
  await focusOn((at) => at.tag === 'BUTTON' && at.label.startsWith('Break the lease of kb-holder'), 'the break button');
  await page.keyboard.press('Enter');
  const dialog = page.locator('#break-dialog');
  await dialog.waitFor({ state: 'visible' });
  assert.equal(await page.evaluate(() => document.activeElement?.textContent), 'Cancel', 'Cancel has focus first');
  await page.keyboard.press('Escape');
  await dialog.waitFor({ state: 'hidden' });
  const still = await call(OPEN, 'GET', `/locks/${encodeURIComponent(name)}`);
  assert.equal(still.status, 200, 'Escape broke the lock');
  assert.equal(still.json.fence, grant.fence);
  // The prefix form by keyboard.
  await page.goto(`${OPEN}/ui#/locks`);
  await page.locator('#prefix-input').focus();
  await page.keyboard.type(prefix);
  await page.keyboard.press('Enter');
  await page.waitForFunction((p) => location.hash === `#/locks?prefix=${encodeURIComponent(p)}`, prefix);
  await rowOf(page, name).waitFor();
  assertClean();
});

test('a phone-wide (390 px) viewport scrolls no sideways: rows become cards', async (t) => {
  const prefix = unique('phone');
  const name = `${prefix}:a-rather-long-lock-name-to-see-it-wrap-on-a-phone-screen`;
  await acquire(OPEN, name, { owner: 'phone-holder', meta: { job: 'a-long-identifier-without-spaces-that-must-wrap-somewhere-on-a-phone', n: 1 } });
  await acquire(OPEN, `${prefix}:b`, { owner: 'reader', mode: 'shared' });
  const { page, assertClean } = await openPage(t, OPEN, { width: 390, height: 844 });
  const noSideways = async (what) => {
    const [scroll, width] = await page.evaluate(() => [document.documentElement.scrollWidth, window.innerWidth]);
    assert.ok(scroll <= width, `${what}: ${scroll} px wide in a ${width} px viewport`);
  };
  await page.goto(listUrl(OPEN, 'locks', prefix));
  const row = rowOf(page, name);
  await row.waitFor();
  assert.equal(await row.evaluate((tr) => getComputedStyle(tr).display), 'block', 'a row is a card');
  await noSideways('the list');
  await shot(page, 'list-phone.png');
  await row.getByRole('link').click();
  await page.locator('#detail-state td[data-label="Owner"]', { hasText: 'phone-holder' }).waitFor();
  await waitLive(page);
  await noSideways('a lock');
  await shot(page, 'detail-phone.png');
  await page.getByRole('button', { name: /Break the lease/ }).click();
  await page.locator('#break-dialog').waitFor({ state: 'visible' });
  await noSideways('the break dialog');
  await page.getByRole('button', { name: 'Cancel' }).click();
  await page.goto(`${OPEN}/docs`);
  await page.getByRole('heading', { name: 'lockd', level: 1 }).waitFor();
  await shot(page, 'docs-phone.png');
  assertClean();
});
