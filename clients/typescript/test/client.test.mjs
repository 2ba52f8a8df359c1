// The client against a real lockd on a real redis-server, both started here
// on free loopback ports. lockd: $LOCKD_BIN, else the repository's
// target/debug/lockd (scripts/test.sh gives the release build).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import { createServer } from "node:net";
import { fileURLToPath } from "node:url";
import path from "node:path";

import { Lockd, LockHeldError, LeaseLostError, NotOwnerError } from "../dist/index.js";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../..");
const lockdBin =
  process.env.LOCKD_BIN ?? path.join(process.env.CARGO_TARGET_DIR ?? path.join(root, "target"), "debug/lockd");
const children = [];
let redisPort;
let url;

function freePort() {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

async function until(what, check, withinMs = 30_000) {
  const end = Date.now() + withinMs;
  for (;;) {
    try {
      if (await check()) return;
    } catch {
      // not yet
    }
    if (Date.now() > end) throw new Error(`${what} did not happen within ${withinMs} ms`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

function redis(...args) {
  return execFileSync("redis-cli", ["-p", String(redisPort), ...args], {
    encoding: "utf8",
    stdio: ["ignore", "pipe", "ignore"],
  }).trim();
}

before(async () => {
  redisPort = await freePort();
  const lockdPort = await freePort();
  children.push(
    spawn("redis-server", ["--bind", "127.0.0.1", "--port", String(redisPort), "--save", "", "--appendonly", "no"], {
      stdio: "ignore",
    }),
  );
  await until("redis-server answering", () => redis("ping") === "PONG");
  children.push(
    spawn(lockdBin, ["serve", "--listen", `127.0.0.1:${lockdPort}`, "--redis-url", `redis://127.0.0.1:${redisPort}`], {
      stdio: "ignore",
    }),
  );
  url = `http://127.0.0.1:${lockdPort}`;
  await until("lockd ready", async () => (await fetch(`${url}/readyz`)).ok);
});

after(() => {
  for (const child of children) child.kill();
});

test("acquire, extend, status and release, with one fence", async () => {
  const lockd = new Lockd({ url });
  const lease = await lockd.acquire("ts:basic", { ttlMs: 5_000, owner: "test" });
  assert.equal(lease.name, "ts:basic");
  assert.ok(lease.fence > 0);
  assert.ok(lease.expiresAt.getTime() > Date.now());
  const status = await lockd.status("ts:basic");
  assert.equal(status.held, true);
  assert.equal(status.fence, lease.fence);
  assert.equal(status.owner, "test");
  const extended = await lockd.extend(lease, { ttlMs: 8_000 });
  assert.equal(extended.fence, lease.fence);
  assert.ok(extended.ttlMs > 5_000 && extended.ttlMs <= 8_000, String(extended.ttlMs));
  await lockd.release(extended);
  assert.equal((await lockd.status("ts:basic")).held, false);
  // Releasing a lease that is gone is no error.
  await lockd.release(extended);
});

test("a held lock is a LockHeldError with retryAfterMs; another's token is NotOwnerError", async () => {
  const lockd = new Lockd({ url });
  const lease = await lockd.acquire("ts:held", { ttlMs: 20_000 });
  await assert.rejects(lockd.acquire("ts:held"), (e) => {
    assert.ok(e instanceof LockHeldError, String(e));
    assert.equal(e.status, 409);
    assert.equal(e.type, "urn:lockd:problem:lock-held");
    assert.ok(e.retryAfterMs > 0 && e.retryAfterMs <= 20_000, String(e.retryAfterMs));
    assert.ok(e.requestId);
    return true;
  });
  const stranger = { ...lease, token: "x".repeat(32) };
  await assert.rejects(lockd.extend(stranger), NotOwnerError);
  await lockd.release(lease);
});

test("a retry after a dropped answer keeps the grant: the same fence", async () => {
  let dropped = 0;
  // Sends the first acquire, then throws its answer away, as a lost
  // connection would.
  const dropping = async (input, init) => {
    const answer = await fetch(input, init);
    if (init?.method === "POST" && dropped === 0) {
      dropped += 1;
      await answer.text();
      throw new TypeError("fetch failed: connection reset");
    }
    return answer;
  };
  const lockd = new Lockd({ url, fetch: dropping });
  const lease = await lockd.acquire("ts:dropped", { ttlMs: 10_000 });
  assert.equal(dropped, 1);
  const held = await new Lockd({ url }).status("ts:dropped");
  assert.equal(held.fence, lease.fence, "the retry renewed the grant made by the lost request");
  await lockd.release(lease);
});

test("a 503 with Retry-After is retried", async () => {
  let refused = 0;
  const busy = async (input, init) => {
    if (refused === 0) {
      refused += 1;
      return new Response(
        JSON.stringify({ type: "urn:lockd:problem:overloaded", status: 503, retry_after_ms: 200 }),
        { status: 503, headers: { "retry-after": "1", "content-type": "application/problem+json" } },
      );
    }
    return fetch(input, init);
  };
  const lockd = new Lockd({ url, fetch: busy });
  const lease = await lockd.acquire("ts:busy", { ttlMs: 5_000 });
  assert.equal(refused, 1);
  await lockd.release(lease);
});

test("withLock renews, returns the value, and releases", async () => {
  const lockd = new Lockd({ url });
  let fence;
  const value = await lockd.withLock("ts:with", { ttlMs: 600 }, async (lease, signal) => {
    fence = lease.fence;
    // Outlive the TTL twice over: only the renewals keep the lease.
    const end = Date.now() + 1_500;
    while (Date.now() < end) {
      await new Promise((r) => setTimeout(r, 100));
      assert.equal(signal.aborted, false, "the lease was lost while renewed");
    }
    const status = await lockd.status("ts:with");
    assert.equal(status.fence, lease.fence);
    return 42;
  });
  assert.equal(value, 42);
  assert.ok(fence > 0);
  assert.equal((await lockd.status("ts:with")).held, false);
});

test("a lease lost mid-work aborts the signal and withLock throws LeaseLostError", async () => {
  const lockd = new Lockd({ url });
  await assert.rejects(
    lockd.withLock("ts:lost", { ttlMs: 900 }, async (_lease, signal) => {
      redis("DEL", "lockd:{ts:lost}");
      // Bounded by the abort; the 30 s timer only turns a hang into a failure.
      let timer;
      await new Promise((resolve, reject) => {
        signal.addEventListener("abort", resolve, { once: true });
        timer = setTimeout(() => reject(new Error("the signal never aborted")), 30_000);
      });
      clearTimeout(timer);
      assert.ok(signal.reason instanceof LeaseLostError);
      return "done";
    }),
    LeaseLostError,
  );
});

test("npm pack makes a package that installs into a fresh project and runs the cron example", async () => {
  const { mkdtempSync, copyFileSync, writeFileSync, rmSync } = await import("node:fs");
  const { tmpdir } = await import("node:os");
  const here = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
  const work = mkdtempSync(path.join(tmpdir(), "lockd-client-"));
  try {
    const packed = execFileSync("npm", ["pack", "--silent", "--pack-destination", work], {
      cwd: here,
      encoding: "utf8",
    })
      .trim()
      .split("\n")
      .pop();
    writeFileSync(path.join(work, "package.json"), JSON.stringify({ private: true, type: "module" }));
    execFileSync("npm", ["install", "--silent", "--no-audit", "--no-fund", path.join(work, packed)], {
      cwd: work,
      stdio: "ignore",
    });
    copyFileSync(path.join(here, "examples/cron.mjs"), path.join(work, "cron.mjs"));
    const out = execFileSync("node", ["cron.mjs"], { cwd: work, encoding: "utf8", env: { ...process.env, LOCKD_URL: url } });
    assert.match(out, /report written under fence \d+/);
    // A second host while the first holds it: told, not run.
    const lockd = new Lockd({ url });
    const lease = await lockd.acquire("cron:nightly-report", { ttlMs: 10_000 });
    const second = execFileSync("node", ["cron.mjs"], { cwd: work, encoding: "utf8", env: { ...process.env, LOCKD_URL: url } });
    assert.match(second, /another host runs it; free in at most \d+ ms/);
    await lockd.release(lease);
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
});

test("bad durations and names are refused before any request", async () => {
  let sent = 0;
  const counting = async (input, init) => {
    sent += 1;
    return fetch(input, init);
  };
  const lockd = new Lockd({ url, fetch: counting });
  for (const options of [{ waitMs: 1.5 }, { ttlMs: Number.NaN }, { ttlMs: Infinity }, { waitMs: -1 }]) {
    await assert.rejects(lockd.acquire("ts:bad", options), RangeError, JSON.stringify(options));
  }
  // URLs normalise "." and ".." away: no request could name them.
  for (const name of ["", ".", ".."]) {
    await assert.rejects(lockd.acquire(name), RangeError, name);
  }
  assert.equal(sent, 0);
  // Any other bad name gets lockd's 400.
  for (const name of ["a/b", "x".repeat(300)]) {
    await assert.rejects(lockd.acquire(name), (e) => e.status === 400 && e.type === "urn:lockd:problem:invalid-request");
  }
});

test("withLock stops renewing at maxHoldMs: the lease runs out and the signal says why", async () => {
  const lockd = new Lockd({ url });
  await assert.rejects(
    lockd.withLock("ts:max-hold", { ttlMs: 600, maxHoldMs: 700 }, async (_lease, signal) => {
      let timer;
      await new Promise((resolve, reject) => {
        signal.addEventListener("abort", resolve, { once: true });
        timer = setTimeout(() => reject(new Error("the signal never aborted")), 30_000);
      });
      clearTimeout(timer);
      assert.match(signal.reason.message, /maxHoldMs/);
    }),
    LeaseLostError,
  );
});
