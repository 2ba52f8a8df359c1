// Semaphores, runs, listing, watches, disposal and a lock's full state,
// against a real lockd on a real redis-server (test/support.mjs).
import { test } from "node:test";
import assert from "node:assert/strict";

import {
  Lockd,
  LeaseLostError,
  SemaphoreFullError,
  LockHeldError,
  RunInProgressError,
  FingerprintMismatchError,
} from "../dist/index.js";
import { servers, redis, aborted, until } from "./support.mjs";

const client = () => new Lockd({ url: servers.url });

/** Deletes every Redis key of a name (the lock, or the run, and its fence and metadata). */
function wipe(name) {
  for (const key of redis("--scan", "--pattern", `*${name}*`).split("\n").filter(Boolean)) redis("DEL", key);
}

test("a semaphore lets limit holders in; the next is a SemaphoreFullError; withPermit gives back", async () => {
  const lockd = client();
  const first = await lockd.acquirePermit("ts:sem", { limit: 2, ttlMs: 20_000, owner: "a" });
  const second = await lockd.acquirePermit("ts:sem", { limit: 2, ttlMs: 20_000 });
  assert.equal(first.limit, 2);
  assert.ok(second.fence > first.fence);
  await assert.rejects(lockd.acquirePermit("ts:sem", { limit: 2 }), (e) => {
    assert.ok(e instanceof SemaphoreFullError && e instanceof LockHeldError, String(e));
    assert.ok(e.retryAfterMs > 0 && e.retryAfterMs <= 20_000, String(e.retryAfterMs));
    return true;
  });
  const status = await lockd.semaphoreStatus("ts:sem");
  assert.equal(status.held, true);
  assert.equal(status.limit, 2);
  assert.equal(status.holders, 2);
  assert.deepEqual(status.permits.map((p) => p.fence).sort(), [first.fence, second.fence].sort());
  const extended = await lockd.extendPermit(first, { ttlMs: 30_000 });
  assert.equal(extended.fence, first.fence);
  assert.ok(extended.ttlMs > 20_000);
  await lockd.releasePermit(second);
  const value = await lockd.withPermit("ts:sem", { limit: 2, ttlMs: 600 }, async (permit, signal) => {
    // Outlive the TTL: only renewals keep the permit.
    const end = Date.now() + 1_300;
    while (Date.now() < end) {
      await new Promise((r) => setTimeout(r, 100));
      assert.equal(signal.aborted, false);
    }
    return permit.fence;
  });
  assert.ok(value > second.fence);
  await lockd.releasePermit(extended);
  assert.deepEqual(await lockd.semaphoreStatus("ts:sem"), { name: "ts:sem", held: false, holders: 0, permits: [] });
  // Releasing a permit that is gone is no error.
  await lockd.releasePermit(extended);
});

test("once runs the function, and a replay answers the stored result without calling it", async () => {
  const lockd = client();
  let calls = 0;
  const job = async (signal, attempt) => {
    calls += 1;
    assert.equal(signal.aborted, false);
    assert.equal(attempt.attempt, 1);
    return { deployed: "v1", fence: attempt.fence };
  };
  const first = await lockd.once("ts:run", { ttlMs: 10_000, fingerprint: "sha256:aa" }, job);
  const again = await lockd.once("ts:run", { ttlMs: 10_000, fingerprint: "sha256:aa" }, job);
  assert.equal(calls, 1);
  assert.deepEqual(again, first);
  await assert.rejects(lockd.once("ts:run", { fingerprint: "sha256:bb" }, job), FingerprintMismatchError);
  assert.equal(calls, 1);
});

test("once: a function that throws abandons the attempt, and the next caller runs it", async () => {
  const lockd = client();
  await assert.rejects(
    lockd.once("ts:run-fails", {}, async () => {
      throw new Error("the job failed");
    }),
    /the job failed/,
  );
  const second = await lockd.once("ts:run-fails", {}, async (_signal, attempt) => attempt.attempt);
  assert.equal(second, 2);
  // The first caller gets what lockd kept, as every later one does: an
  // undefined result is null, a Date its string.
  assert.equal(await lockd.once("ts:run-void", {}, async () => undefined), null);
  assert.equal(await lockd.once("ts:run-void", {}, async () => "not called"), null);
  const at = new Date("2026-12-04T00:00:00.000Z");
  assert.deepEqual(await lockd.once("ts:run-date", {}, async () => ({ at })), { at: at.toISOString() });
  assert.deepEqual(await lockd.once("ts:run-date", {}, async () => "not called"), { at: at.toISOString() });
});

test("once: a result lockd cannot keep abandons the attempt, so the next caller runs the job at once", async () => {
  const lockd = client();
  for (const retentionMs of [0, -1, 1.5]) {
    await assert.rejects(lockd.once("ts:run-retention", { retentionMs }, async () => "not run"), RangeError);
  }
  await assert.rejects(
    lockd.once("ts:run-bigint", { ttlMs: 60_000 }, async () => 10n),
    (e) => e instanceof TypeError && /cannot be kept/.test(e.message),
  );
  assert.equal(await lockd.once("ts:run-bigint", {}, async (_s, attempt) => attempt.attempt), 2);
  // Over --max-result-bytes (64 KiB by default): lockd's 413, and abandoned.
  await assert.rejects(lockd.once("ts:run-big", { ttlMs: 60_000 }, async () => "x".repeat(100_000)), (e) => e.status === 413);
  assert.equal(await lockd.once("ts:run-big", {}, async (_s, attempt) => attempt.attempt), 2);
});

test("once: another attempt running is a RunInProgressError; waitMs waits for its result", async () => {
  const lockd = client();
  let finish;
  const running = lockd.once("ts:run-busy", { ttlMs: 20_000 }, () => new Promise((resolve) => (finish = resolve)));
  await until("the first attempt started", () => finish !== undefined);
  await assert.rejects(lockd.once("ts:run-busy", {}, async () => "second"), (e) => {
    assert.ok(e instanceof RunInProgressError, String(e));
    assert.ok(e.retryAfterMs > 0);
    return true;
  });
  const waiting = lockd.once("ts:run-busy", { waitMs: 30_000 }, async () => "not called");
  finish("first");
  assert.equal(await running, "first");
  assert.equal(await waiting, "first");
});

test("once: an attempt lost mid-work aborts the signal, stores nothing, and throws LeaseLostError", async () => {
  const lockd = client();
  await assert.rejects(
    lockd.once("ts:run-lost", { ttlMs: 900 }, async (signal) => {
      wipe("ts:run-lost");
      await aborted(signal);
      assert.ok(signal.reason instanceof LeaseLostError);
      return "done";
    }),
    LeaseLostError,
  );
  // Nothing was kept: the next caller runs the job.
  assert.equal(await lockd.once("ts:run-lost", {}, async () => "ran again"), "ran again");
});

test("listLocks goes through every page; pages() gives the pages", async () => {
  const lockd = client();
  const leases = [];
  for (let i = 0; i < 5; i++) leases.push(await lockd.acquire(`ts:list:${i}`, { ttlMs: 20_000, owner: `o${i}` }));
  await lockd.acquire("ts:other", { ttlMs: 20_000 });
  const names = [];
  for await (const lock of lockd.listLocks({ prefix: "ts:list:", pageSize: 2 })) {
    assert.equal(lock.held, true);
    assert.ok(lock.grantedAt instanceof Date);
    names.push(lock.name);
  }
  assert.deepEqual(names.sort(), ["ts:list:0", "ts:list:1", "ts:list:2", "ts:list:3", "ts:list:4"]);
  let pages = 0;
  for await (const page of lockd.listLocks({ prefix: "ts:list:", pageSize: 2 }).pages()) {
    assert.ok(page.length <= 2);
    pages += 1;
  }
  assert.ok(pages >= 3, String(pages));
  const semaphores = [];
  await lockd.acquirePermit("ts:list-sem", { limit: 3, ttlMs: 20_000 });
  for await (const s of lockd.listSemaphores({ prefix: "ts:list-sem" })) semaphores.push(s);
  assert.equal(semaphores.length, 1);
  assert.equal(semaphores[0].limit, 3);
  for (const lease of leases) await lockd.release(lease);
});

test("status gives grantedAt, a shared lock's holders and writerWaiting", async () => {
  const lockd = client();
  const a = await lockd.acquire("ts:shared", { mode: "shared", ttlMs: 20_000, owner: "reader-a" });
  const b = await lockd.acquire("ts:shared", { mode: "shared", ttlMs: 20_000 });
  const status = await lockd.status("ts:shared");
  assert.equal(status.mode, "shared");
  assert.equal(status.holderCount, 2);
  assert.equal(status.holders.length, 2);
  assert.ok(status.grantedAt instanceof Date);
  assert.equal(status.writerWaiting, false);
  const writer = lockd.acquire("ts:shared", { waitMs: 30_000, ttlMs: 5_000 });
  await until("the writer waits", async () => (await lockd.status("ts:shared")).writerWaiting === true);
  await lockd.release(a);
  await lockd.release(b);
  await lockd.release(await writer);
});

test("a lease's token is not shown when the lease is logged", async () => {
  const { inspect } = await import("node:util");
  const lockd = client();
  const lease = await lockd.acquire("ts:log", { ttlMs: 20_000 });
  assert.equal(typeof lease.token, "string");
  assert.equal(JSON.stringify(lease).includes(lease.token), false);
  assert.equal(inspect(lease).includes(lease.token), false);
  const renewed = await lockd.extend(lease);
  assert.equal(renewed.token, lease.token);
  assert.equal(JSON.stringify(renewed).includes(lease.token), false);
  await lockd.release(renewed);
});

test("a lease disposes of itself: Symbol.asyncDispose releases it, and never throws", async () => {
  const lockd = client();
  const lease = await lockd.acquire("ts:dispose", { ttlMs: 20_000 });
  assert.equal(Object.keys(lease).includes(String(Symbol.asyncDispose)), false);
  await lease[Symbol.asyncDispose]();
  assert.equal((await lockd.status("ts:dispose")).held, false);
  const permit = await lockd.acquirePermit("ts:dispose-sem", { limit: 1 });
  await permit[Symbol.asyncDispose]();
  assert.equal((await lockd.semaphoreStatus("ts:dispose-sem")).held, false);
  // lockd unreachable at the end of the block: the disposal gives up
  // quietly (the lease runs out by itself), not hiding the block's error.
  const down = new Lockd({ url: servers.url, retryForMs: 200, fetch: async (input, init) => {
    if (init?.method === "DELETE") throw new TypeError("fetch failed: connection refused");
    return fetch(input, init);
  } });
  const stranded = await down.acquire("ts:dispose-down", { ttlMs: 20_000 });
  await stranded[Symbol.asyncDispose]();
  await lockd.release(stranded);
});

test("watch yields state first, then the changes; it reconnects when the stream ends", async () => {
  let streams = 0;
  // The first stream is cut short by the server (wait_ms), as a restart or
  // a proxy's timeout would: the watch must reconnect by itself.
  const cutting = (input, init) => {
    const url = String(input);
    if (url.endsWith("/events") && streams++ === 0) return fetch(`${url}?wait_ms=300`, init);
    return fetch(input, init);
  };
  const lockd = new Lockd({ url: servers.url, fetch: cutting });
  const stop = new AbortController();
  const seen = [];
  const watching = (async () => {
    for await (const event of lockd.watch("ts:watch", { signal: stop.signal })) {
      seen.push(event);
      if (event.event === "released") break;
    }
  })();
  await until("the first state", () => seen.length >= 1);
  assert.equal(seen[0].event, "state");
  assert.equal(seen[0].data.held, false);
  await until("a second stream", () => streams >= 2 && seen.filter((e) => e.event === "state").length >= 2);
  const lease = await lockd.acquire("ts:watch", { ttlMs: 20_000 });
  await until("acquired", () => seen.some((e) => e.event === "acquired"));
  await lockd.release(lease);
  await watching;
  const acquired = seen.find((e) => e.event === "acquired");
  assert.equal(acquired.data.fence, lease.fence);
  assert.match(acquired.id, new RegExp(`^${lease.fence}-\\d+$`));
  assert.equal(JSON.stringify(seen).includes(lease.token), false, "a watch never shows a token");
  // An aborted signal ends a watch.
  const ended = new AbortController();
  const events = [];
  for await (const event of lockd.watch("ts:watch", { signal: ended.signal })) {
    events.push(event);
    ended.abort();
  }
  assert.equal(events.length, 1);
  stop.abort();
});

test("watching a run, and a watch that lockd refuses throws", async () => {
  const lockd = client();
  const stop = new AbortController();
  const seen = [];
  const watching = (async () => {
    for await (const event of lockd.watch("ts:watch-run", { kind: "run", signal: stop.signal })) {
      seen.push(event.event);
      if (event.event === "completed") return;
    }
  })();
  await until("the state", () => seen.length >= 1);
  await lockd.once("ts:watch-run", {}, async () => "ok");
  await watching;
  assert.deepEqual(seen, ["state", "started", "completed"]);
  await assert.rejects(async () => {
    for await (const _ of lockd.watch("a b")) break;
  }, (e) => e.status === 400);
});
