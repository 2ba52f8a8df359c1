// The client's locks against a real lockd on a real redis-server, both
// started by test/support.mjs on free loopback ports.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import path from "node:path";

import { Lockd, LockHeldError, LeaseLostError, NotOwnerError, UnavailableError } from "../dist/index.js";
import { servers, redis, here, aborted } from "./support.mjs";

test("acquire, extend, status and release, with one fence", async () => {
  const lockd = new Lockd({ url: servers.url });
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
  const lockd = new Lockd({ url: servers.url });
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
  // A release with another's token is no error, and leaves the lease alone.
  await lockd.release(stranger);
  assert.equal((await lockd.status("ts:held")).fence, lease.fence);
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
  const lockd = new Lockd({ url: servers.url, fetch: dropping });
  const lease = await lockd.acquire("ts:dropped", { ttlMs: 10_000 });
  assert.equal(dropped, 1);
  const held = await new Lockd({ url: servers.url }).status("ts:dropped");
  assert.equal(held.fence, lease.fence, "the retry renewed the grant made by the lost request");
  await lockd.release(lease);
});

test("an acquire that gives up unanswered releases what its request may have been granted", async () => {
  // Every POST reaches lockd, which grants it, but its answer is lost, as
  // a stalled Redis or a broken connection would lose it, until the
  // retry deadline; the DELETEs get through.
  const losing = async (input, init) => {
    const answer = await fetch(input, init);
    if (init?.method === "POST") {
      await answer.text();
      throw new TypeError("fetch failed: connection reset");
    }
    return answer;
  };
  const lockd = new Lockd({ url: servers.url, fetch: losing, retryForMs: 300 });
  await assert.rejects(lockd.acquire("ts:given-up", { ttlMs: 60_000 }), UnavailableError);
  assert.equal((await new Lockd({ url: servers.url }).status("ts:given-up")).held, false, "not held for its 60 s");
  await assert.rejects(lockd.acquirePermit("ts:given-up-sem", { limit: 1, ttlMs: 60_000 }), UnavailableError);
  assert.equal((await new Lockd({ url: servers.url }).semaphoreStatus("ts:given-up-sem")).held, false);
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
  const lockd = new Lockd({ url: servers.url, fetch: busy });
  const lease = await lockd.acquire("ts:busy", { ttlMs: 5_000 });
  assert.equal(refused, 1);
  await lockd.release(lease);
});

test("withLock renews, returns the value, and releases", async () => {
  const lockd = new Lockd({ url: servers.url });
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
  const lockd = new Lockd({ url: servers.url });
  await assert.rejects(
    lockd.withLock("ts:lost", { ttlMs: 900 }, async (_lease, signal) => {
      redis("DEL", "lockd:{ts:lost}");
      await aborted(signal);
      assert.ok(signal.reason instanceof LeaseLostError);
      return "done";
    }),
    LeaseLostError,
  );
});

test("npm pack makes a package that installs into a fresh project, runs the cron example and type-checks", async () => {
  const { mkdtempSync, copyFileSync, writeFileSync, rmSync } = await import("node:fs");
  const { tmpdir } = await import("node:os");
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
    const out = execFileSync("node", ["cron.mjs"], { cwd: work, encoding: "utf8", env: { ...process.env, LOCKD_URL: servers.url } });
    assert.match(out, /report written under fence \d+/);
    // A second host while the first holds it: told, not run.
    const lockd = new Lockd({ url: servers.url });
    const lease = await lockd.acquire("cron:nightly-report", { ttlMs: 10_000 });
    const second = execFileSync("node", ["cron.mjs"], { cwd: work, encoding: "utf8", env: { ...process.env, LOCKD_URL: servers.url } });
    assert.match(second, /another host runs it; free in at most \d+ ms/);
    await lockd.release(lease);
    // Its declarations compile in a strict TypeScript project, with and
    // without the `esnext.disposable` lib (whose declarations the package
    // repeats for `await using`).
    writeFileSync(
      path.join(work, "check.ts"),
      [
        'import { Lockd, LockHeldError, type Lease } from "lockd-client";',
        'const lockd = new Lockd({ url: "http://127.0.0.1:1" });',
        "export async function take(): Promise<number> {",
        '  const lease: Lease = await lockd.acquire("x", { ttlMs: 1_000 });',
        "  await lockd.release(lease);",
        "  return lease.fence + (new LockHeldError('', 409, '') instanceof Error ? 0 : 1);",
        "}",
        "",
      ].join("\n"),
    );
    const tsc = path.join(here, "node_modules/typescript/bin/tsc");
    const common = ["--strict", "--noEmit", "--target", "es2022", "--module", "es2022", "--moduleResolution", "bundler"];
    for (const lib of ["es2022,dom", "es2022,dom,esnext.disposable"]) {
      execFileSync("node", [tsc, ...common, "--lib", lib, "check.ts"], { cwd: work, encoding: "utf8" });
    }
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
  const lockd = new Lockd({ url: servers.url, fetch: counting });
  // A TTL of 0 too: lockd refuses a lease of 0 ms (a new-user trial got its 400).
  for (const options of [{ waitMs: 1.5 }, { ttlMs: Number.NaN }, { ttlMs: Infinity }, { waitMs: -1 }, { ttlMs: 0 }]) {
    await assert.rejects(lockd.acquire("ts:bad", options), RangeError, JSON.stringify(options));
  }
  await assert.rejects(lockd.withLock("ts:bad", { ttlMs: 0 }, async () => undefined), RangeError);
  await assert.rejects(lockd.acquirePermit("ts:bad", { limit: 1, ttlMs: 0 }), RangeError);
  // URLs normalise "." and ".." away: no request could name them.
  for (const name of ["", ".", ".."]) {
    await assert.rejects(lockd.acquire(name), RangeError, name);
  }
  for (const options of [{ maxHoldMs: -1 }, { maxHoldMs: 1.5 }, { maxHoldMs: Number.NaN }]) {
    await assert.rejects(lockd.withLock("ts:bad", options, async () => undefined), RangeError, JSON.stringify(options));
  }
  for (const limit of [0, -1, 1.5, Number.NaN, undefined]) {
    await assert.rejects(lockd.acquirePermit("ts:bad", { limit }), RangeError, String(limit));
  }
  for (const options of [{ url: "127.0.0.1:8080" }, { url: "ftp://127.0.0.1" }, { url: "" }, { url: servers.url, apiKey: "a\nb" }]) {
    assert.throws(() => new Lockd(options), TypeError, JSON.stringify(options));
  }
  // An empty key (an unset environment variable's) is no key.
  assert.equal((await new Lockd({ url: servers.url, apiKey: "" }).status("ts:bad")).held, false);
  for (const options of [{ requestTimeoutMs: Number.NaN }, { retryForMs: -1 }]) {
    assert.throws(() => new Lockd({ url: servers.url, ...options }), RangeError, JSON.stringify(options));
  }
  assert.equal(sent, 0);
  // Any other bad name gets lockd's 400.
  for (const name of ["a/b", "x".repeat(300)]) {
    await assert.rejects(lockd.acquire(name), (e) => e.status === 400 && e.type === "urn:lockd:problem:invalid-request");
  }
});

test("withLock stops renewing at maxHoldMs: the lease runs out and the signal says why", async () => {
  const lockd = new Lockd({ url: servers.url });
  await assert.rejects(
    lockd.withLock("ts:max-hold", { ttlMs: 600, maxHoldMs: 700 }, async (_lease, signal) => {
      await aborted(signal);
      assert.match(signal.reason.message, /maxHoldMs/);
    }),
    LeaseLostError,
  );
});

test("the package's version follows lockd's (the repository's Cargo.toml)", async () => {
  const { readFileSync } = await import("node:fs");
  const cargo = readFileSync(path.join(here, "../../Cargo.toml"), "utf8");
  const lockdVersion = /^\[package\][^[]*?^version\s*=\s*"([^"]+)"/ms.exec(cargo)?.[1];
  const pkg = JSON.parse(readFileSync(path.join(here, "package.json"), "utf8"));
  assert.ok(lockdVersion, "Cargo.toml has a [package] version");
  assert.equal(pkg.version, lockdVersion);
});
