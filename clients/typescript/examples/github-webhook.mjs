// A GitHub webhook handler that runs its job once per delivery: GitHub
// names each delivery in `X-GitHub-Delivery`, and a delivery sent again (by
// hand from the settings page, or after a timeout) has the same id. The
// first call runs the job and lockd keeps its result; every later call for
// that delivery answers the result without running the job. The payload's
// SHA-256 is the run's fingerprint, so another payload under a reused id is
// refused (422) rather than answered with the first one's result.
//
// The handler is a Web `fetch` handler, `(Request) => Promise<Response>`:
// mount it in any framework that speaks those (Hono, itty-router, Deno,
// Bun), or adapt it to Express. Check the delivery's `X-Hub-Signature-256`
// before this in production.
import { Lockd, RunInProgressError, FingerprintMismatchError } from "lockd-client";

/**
 * `job(event, payload, signal)` does the work and returns what to keep (JSON);
 * `signal` aborts when the attempt's lease is lost (another delivery may then
 * run it).
 */
export function githubWebhook({ lockd, job }) {
  return async (request) => {
    const delivery = request.headers.get("x-github-delivery");
    const event = request.headers.get("x-github-event") ?? "unknown";
    if (!delivery) return new Response("no X-GitHub-Delivery header\n", { status: 400 });
    const payload = await request.text();
    const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(payload));
    const fingerprint = `sha256:${[...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("")}`;
    try {
      const result = await lockd.once(`github:${delivery}`, { ttlMs: 60_000, fingerprint }, (signal) =>
        job(event, JSON.parse(payload), signal),
      );
      return Response.json(result);
    } catch (e) {
      if (e instanceof RunInProgressError) {
        // Another handler runs this delivery now: ask GitHub to come back.
        const seconds = Math.ceil((e.retryAfterMs ?? 1_000) / 1_000);
        return new Response("this delivery is being handled\n", { status: 503, headers: { "retry-after": String(seconds) } });
      }
      if (e instanceof FingerprintMismatchError) {
        return new Response("this delivery id came with another payload before\n", { status: 422 });
      }
      throw e; // the job failed: nothing was kept, and a redelivery runs it again
    }
  };
}

// Run as a script (`node github-webhook.mjs`), it serves the handler on
// PORT (default 3000), with a job that logs the push.
if (import.meta.url === `file://${process.argv[1]}`) {
  const { createServer } = await import("node:http");
  const lockd = new Lockd({ url: process.env.LOCKD_URL ?? "http://127.0.0.1:8080", apiKey: process.env.LOCKD_API_KEY });
  const handle = githubWebhook({
    lockd,
    job: async (event, payload) => {
      console.log(`${event}: ${payload.ref ?? ""} ${payload.after ?? ""}`);
      return { handled: event };
    },
  });
  createServer(async (req, res) => {
    const chunks = [];
    for await (const chunk of req) chunks.push(chunk);
    const answer = await handle(
      new Request(`http://localhost${req.url}`, { method: req.method, headers: req.headers, body: Buffer.concat(chunks) }),
    ).catch(() => new Response("the job failed\n", { status: 500 }));
    res.writeHead(answer.status, Object.fromEntries(answer.headers));
    res.end(await answer.text());
  }).listen(Number(process.env.PORT ?? 3000));
}
