/**
 * lockd-client: locks, semaphores and runs held in lockd (distributed
 * locks over HTTP, in Redis), on `fetch`, with no runtime dependencies.
 *
 * ```ts
 * const lockd = new Lockd({ url: "http://127.0.0.1:8080" });
 * await lockd.withLock("orders:1", { ttlMs: 30_000 }, async (lease, signal) => {
 *   // work; `signal` aborts when the lease is lost
 * });
 * ```
 *
 * Times are milliseconds (`ttlMs`, `waitMs`); every grant has an
 * unguessable `token` and a `fence` that grows with every grant of the same
 * lock (pass it to your storage so it can refuse a holder whose lease
 * lapsed).
 */

// `await using` on runtimes and TypeScript libs older than explicit
// resource management (Node 18 and 20, `lib: es2022`): the same
// declarations as TypeScript's `esnext.disposable` and `@types/node`.
declare global {
  interface SymbolConstructor {
    readonly asyncDispose: unique symbol;
  }
  interface AsyncDisposable {
    [Symbol.asyncDispose](): PromiseLike<void>;
  }
}

/** `Symbol.asyncDispose`, or the well-known name that polyfills use when
 * the runtime has none. */
const asyncDispose: typeof Symbol.asyncDispose =
  (Symbol as { asyncDispose?: typeof Symbol.asyncDispose }).asyncDispose ??
  (Symbol.for("Symbol.asyncDispose") as typeof Symbol.asyncDispose);

/** How to reach lockd. */
export interface LockdOptions {
  /** lockd's base URL, such as `http://127.0.0.1:8080`. */
  url: string;
  /** An API key's secret, sent as `Authorization: Bearer`; `""` is none. */
  apiKey?: string;
  /** The `fetch` to use (default: the global one). */
  fetch?: typeof fetch;
  /** The server's request time limit (`--request-timeout-ms`, default 10 000 ms):
   * each HTTP call waits this long plus its `waitMs` before giving up. */
  requestTimeoutMs?: number;
  /** How long retries of network errors, 429 and 503 go on, in ms (default 10 000). */
  retryForMs?: number;
}

/** What every lease has: a lock's, a permit's, a run attempt's. */
export interface Held {
  /** The lock's or semaphore's name, or the run's key. */
  readonly name: string;
  /** The holder's token: the proof of holding; never log it. */
  readonly token: string;
  /** The fencing token of this grant. */
  readonly fence: number;
  /** The lease granted, in milliseconds. */
  readonly ttlMs: number;
  /** When the lease ends at the earliest. */
  readonly expiresAt: Date;
}

/** A lock held: what a grant answered. `await using lease = await
 * lockd.acquire(...)` releases it at the end of the scope. */
export interface Lease extends Held, AsyncDisposable {
  /** `exclusive` or `shared`. */
  readonly mode: "exclusive" | "shared";
}

/** A permit of a semaphore held. `await using` releases it. */
export interface Permit extends Held, AsyncDisposable {
  /** The semaphore's limit: how many permits it has. */
  readonly limit: number;
}

/** The attempt of a run that {@link Lockd.once} is running. */
export interface RunAttempt extends Held {
  /** 1 for the run's first attempt, 2 after one was abandoned or ran out, … */
  readonly attempt: number;
}

/** Options of {@link Lockd.acquire}. */
export interface AcquireOptions {
  /** The lease, in milliseconds (default: the server's). */
  ttlMs?: number;
  /** Wait on the server up to this long for a held lock (default 0: fail at once). */
  waitMs?: number;
  /** Your own token (16 to 128 of `[A-Za-z0-9_-]`); default: a fresh one. */
  token?: string;
  /** A label for the holder, shown to others. */
  owner?: string;
  /** `exclusive` (default) or `shared`. */
  mode?: "exclusive" | "shared";
}

/** How long {@link Lockd.withLock}, {@link Lockd.withPermit} and
 * {@link Lockd.once} go on renewing. */
export interface RenewOptions {
  /** Stop renewing after this long, in milliseconds (default: renew until the function ends). */
  maxHoldMs?: number;
}

/** Options of {@link Lockd.withLock}. */
export interface WithLockOptions extends AcquireOptions, RenewOptions {}

/** Options of {@link Lockd.acquirePermit}. */
export interface PermitOptions {
  /** How many holders the semaphore lets in at once (1 to 10 000); every
   * caller of one semaphore gives the same. */
  limit: number;
  /** The permit's lease, in milliseconds (default: the server's). */
  ttlMs?: number;
  /** Wait on the server up to this long for a permit (default 0: fail at once). */
  waitMs?: number;
  /** Your own token; default: a fresh one. */
  token?: string;
  /** A label for the holder, shown to others. */
  owner?: string;
}

/** Options of {@link Lockd.withPermit}. */
export interface WithPermitOptions extends PermitOptions, RenewOptions {}

/** Options of {@link Lockd.once}. */
export interface OnceOptions extends RenewOptions {
  /** The attempt's lease, in milliseconds (default: the server's); renewed
   * every third of it while the function runs. */
  ttlMs?: number;
  /** While another attempt runs, wait up to this long for it to end (default 0). */
  waitMs?: number;
  /** 1 to 128 printable ASCII characters derived from the job's input (a
   * hash of the payload): a start with another fingerprint than the run's
   * first throws {@link FingerprintMismatchError}. */
  fingerprint?: string;
  /** A label for the attempt, shown to others. */
  owner?: string;
  /** How long lockd keeps the result, in milliseconds (default and
   * maximum: the server's `--run-retention-ms`, 24 hours by default). */
  retentionMs?: number;
}

/** Options of {@link Lockd.listLocks} and {@link Lockd.listSemaphores}. */
export interface ListOptions {
  /** Only names that start with this. */
  prefix?: string;
  /** Items a page (1 to 1000; default the server's, 100). */
  pageSize?: number;
}

/** Options of {@link Lockd.watch}. */
export interface WatchOptions {
  /** What is watched: a `lock` (default), a `semaphore` or a `run`. */
  kind?: "lock" | "semaphore" | "run";
  /** Ends the watch (the iterator then ends). Breaking out of the loop does too. */
  signal?: AbortSignal;
}

/** One event of a watch, as lockd sends it: `state` first (after every
 * reconnection too), then `acquired`, `extended`, `released`, `expired`
 * (of a run: `started`, `extended`, `completed`, `abandoned`, `expired`). */
export interface WatchEvent {
  /** The event's kind. */
  readonly event: string;
  /** `FENCE-SEQ`: the fence it is about and its place in the instance's sequence. */
  readonly id: string;
  /** The event's JSON object (never a token). */
  readonly data: Record<string, unknown>;
}

/** One lease of a lock, as `GET` and listing show it (never a token). */
export interface LeaseInfo {
  readonly fence: number;
  readonly ttlMs: number | null;
  readonly expiresAt: Date | null;
  readonly owner: string | null;
  readonly grantedAt: Date | null;
}

/** A lock's state, as `GET /locks/{name}` answers it. A free lock is
 * `{ name, held: false }`. */
export interface LockStatus {
  readonly name: string;
  readonly held: boolean;
  /** The newest holder's fence. */
  readonly fence?: number;
  readonly ttlMs?: number | null;
  readonly expiresAt?: Date | null;
  readonly owner?: string | null;
  readonly grantedAt?: Date | null;
  readonly mode?: "exclusive" | "shared";
  readonly holderCount?: number;
  /** A shared lock's leases (empty when exclusive; absent in listings). */
  readonly holders?: readonly LeaseInfo[];
  /** A writer waits for a shared lock: new readers are refused (absent in listings). */
  readonly writerWaiting?: boolean;
}

/** A semaphore's state, as `GET /semaphores/{name}` answers it. A
 * semaphore with no permit held is `{ name, held: false, holders: 0, permits: [] }`. */
export interface SemaphoreStatus {
  readonly name: string;
  readonly held: boolean;
  readonly limit?: number;
  /** How many permits are held. */
  readonly holders: number;
  readonly permits: readonly LeaseInfo[];
}

/** Pages of a listing: iterate it (`for await (const lock of
 * lockd.listLocks())`) for the items of every page, or `pages()` for the
 * pages themselves. Each page is fetched when the one before is used up. */
export interface Listing<T> extends AsyncIterable<T> {
  pages(): AsyncIterable<T[]>;
}

/** An answer of lockd that is an error: its problem document. */
export class LockdError extends Error {
  /** The HTTP status; 0 when the client itself saw the failure (no
   * answer came, or the lease ran out before a renewal). */
  readonly status: number;
  /** The problem type, such as `urn:lockd:problem:lock-held`; of a failure
   * the client saw itself, `urn:lockd:problem:unreachable` (no answer) or
   * `urn:lockd:problem:lease-lost` (no renewal before the lease's end). */
  readonly type: string;
  /** The request's ID (`x-request-id`): quote it when reporting a problem. */
  readonly requestId: string | undefined;
  constructor(message: string, status: number, type: string, requestId?: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
    this.status = status;
    this.type = type;
    this.requestId = requestId;
  }
}

/** 409 `lock-held`: another holder has the lock. */
export class LockHeldError extends LockdError {
  /** When the lock frees at the latest, in milliseconds. */
  readonly retryAfterMs: number | undefined;
  constructor(message: string, status: number, type: string, requestId?: string, retryAfterMs?: number) {
    super(message, status, type, requestId);
    this.retryAfterMs = retryAfterMs;
  }
}

/** 409 `semaphore-full`: every permit is held; `retryAfterMs` says when the earliest runs out. */
export class SemaphoreFullError extends LockHeldError {}

/** 409 `run-in-progress`: another attempt runs the job; `retryAfterMs` says when its lease ends. */
export class RunInProgressError extends LockHeldError {}

/** 409: the lock (or the run) is held under another token. */
export class NotOwnerError extends LockdError {}

/** The lease was lost: it ran out, or a renewal was refused. */
export class LeaseLostError extends LockdError {}

/** 422: the run was started with another fingerprint: the key is reused for another input. */
export class FingerprintMismatchError extends LockdError {}

/** 503 or 429, or no answer, past the retry deadline. */
export class UnavailableError extends LockdError {}

const PROBLEM = "urn:lockd:problem:";

interface Answer {
  status: number;
  body: Record<string, unknown>;
  headers: Headers;
}

interface Call {
  token?: string;
  body?: Record<string, unknown>;
  waitMs?: number;
  signal?: AbortSignal;
}

/** What {@link Lockd.#keep} saw: the last lease, and the function's value,
 * its error, or the loss of the lease. */
type Kept<L, T> = { lease: L } & ({ ok: true; value: T } | { ok: false; error: unknown } | { ok: "lost"; lost: LockdError });

/** A client of one lockd (or a load balancer in front of several). */
export class Lockd {
  readonly #url: string;
  readonly #apiKey: string | undefined;
  readonly #fetch: typeof fetch;
  readonly #requestTimeoutMs: number;
  readonly #retryForMs: number;

  /** Throws `TypeError` for a `url` that is not `http://` or `https://`,
   * `RangeError` for a time that is not a whole number of milliseconds. */
  constructor(options: LockdOptions) {
    let url: URL;
    try {
      url = new URL(options.url);
    } catch {
      throw new TypeError(`url must be lockd's base URL, such as http://127.0.0.1:8080: got "${options.url}"`);
    }
    if (url.protocol !== "http:" && url.protocol !== "https:") {
      throw new TypeError(`url must be http:// or https://: got "${options.url}"`);
    }
    // "" is no key, as an unset environment variable gives.
    if (options.apiKey && !/^[\x21-\x7e]+$/.test(options.apiKey)) {
      throw new TypeError("apiKey must be visible ASCII characters (a bearer token)");
    }
    checkMs("requestTimeoutMs", options.requestTimeoutMs);
    checkMs("retryForMs", options.retryForMs);
    this.#url = options.url.replace(/\/+$/, "");
    this.#apiKey = options.apiKey;
    this.#fetch = options.fetch ?? globalThis.fetch.bind(globalThis);
    this.#requestTimeoutMs = options.requestTimeoutMs ?? 10_000;
    this.#retryForMs = options.retryForMs ?? 10_000;
  }

  /**
   * Takes the lock `name`. The token is chosen here, so a retry after a
   * lost answer renews the same grant (same fence) rather than being
   * refused. Throws {@link LockHeldError} when another holds it (after
   * `waitMs`), {@link UnavailableError} past the retry deadline.
   */
  async acquire(name: string, options: AcquireOptions = {}): Promise<Lease> {
    checkMs("ttlMs", options.ttlMs, 1);
    checkMs("waitMs", options.waitMs);
    const token = options.token ?? (await newToken());
    const body = fields({ ttl_ms: options.ttlMs, wait_ms: options.waitMs, owner: options.owner, mode: options.mode });
    const answer = await this.#grant(path("locks", name), { token, body, waitMs: options.waitMs ?? 0 }, options.token === undefined);
    return this.#lease(answer.body, token, name);
  }

  /** Resets the lease to `ttlMs` from now (default: its own TTL), and
   * returns the renewed lease (the one given is left as it was). Throws
   * {@link LeaseLostError} when the lease is gone, {@link NotOwnerError}
   * when another token holds the lock. */
  async extend(lease: Lease, options: { ttlMs?: number } = {}, signal?: AbortSignal): Promise<Lease> {
    checkMs("ttlMs", options.ttlMs, 1);
    const body = fields({ ttl_ms: options.ttlMs });
    const answer = await this.#call("PATCH", path("locks", lease.name), { token: lease.token, body, signal });
    return this.#lease({ ...answer.body, mode: lease.mode }, lease.token, lease.name);
  }

  /** Releases the lease (compare-and-delete on its token). A lease that
   * already ran out is no error, nor is one that ran out and was taken by
   * another holder since (whose lease this leaves alone). */
  async release(lease: Lease): Promise<void> {
    await this.#end("DELETE", path("locks", lease.name), lease.token);
  }

  /** The lock's state; a free lock is `{ name, held: false }`. */
  async status(name: string): Promise<LockStatus> {
    const answer = await this.#read(path("locks", name));
    if (!answer) return { name, held: false };
    return {
      ...toLockInfo(answer.body),
      holders: Array.isArray(answer.body.holders) ? answer.body.holders.map((h) => toLeaseInfo(h)) : [],
      writerWaiting: answer.body.writer_waiting === true,
    };
  }

  /**
   * Acquires `name`, runs `fn(lease, signal)`, and releases when it ends or
   * throws, returning its value. Renews every third of the TTL until
   * `maxHoldMs`; `signal` aborts when the lease is lost (a renewal refused,
   * or none succeeded before the lease's end), and then this throws
   * {@link LeaseLostError} once `fn` ends.
   */
  async withLock<T>(name: string, options: WithLockOptions, fn: (lease: Lease, signal: AbortSignal) => Promise<T>): Promise<T> {
    checkMs("maxHoldMs", options.maxHoldMs);
    const lease = await this.acquire(name, options);
    const kept = await this.#keep(lease, options, (l, signal) => this.extend(l, ttl(options), signal), fn);
    return this.#settle(kept, (l) => this.release(l));
  }

  /**
   * Takes a permit of the semaphore `name`, which lets at most `limit`
   * holders in at once. Throws {@link SemaphoreFullError} when every permit
   * is held (after `waitMs`), {@link LockdError} `limit-mismatch` when its
   * permits are held under another limit.
   */
  async acquirePermit(name: string, options: PermitOptions): Promise<Permit> {
    checkMs("ttlMs", options.ttlMs, 1);
    checkMs("waitMs", options.waitMs);
    checkCount("limit", options.limit);
    const token = options.token ?? (await newToken());
    const body = fields({ limit: options.limit, ttl_ms: options.ttlMs, wait_ms: options.waitMs, owner: options.owner });
    const answer = await this.#grant(path("semaphores", name), { token, body, waitMs: options.waitMs ?? 0 }, options.token === undefined);
    return this.#permit(answer.body, token, name);
  }

  /** Resets the permit's lease to `ttlMs` (default: its own TTL); throws
   * {@link LeaseLostError} when the permit is gone. */
  async extendPermit(permit: Permit, options: { ttlMs?: number } = {}, signal?: AbortSignal): Promise<Permit> {
    checkMs("ttlMs", options.ttlMs, 1);
    const body = fields({ ttl_ms: options.ttlMs });
    const answer = await this.#call("PATCH", path("semaphores", permit.name), { token: permit.token, body, signal });
    return this.#permit({ ...answer.body, limit: answer.body.limit ?? permit.limit }, permit.token, permit.name);
  }

  /** Gives the permit back. A permit that already ran out is no error. */
  async releasePermit(permit: Permit): Promise<void> {
    await this.#end("DELETE", path("semaphores", permit.name), permit.token);
  }

  /** The semaphore's state: its limit and the permits held (never a token). */
  async semaphoreStatus(name: string): Promise<SemaphoreStatus> {
    const answer = await this.#read(path("semaphores", name));
    if (!answer) return { name, held: false, holders: 0, permits: [] };
    return toSemaphoreStatus(answer.body);
  }

  /** {@link withLock} for a permit: takes it, renews it while `fn` runs,
   * gives it back at the end; throws {@link LeaseLostError} when it was lost. */
  async withPermit<T>(
    name: string,
    options: WithPermitOptions,
    fn: (permit: Permit, signal: AbortSignal) => Promise<T>,
  ): Promise<T> {
    checkMs("maxHoldMs", options.maxHoldMs);
    const permit = await this.acquirePermit(name, options);
    const kept = await this.#keep(permit, options, (p, signal) => this.extendPermit(p, ttl(options), signal), fn);
    return this.#settle(kept, (p) => this.releasePermit(p));
  }

  /**
   * Runs `fn` once per `key` (a webhook delivery's id, an event's id, a
   * cron slot): the first caller gets an attempt and runs `fn(signal,
   * attempt)`, renewing the attempt's lease while it runs, and stores what
   * it returns (JSON; `undefined` is stored as `null`), which it returns.
   * A later caller gets the stored result without `fn` being called, for
   * as long as lockd keeps it (`retentionMs`).
   *
   * When `fn` throws, the attempt is abandoned (nothing is stored; the
   * next caller runs the job) and the error thrown again. When the
   * attempt's lease is lost, `signal` aborts, nothing is stored and this
   * throws {@link LeaseLostError}: another caller may run the job. Throws
   * {@link RunInProgressError} while another attempt runs (after
   * `waitMs`), {@link FingerprintMismatchError} for another fingerprint.
   * See lockd's docs/runs.md for what a run guarantees.
   */
  async once<T>(key: string, options: OnceOptions, fn: (signal: AbortSignal, attempt: RunAttempt) => Promise<T>): Promise<T> {
    checkMs("ttlMs", options.ttlMs, 1);
    checkMs("waitMs", options.waitMs);
    checkMs("retentionMs", options.retentionMs);
    if (options.retentionMs === 0) throw new RangeError("retentionMs must be 1 ms or more: got 0");
    const token = await newToken();
    const route = path("runs", key);
    const body = fields({ ttl_ms: options.ttlMs, wait_ms: options.waitMs, owner: options.owner, fingerprint: options.fingerprint });
    checkMs("maxHoldMs", options.maxHoldMs);
    const started = await this.#grant(route, { token, body, waitMs: options.waitMs ?? 0 }, true);
    if (started.body.state === "done") return started.body.result as T;
    const attempt = toAttempt(started.body, token, key);
    const kept = await this.#keep(
      attempt,
      options,
      async (a, signal) => {
        const answer = await this.#call("PATCH", route, { token: a.token, body: fields({ ttl_ms: options.ttlMs }), signal });
        return toAttempt({ ...answer.body, attempt: a.attempt }, a.token, key);
      },
      (a, signal) => fn(signal, a),
    );
    if (kept.ok === "lost") throw kept.lost;
    const abandon = () => this.#end("DELETE", route, token).catch(() => undefined);
    if (kept.ok === false) {
      await abandon();
      throw kept.error;
    }
    let result: unknown;
    try {
      // What lockd will keep: `undefined` as null, a Date as its string, ...
      const text = JSON.stringify(kept.value === undefined ? null : kept.value);
      if (text === undefined) throw new TypeError(`${typeof kept.value} is not a JSON value`);
      result = JSON.parse(text);
    } catch (e) {
      await abandon();
      throw new TypeError(`the result of run ${key} cannot be kept (the attempt was abandoned): ${String(e)}`, { cause: e });
    }
    try {
      const stored = await this.#call("PUT", `${route}/result`, { token, body: fields({ result, retention_ms: options.retentionMs }) });
      return ("result" in stored.body ? stored.body.result : result) as T;
    } catch (e) {
      if (e instanceof NotOwnerError || e instanceof LeaseLostError) {
        throw new LeaseLostError(`the attempt at run ${key} was lost before its result was stored: ${e.message}`, e.status, e.type, e.requestId);
      }
      // Refused (too large, a retention over the server's) or unreachable:
      // nothing is kept, and the next caller runs the job at once rather
      // than after the attempt's lease.
      await abandon();
      throw e;
    }
  }

  /** The held locks whose names start with `prefix`, page by page (never a token). */
  listLocks(options: ListOptions = {}): Listing<LockStatus> {
    return this.#listing("locks", options, (item) => toLockInfo(item));
  }

  /** The semaphores with at least one permit held, page by page. */
  listSemaphores(options: ListOptions = {}): Listing<SemaphoreStatus> {
    return this.#listing("semaphores", options, (item) => toSemaphoreStatus(item));
  }

  /**
   * Watches a lock (or a semaphore, or a run: `kind`): an async iterator
   * of its events, `state` first. When the stream ends or breaks (lockd
   * restarting, a load balancer's timeout), it reconnects, with backoff,
   * and goes on with a fresh `state` (events in the gap are not replayed:
   * the `state` says where things stand). It ends when `signal` aborts or
   * the loop is left; an answer that is not a stream (400, 401, 403, 501)
   * throws.
   */
  async *watch(name: string, options: WatchOptions = {}): AsyncGenerator<WatchEvent, void, undefined> {
    const route = `${path(`${options.kind ?? "lock"}s`, name)}/events`;
    const stop = new AbortController();
    const abort = () => stop.abort();
    options.signal?.addEventListener("abort", abort, { once: true });
    if (options.signal?.aborted) stop.abort();
    let pauseMs = 100;
    try {
      while (!stop.signal.aborted) {
        let response: Response | undefined;
        try {
          response = await this.#fetch(`${this.#url}${route}`, {
            headers: { ...this.#auth(), accept: "text/event-stream" },
            signal: stop.signal,
          });
        } catch {
          // No answer: try again after the pause.
        }
        if (response && !response.ok) {
          const answer = await toAnswer(response);
          if (answer.status !== 429 && answer.status !== 503) throw toError(answer);
          pauseMs = retryAfterMs(answer);
        } else if (response?.body) {
          try {
            for await (const event of readEvents(response.body)) {
              pauseMs = 100;
              yield event;
            }
          } catch {
            // The stream broke: reconnect.
          }
        }
        if (stop.signal.aborted) return;
        await sleep(pauseMs * (0.5 + Math.random()), stop.signal);
        pauseMs = Math.min(pauseMs * 2, 5_000);
      }
    } finally {
      options.signal?.removeEventListener("abort", abort);
      stop.abort();
    }
  }

  /** Runs `fn` while renewing `first` every third of its TTL until
   * `maxHoldMs`; the signal given to `fn` aborts when the lease is lost. */
  async #keep<L extends Held, T>(
    first: L,
    options: RenewOptions,
    renewIt: (lease: L, signal: AbortSignal) => Promise<L>,
    fn: (lease: L, signal: AbortSignal) => Promise<T>,
  ): Promise<Kept<L, T>> {
    let lease = first;
    const name = first.name;
    const lost = new AbortController();
    const started = Date.now();
    let lostWhy: LockdError | undefined;
    const loseIt = (why: LockdError) => {
      if (!lost.signal.aborted) {
        lostWhy = why;
        lost.abort(why);
      }
    };
    const pastMaxHold = () => options.maxHoldMs !== undefined && Date.now() - started >= options.maxHoldMs;
    // Ends the renewals, and a renewal in flight, once fn is done.
    const finished = new AbortController();
    let timer: ReturnType<typeof setTimeout> | undefined;
    let deadline: ReturnType<typeof setTimeout> | undefined;
    const watchEnd = () => {
      clearTimeout(deadline);
      const left = lease.expiresAt.getTime() - Date.now();
      deadline = setTimeout(() => {
        const why = pastMaxHold()
          ? `the lease of ${name} ran out: renewals stop at maxHoldMs (${options.maxHoldMs} ms)`
          : `the lease of ${name} ran out before a renewal`;
        loseIt(new LeaseLostError(why, 0, `${PROBLEM}lease-lost`));
      }, Math.max(0, left));
    };
    const renew = () => {
      timer = setTimeout(async () => {
        if (pastMaxHold()) return;
        try {
          const renewed = await renewIt(lease, finished.signal);
          if (finished.signal.aborted) return;
          lease = renewed;
          watchEnd();
          if (!lost.signal.aborted) renew();
        } catch (e) {
          if (finished.signal.aborted) return;
          if (e instanceof LeaseLostError || e instanceof NotOwnerError) {
            loseIt(new LeaseLostError(`the lease of ${name} was lost: ${e.message}`, e.status, e.type, e.requestId));
          } else if (!lost.signal.aborted) {
            renew(); // unavailable for now: try again; the deadline says when it is too late
          }
        }
      }, Math.max(1, Math.floor(lease.ttlMs / 3)));
    };
    watchEnd();
    renew();
    try {
      const value = await fn(lease, lost.signal);
      return lostWhy ? { lease, ok: "lost", lost: lostWhy } : { lease, ok: true, value };
    } catch (error) {
      return lostWhy && error === lostWhy ? { lease, ok: "lost", lost: lostWhy } : { lease, ok: false, error };
    } finally {
      finished.abort();
      clearTimeout(timer);
      clearTimeout(deadline);
    }
  }

  /** Ends what {@link #keep} kept: gives the lease back unless it was lost,
   * then returns the value or throws. */
  async #settle<L, T>(kept: Kept<L, T>, giveBack: (lease: L) => Promise<void>): Promise<T> {
    if (kept.ok === "lost") throw kept.lost;
    await giveBack(kept.lease).catch(() => undefined);
    if (kept.ok === false) throw kept.error;
    return kept.value;
  }

  /** A compare-and-delete: a lease already gone, or held by another
   * token since, is no error. */
  async #end(method: string, route: string, token: string): Promise<void> {
    try {
      await this.#call(method, route, { token });
    } catch (e) {
      if (e instanceof LeaseLostError || e instanceof NotOwnerError) return;
      throw e;
    }
  }

  /** A `POST` that grants a lease under `request.token`. When it ends
   * unanswered (lockd or Redis unreachable past the retry deadline), the
   * request may yet have been granted, and would hold the lease to its TTL:
   * one release with the same token is tried then (when `ours`: the token
   * was made for this call, so it held nothing before). */
  async #grant(route: string, request: Call, ours: boolean): Promise<Answer> {
    try {
      return await this.#call("POST", route, request);
    } catch (e) {
      if (ours && e instanceof UnavailableError && request.token) {
        await this.#once("DELETE", route, { token: request.token }).catch(() => undefined);
      }
      throw e;
    }
  }

  /** A `GET`; `undefined` when lockd answers that nothing is held. */
  async #read(route: string): Promise<Answer | undefined> {
    try {
      return await this.#call("GET", route, {});
    } catch (e) {
      if (e instanceof LeaseLostError) return undefined;
      throw e;
    }
  }

  #listing<T>(kind: "locks" | "semaphores", options: ListOptions, item: (body: Record<string, unknown>) => T): Listing<T> {
    const client = this;
    async function* pages(): AsyncGenerator<T[], void, undefined> {
      let cursor: string | undefined;
      do {
        const query = new URLSearchParams();
        if (options.prefix !== undefined) query.set("prefix", options.prefix);
        if (options.pageSize !== undefined) query.set("limit", String(options.pageSize));
        if (cursor !== undefined) query.set("cursor", cursor);
        const text = query.toString();
        const { body } = await client.#call("GET", `/${kind}${text ? `?${text}` : ""}`, {});
        const items = Array.isArray(body[kind]) ? (body[kind] as Record<string, unknown>[]) : [];
        yield items.map(item);
        cursor = typeof body.next_cursor === "string" ? body.next_cursor : undefined;
      } while (cursor !== undefined);
    }
    return {
      pages,
      async *[Symbol.asyncIterator]() {
        for await (const page of pages()) yield* page;
      },
    };
  }

  #lease(body: Record<string, unknown>, token: string, name: string): Lease {
    const held = toHeld(body, token, name);
    const mode: Lease["mode"] = body.mode === "shared" ? "shared" : "exclusive";
    return disposable<Lease>(Object.assign(held, { mode }), (l) => this.release(l));
  }

  #permit(body: Record<string, unknown>, token: string, name: string): Permit {
    return disposable<Permit>(Object.assign(toHeld(body, token, name), { limit: Number(body.limit) }), (p) =>
      this.releasePermit(p),
    );
  }

  #auth(): Record<string, string> {
    return this.#apiKey ? { authorization: `Bearer ${this.#apiKey}` } : {};
  }

  async #call(method: string, route: string, request: Call): Promise<Answer> {
    const until = Date.now() + this.#retryForMs;
    for (let attempt = 0; ; attempt++) {
      let answer: Answer | undefined;
      let failure: unknown;
      try {
        answer = await this.#once(method, route, request);
      } catch (e) {
        failure = e;
      }
      if (answer && answer.status < 400) return answer;
      const retryable = !answer || answer.status === 429 || answer.status === 503;
      const pause = answer ? retryAfterMs(answer) : Math.min(100 * 2 ** attempt, 2_000);
      const jittered = pause * (0.5 + Math.random());
      if (retryable && !request.signal?.aborted && Date.now() + jittered < until) {
        await sleep(jittered, request.signal);
        continue;
      }
      if (!answer) {
        throw new UnavailableError(`no answer from lockd: ${String(failure)}`, 0, `${PROBLEM}unreachable`, undefined, {
          cause: failure,
        });
      }
      throw toError(answer);
    }
  }

  async #once(method: string, route: string, request: Call): Promise<Answer> {
    const headers: Record<string, string> = this.#auth();
    if (request.token) headers["lock-token"] = request.token;
    let body: string | undefined;
    if (request.body && Object.keys(request.body).length > 0) {
      headers["content-type"] = "application/json";
      body = JSON.stringify(request.body);
    }
    // Longer than the server takes: a shorter timeout would give up on a
    // grant the server then makes.
    const stop = new AbortController();
    const timer = setTimeout(() => stop.abort(), (request.waitMs ?? 0) + this.#requestTimeoutMs + 2_000);
    const cancel = () => stop.abort();
    request.signal?.addEventListener("abort", cancel, { once: true });
    try {
      const response = await this.#fetch(`${this.#url}${route}`, { method, headers, body, signal: stop.signal });
      return await toAnswer(response);
    } finally {
      clearTimeout(timer);
      request.signal?.removeEventListener("abort", cancel);
    }
  }
}

/** Waits `ms`, or less when `signal` aborts first. */
function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(done, ms);
    function done() {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });
}

/** Refuses a duration that lockd would refuse (under `least` ms: 1 for a
 * TTL, 0 for the others), or that is not a number at all (`NaN` would
 * otherwise be left out, and the server's default used). */
function checkMs(option: string, ms: number | undefined, least = 0): void {
  if (ms !== undefined && !(typeof ms === "number" && Number.isSafeInteger(ms) && ms >= least)) {
    throw new RangeError(`${option} must be a whole number of milliseconds, ${least} or more: got ${ms}`);
  }
}

/** Refuses a count (a semaphore's limit) that is not a whole number, 1 or more. */
function checkCount(option: string, n: number): void {
  if (!(Number.isSafeInteger(n) && n >= 1)) {
    throw new RangeError(`${option} must be a whole number, 1 or more: got ${n}`);
  }
}

/** The fields of a request body that are given. */
function fields(all: Record<string, unknown>): Record<string, unknown> {
  return Object.fromEntries(Object.entries(all).filter(([, v]) => v !== undefined));
}

function ttl(options: { ttlMs?: number }): { ttlMs?: number } {
  return options.ttlMs === undefined ? {} : { ttlMs: options.ttlMs };
}

async function toAnswer(response: Response): Promise<Answer> {
  const text = await response.text();
  let body: Record<string, unknown> = {};
  if (text) {
    try {
      body = JSON.parse(text) as Record<string, unknown>;
    } catch {
      body = { detail: text };
    }
  }
  return { status: response.status, body, headers: response.headers };
}

function retryAfterMs(answer: Answer): number {
  const ms = answer.body.retry_after_ms;
  if (typeof ms === "number") return Math.max(50, ms);
  const seconds = Number(answer.headers.get("retry-after"));
  return Number.isFinite(seconds) && seconds > 0 ? seconds * 1000 : 1_000;
}

function toError(answer: Answer): LockdError {
  const type = typeof answer.body.type === "string" ? answer.body.type : `${PROBLEM}unknown`;
  const detail = typeof answer.body.detail === "string" ? answer.body.detail : `HTTP ${answer.status}`;
  const requestId = answer.headers.get("x-request-id") ?? undefined;
  const slug = type.startsWith(PROBLEM) ? type.slice(PROBLEM.length) : type;
  const ms = typeof answer.body.retry_after_ms === "number" ? answer.body.retry_after_ms : undefined;
  switch (slug) {
    case "lock-held":
      return new LockHeldError(detail, answer.status, type, requestId, ms);
    case "semaphore-full":
      return new SemaphoreFullError(detail, answer.status, type, requestId, ms);
    case "run-in-progress":
      return new RunInProgressError(detail, answer.status, type, requestId, ms);
    case "not-lock-owner":
    case "not-run-owner":
      return new NotOwnerError(detail, answer.status, type, requestId);
    case "lock-not-held":
    case "permit-not-held":
    case "semaphore-free":
    case "run-not-found":
      return new LeaseLostError(detail, answer.status, type, requestId);
    case "fingerprint-mismatch":
      return new FingerprintMismatchError(detail, answer.status, type, requestId);
    default:
      if (answer.status === 503 || answer.status === 429) {
        return new UnavailableError(detail, answer.status, type, requestId);
      }
      return new LockdError(detail, answer.status, type, requestId);
  }
}

function date(value: unknown): Date | null {
  return typeof value === "string" ? new Date(value) : null;
}

/** The lease's fields; its token is not enumerable, so that logging the
 * lease (`console.log`, `JSON.stringify`) does not show it. */
function toHeld(body: Record<string, unknown>, token: string, name: string): Held {
  const held = {
    name: typeof body.name === "string" ? body.name : name,
    fence: Number(body.fence),
    ttlMs: Number(body.ttl_ms),
    expiresAt: new Date(String(body.expires_at)),
  };
  return Object.defineProperty(held, "token", { value: token, enumerable: false }) as Held;
}

function toAttempt(body: Record<string, unknown>, token: string, key: string): RunAttempt {
  return Object.assign(toHeld(body, token, key), { attempt: Number(body.attempt) });
}

/** Gives `held` a non-enumerable `[Symbol.asyncDispose]` that releases it. */
function disposable<L extends Held>(held: Omit<L, typeof Symbol.asyncDispose>, release: (l: L) => Promise<void>): L {
  const lease = held as L;
  // Never throws: a release that fails leaves the lease to run out by
  // itself, as withLock does (an error here would hide the block's own).
  Object.defineProperty(lease, asyncDispose, { value: () => release(lease).catch(() => undefined), enumerable: false });
  return lease;
}

function toLeaseInfo(value: unknown): LeaseInfo {
  const body = (value ?? {}) as Record<string, unknown>;
  return {
    fence: Number(body.fence),
    ttlMs: typeof body.ttl_ms === "number" ? body.ttl_ms : null,
    expiresAt: date(body.expires_at),
    owner: typeof body.owner === "string" ? body.owner : null,
    grantedAt: date(body.granted_at),
  };
}

function toLockInfo(body: Record<string, unknown>): LockStatus {
  return {
    name: String(body.name),
    held: true,
    ...toLeaseInfo(body),
    mode: body.mode === "shared" ? "shared" : "exclusive",
    holderCount: typeof body.holder_count === "number" ? body.holder_count : 1,
  };
}

function toSemaphoreStatus(body: Record<string, unknown>): SemaphoreStatus {
  const permits = Array.isArray(body.permits) ? body.permits.map((p) => toLeaseInfo(p)) : [];
  return {
    name: String(body.name),
    held: permits.length > 0,
    limit: typeof body.limit === "number" ? body.limit : undefined,
    holders: typeof body.holders === "number" ? body.holders : permits.length,
    permits,
  };
}

/** Parses a Server-Sent Events stream (the WHATWG rules lockd's streams
 * need: `event`, `id` and `data` fields, comment lines, CRLF or LF). */
async function* readEvents(stream: ReadableStream<Uint8Array>): AsyncGenerator<WatchEvent, void, undefined> {
  const reader = stream.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let event = "message";
  let id = "";
  let data: string[] = [];
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let end: number;
      while ((end = buffer.search(/\r\n|\r|\n/)) >= 0) {
        const line = buffer.slice(0, end);
        buffer = buffer.slice(end + (buffer.startsWith("\r\n", end) ? 2 : 1));
        if (line === "") {
          if (data.length > 0) {
            const text = data.join("\n");
            let parsed: Record<string, unknown>;
            try {
              parsed = JSON.parse(text) as Record<string, unknown>;
            } catch {
              parsed = { text };
            }
            yield { event, id, data: parsed };
          }
          event = "message";
          data = [];
          continue;
        }
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let rest = colon < 0 ? "" : line.slice(colon + 1);
        if (rest.startsWith(" ")) rest = rest.slice(1);
        if (field === "event") event = rest;
        else if (field === "id") id = rest;
        else if (field === "data") data.push(rest);
      }
    }
  } finally {
    await reader.cancel().catch(() => undefined);
  }
}

/** The path of `name` under `/kind`. An empty name, `.` and `..` are
 * refused here: URLs normalise the last two away (escaped or not), so no
 * request could name them. lockd judges every other name (a 400 for a bad one). */
function path(kind: string, name: string): string {
  if (name === "" || name === "." || name === "..") {
    throw new RangeError(`a name is 1 to 200 characters, and not "." or "..": got "${name}"`);
  }
  return `/${kind}/${encodeURIComponent(name)}`;
}

/** A fresh token: 32 characters of URL-safe base64 from 24 random bytes
 * of the runtime's Web Crypto (`node:crypto`'s on Node 18, which has no
 * global `crypto` without a flag). */
async function newToken(): Promise<string> {
  const bytes = new Uint8Array(24);
  const crypto = globalThis.crypto ?? (await nodeCrypto());
  crypto.getRandomValues(bytes);
  let text = "";
  for (const b of bytes) text += String.fromCharCode(b);
  return btoa(text).replace(/\+/g, "-").replace(/\//g, "_");
}

async function nodeCrypto(): Promise<Crypto> {
  // A specifier in a variable: bundlers for browsers leave it alone.
  const name = "node:crypto";
  const module = (await import(name)) as { webcrypto: Crypto };
  return module.webcrypto;
}
