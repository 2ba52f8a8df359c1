// A cron script that must not run twice at once: every host runs it from
// cron, and the one that takes the lock does the work; the others exit.
// LOCKD_URL (default http://127.0.0.1:8080) and LOCKD_API_KEY configure it.
import { Lockd, LockHeldError } from "lockd-client";

const lockd = new Lockd({ url: process.env.LOCKD_URL ?? "http://127.0.0.1:8080", apiKey: process.env.LOCKD_API_KEY });

try {
  const report = await lockd.withLock("cron:nightly-report", { ttlMs: 30_000, owner: "cron" }, async (lease, signal) => {
    // Pass lease.fence to the storage you write, so that it can refuse a
    // writer whose lease lapsed; stop when `signal` aborts.
    if (signal.aborted) throw signal.reason;
    return `report written under fence ${lease.fence}`;
  });
  console.log(report);
} catch (e) {
  if (e instanceof LockHeldError) {
    console.log(`another host runs it; free in at most ${e.retryAfterMs} ms`);
  } else {
    throw e;
  }
}
