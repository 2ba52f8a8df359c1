// The examples in examples/, run against a real lockd on a real
// redis-server (test/support.mjs): the GitHub webhook handler deduplicated
// with once, the Lambda-style handler, and the Workers-style fetch handler
// (examples/worker.ts, compiled by `npm test` into build/examples). The cron
// script runs in client.test.mjs, from the package `npm pack` makes.
import { test } from "node:test";
import assert from "node:assert/strict";

import { Lockd } from "../dist/index.js";
import { servers, until } from "./support.mjs";

function delivery(id, payload) {
  return new Request("http://localhost/webhook", {
    method: "POST",
    headers: { "x-github-delivery": id, "x-github-event": "push", "content-type": "application/json" },
    body: JSON.stringify(payload),
  });
}

test("the GitHub webhook handler runs the job once per delivery", async () => {
  const { githubWebhook } = await import("../examples/github-webhook.mjs");
  const lockd = new Lockd({ url: servers.url });
  const ran = [];
  const handle = githubWebhook({
    lockd,
    job: async (event, payload) => {
      ran.push(payload.after);
      return { deployed: payload.after, event };
    },
  });
  const id = `d-${Date.now()}`;
  const first = await handle(delivery(id, { after: "abc123" }));
  assert.equal(first.status, 200);
  assert.deepEqual(await first.json(), { deployed: "abc123", event: "push" });
  // GitHub sends it again: the stored result, and no second run.
  const again = await handle(delivery(id, { after: "abc123" }));
  assert.equal(again.status, 200);
  assert.deepEqual(await again.json(), { deployed: "abc123", event: "push" });
  assert.deepEqual(ran, ["abc123"]);
  // The same id with another payload is refused.
  assert.equal((await handle(delivery(id, { after: "other" }))).status, 422);
  // No delivery id: 400.
  assert.equal((await handle(new Request("http://localhost/webhook", { method: "POST", body: "{}" }))).status, 400);
});

test("the GitHub webhook handler answers 503 with Retry-After while another handler runs the delivery, and a failed job runs again", async () => {
  const { githubWebhook } = await import("../examples/github-webhook.mjs");
  const lockd = new Lockd({ url: servers.url });
  let finish;
  let fail = true;
  const handle = githubWebhook({
    lockd,
    job: (_event, payload) => {
      if (payload.slow) return new Promise((resolve) => (finish = resolve));
      if (fail) throw new Error("deploy failed");
      return Promise.resolve({ ok: true });
    },
  });
  const slow = handle(delivery("slow-1", { slow: true }));
  await until("the first handler runs", () => finish !== undefined);
  const busy = await handle(delivery("slow-1", { slow: true }));
  assert.equal(busy.status, 503);
  assert.ok(Number(busy.headers.get("retry-after")) >= 1);
  finish({ ok: "slow" });
  assert.equal((await slow).status, 200);
  // A job that throws keeps nothing: the redelivery runs it.
  await assert.rejects(handle(delivery("fails-1", {})), /deploy failed/);
  fail = false;
  assert.deepEqual(await (await handle(delivery("fails-1", {}))).json(), { ok: true });
});

test("the Lambda-style handler takes the lock for the function's remaining time", async () => {
  process.env.LOCKD_URL = servers.url;
  const { handler } = await import("../examples/lambda.mjs");
  const context = { awsRequestId: "req-1", getRemainingTimeInMillis: () => 3_000 };
  const answer = await handler({ accountId: "42" }, context);
  assert.equal(answer.statusCode, 200);
  assert.ok(JSON.parse(answer.body).fence > 0);
  // The lease is the remaining time (less the clock drift lockd allows for).
  const { leaseMs } = JSON.parse(answer.body);
  assert.ok(leaseMs <= 3_000 && leaseMs > 2_500, String(leaseMs));
  // While another invocation holds the account: 409, and how long to wait
  // is at most that invocation's remaining time.
  const lockd = new Lockd({ url: servers.url });
  const lease = await lockd.acquire("account:42", { ttlMs: 3_000 });
  const busy = await handler({ accountId: "42" }, context);
  assert.equal(busy.statusCode, 409);
  assert.ok(JSON.parse(busy.body).retryAfterMs <= 3_000);
  await lockd.release(lease);
  assert.equal((await handler({ accountId: "42" }, context)).statusCode, 200);
  assert.equal((await lockd.status("account:42")).held, false, "the handler released the lock");
});

test("the Workers-style fetch handler releases its lease with await using", async () => {
  const { default: worker } = await import("../build/examples/worker.js");
  const env = { LOCKD_URL: servers.url };
  const answer = await worker.fetch(new Request("http://worker/rebuild?tenant=t1"), env);
  assert.equal(answer.status, 200);
  assert.ok((await answer.json()).fence > 0);
  const lockd = new Lockd({ url: servers.url });
  assert.equal((await lockd.status("rebuild:t1")).held, false, "await using released the lease");
  const lease = await lockd.acquire("rebuild:t1", { ttlMs: 10_000 });
  const busy = await worker.fetch(new Request("http://worker/rebuild?tenant=t1"), env);
  assert.equal(busy.status, 409);
  assert.ok(Number(busy.headers.get("retry-after")) >= 1);
  await lockd.release(lease);
  assert.equal((await worker.fetch(new Request("http://worker/rebuild"), env)).status, 400);
});
