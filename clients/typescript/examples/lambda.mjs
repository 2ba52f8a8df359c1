// An AWS Lambda handler (the same shape fits Google Cloud Functions and
// Azure Functions) that must not work on one account twice at once. The
// lease is the function's remaining time: if the platform kills the
// function at its timeout, the lock frees itself then, and not a default
// TTL later; renewals stop there too (`maxHoldMs`).
import { Lockd, LockHeldError } from "lockd-client";

const lockd = new Lockd({ url: process.env.LOCKD_URL ?? "http://127.0.0.1:8080", apiKey: process.env.LOCKD_API_KEY });

/** `event.accountId` names the account; `context.getRemainingTimeInMillis()` is Lambda's. */
export async function handler(event, context) {
  const remainingMs = context.getRemainingTimeInMillis();
  try {
    return await lockd.withLock(
      `account:${event.accountId}`,
      { ttlMs: remainingMs, maxHoldMs: remainingMs, owner: context.awsRequestId },
      async (lease, signal) => {
        // Pass lease.fence to the database write, so that it refuses a
        // writer whose lease lapsed; stop when `signal` aborts.
        if (signal.aborted) throw signal.reason;
        return { statusCode: 200, body: JSON.stringify({ account: event.accountId, fence: lease.fence, leaseMs: lease.ttlMs }) };
      },
    );
  } catch (e) {
    if (e instanceof LockHeldError) {
      // Another invocation works on this account: let the queue redeliver.
      return { statusCode: 409, body: JSON.stringify({ retryAfterMs: e.retryAfterMs }) };
    }
    throw e;
  }
}
