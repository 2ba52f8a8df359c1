/**
 * lockd-client: locks held in lockd (distributed locks over HTTP, in Redis),
 * on `fetch`, with no runtime dependencies.
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

/** How to reach lockd. */
export interface LockdOptions {
  /** lockd's base URL, such as `http://127.0.0.1:8080`. */
  url: string;
  /** An API key's secret, sent as `Authorization: Bearer`. */
  apiKey?: string;
  /** The `fetch` to use (default: the global one). */
  fetch?: typeof fetch;
  /** The server's request time limit (`--request-timeout-ms`, default 10 000 ms):
   * each HTTP call waits this long plus its `waitMs` before giving up. */
  requestTimeoutMs?: number;
  /** How long retries of network errors, 429 and 503 go on, in ms (default 10 000). */
  retryForMs?: number;
}

/** A lock held: what a grant answered. */
export interface Lease {
  /** The lock's name. */
  readonly name: string;
  /** The holder's token: the proof of holding; never log it. */
  readonly token: string;
  /** The fencing token of this grant. */
  readonly fence: number;
  /** The lease granted, in milliseconds. */
  readonly ttlMs: number;
  /** When the lease ends at the earliest. */
  readonly expiresAt: Date;
  /** `exclusive` or `shared`. */
  readonly mode: "exclusive" | "shared";
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

/** Options of {@link Lockd.withLock}. */
export interface WithLockOptions extends AcquireOptions {
  /** Stop renewing after this long, in milliseconds (default: renew until the function ends). */
  maxHoldMs?: number;
}

/** A lock's state, as `GET /locks/{name}` answers it. */
export interface LockStatus {
  readonly name: string;
  readonly held: boolean;
  readonly fence?: number;
  readonly ttlMs?: number | null;
  readonly expiresAt?: Date | null;
  readonly owner?: string | null;
  readonly mode?: "exclusive" | "shared";
  readonly holderCount?: number;
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

/** 409: another holder has the lock. */
export class LockHeldError extends LockdError {
  /** When the lock frees at the latest, in milliseconds. */
  readonly retryAfterMs: number | undefined;
  constructor(message: string, status: number, type: string, requestId?: string, retryAfterMs?: number) {
    super(message, status, type, requestId);
    this.retryAfterMs = retryAfterMs;
  }
}

/** 409: the lock is held under another token. */
export class NotOwnerError extends LockdError {}

/** The lease was lost: it ran out, or a renewal was refused. */
export class LeaseLostError extends LockdError {}

/** 503 or 429, or no answer, past the retry deadline. */
export class UnavailableError extends LockdError {}

const PROBLEM = "urn:lockd:problem:";

interface Answer {
  status: number;
  body: Record<string, unknown>;
  headers: Headers;
}

/** A client of one lockd (or a load balancer in front of several). */
export class Lockd {
  readonly #url: string;
  readonly #apiKey: string | undefined;
  readonly #fetch: typeof fetch;
  readonly #requestTimeoutMs: number;
  readonly #retryForMs: number;

  constructor(options: LockdOptions) {
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
    checkMs("ttlMs", options.ttlMs);
    checkMs("waitMs", options.waitMs);
    const token = options.token ?? newToken();
    const body: Record<string, unknown> = {};
    if (options.ttlMs !== undefined) body.ttl_ms = options.ttlMs;
    if (options.waitMs !== undefined) body.wait_ms = options.waitMs;
    if (options.owner !== undefined) body.owner = options.owner;
    if (options.mode !== undefined) body.mode = options.mode;
    const answer = await this.#call("POST", lockPath(name), {
      token,
      body,
      waitMs: options.waitMs ?? 0,
    });
    return toLease(answer.body, token);
  }

  /** Resets the lease to `ttlMs` from now (default: its own TTL), and
   * returns the renewed lease (the one given is left as it was). Throws
   * {@link LeaseLostError} when the lease is gone, {@link NotOwnerError}
   * when another token holds the lock. */
  async extend(lease: Lease, options: { ttlMs?: number } = {}, signal?: AbortSignal): Promise<Lease> {
    checkMs("ttlMs", options.ttlMs);
    const body = options.ttlMs === undefined ? undefined : { ttl_ms: options.ttlMs };
    const answer = await this.#call("PATCH", lockPath(lease.name), { token: lease.token, body, signal });
    return { ...toLease({ ...answer.body, mode: lease.mode }, lease.token) };
  }

  /** Releases the lease (compare-and-delete on its token). A lease that
   * already ran out is released all the same (no error). */
  async release(lease: Lease): Promise<void> {
    try {
      await this.#call("DELETE", lockPath(lease.name), { token: lease.token });
    } catch (e) {
      if (e instanceof LeaseLostError) return;
      throw e;
    }
  }

  /** The lock's state. */
  async status(name: string): Promise<LockStatus> {
    try {
      const { body } = await this.#call("GET", lockPath(name), {});
      return {
        name: String(body.name),
        held: true,
        fence: Number(body.fence),
        ttlMs: body.ttl_ms === null ? null : Number(body.ttl_ms),
        expiresAt: typeof body.expires_at === "string" ? new Date(body.expires_at) : null,
        owner: (body.owner as string | null | undefined) ?? null,
        mode: body.mode as "exclusive" | "shared",
        holderCount: body.holder_count === undefined ? 1 : Number(body.holder_count),
      };
    } catch (e) {
      if (e instanceof LeaseLostError) return { name, held: false };
      throw e;
    }
  }

  /**
   * Acquires `name`, runs `fn(lease, signal)`, and releases when it ends or
   * throws, returning its value. Renews every third of the TTL until
   * `maxHoldMs`; `signal` aborts when the lease is lost (a renewal refused,
   * or none succeeded before the lease's end), and then this throws
   * {@link LeaseLostError} once `fn` ends.
   */
  async withLock<T>(
    name: string,
    options: WithLockOptions,
    fn: (lease: Lease, signal: AbortSignal) => Promise<T>,
  ): Promise<T> {
    let lease = await this.acquire(name, options);
    const lost = new AbortController();
    const started = Date.now();
    let lostWhy: LockdError | undefined;
    const loseIt = (why: LockdError) => {
      if (!lost.signal.aborted) {
        lostWhy = why;
        lost.abort(why);
      }
    };
    // Ends the renewals, and a renewal in flight, once fn is done.
    const finished = new AbortController();
    let timer: ReturnType<typeof setTimeout> | undefined;
    let deadline: ReturnType<typeof setTimeout> | undefined;
    const watchEnd = () => {
      clearTimeout(deadline);
      const left = lease.expiresAt.getTime() - Date.now();
      deadline = setTimeout(() => {
        const held = options.maxHoldMs !== undefined && Date.now() - started >= options.maxHoldMs;
        const why = held
          ? `the lease of ${name} ran out: renewals stop at maxHoldMs (${options.maxHoldMs} ms)`
          : `the lease of ${name} ran out before a renewal`;
        loseIt(new LeaseLostError(why, 0, `${PROBLEM}lease-lost`));
      }, Math.max(0, left));
    };
    const renew = () => {
      timer = setTimeout(async () => {
        if (options.maxHoldMs !== undefined && Date.now() - started >= options.maxHoldMs) return;
        try {
          const renewed = await this.extend(
            lease,
            options.ttlMs === undefined ? {} : { ttlMs: options.ttlMs },
            finished.signal,
          );
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
      if (lostWhy) throw lostWhy;
      return value;
    } finally {
      finished.abort();
      clearTimeout(timer);
      clearTimeout(deadline);
      if (!lostWhy) await this.release(lease).catch(() => undefined);
    }
  }

  async #call(
    method: string,
    path: string,
    request: { token?: string; body?: Record<string, unknown>; waitMs?: number; signal?: AbortSignal },
  ): Promise<Answer> {
    const until = Date.now() + this.#retryForMs;
    for (let attempt = 0; ; attempt++) {
      let answer: Answer | undefined;
      let failure: unknown;
      try {
        answer = await this.#once(method, path, request);
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

  async #once(
    method: string,
    path: string,
    request: { token?: string; body?: Record<string, unknown>; waitMs?: number; signal?: AbortSignal },
  ): Promise<Answer> {
    const headers: Record<string, string> = {};
    if (this.#apiKey) headers.authorization = `Bearer ${this.#apiKey}`;
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
    let response: Response;
    let text: string;
    try {
      response = await this.#fetch(`${this.#url}${path}`, { method, headers, body, signal: stop.signal });
      text = await response.text();
    } finally {
      clearTimeout(timer);
      request.signal?.removeEventListener("abort", cancel);
    }
    let parsed: Record<string, unknown> = {};
    if (text) {
      try {
        parsed = JSON.parse(text) as Record<string, unknown>;
      } catch {
        parsed = { detail: text };
      }
    }
    return { status: response.status, body: parsed, headers: response.headers };
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

/** Refuses a duration that lockd would refuse, or that is not a number at
 * all (`NaN` would otherwise be left out, and the server's default used). */
function checkMs(option: string, ms: number | undefined): void {
  if (ms !== undefined && !(Number.isSafeInteger(ms) && ms >= 0)) {
    throw new RangeError(`${option} must be a whole number of milliseconds, 0 or more: got ${ms}`);
  }
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
  switch (slug) {
    case "lock-held": {
      const ms = answer.body.retry_after_ms;
      return new LockHeldError(detail, answer.status, type, requestId, typeof ms === "number" ? ms : undefined);
    }
    case "not-lock-owner":
      return new NotOwnerError(detail, answer.status, type, requestId);
    case "lock-not-held":
      return new LeaseLostError(detail, answer.status, type, requestId);
    default:
      if (answer.status === 503 || answer.status === 429) {
        return new UnavailableError(detail, answer.status, type, requestId);
      }
      return new LockdError(detail, answer.status, type, requestId);
  }
}

function toLease(body: Record<string, unknown>, token: string): Lease {
  return {
    name: String(body.name),
    token,
    fence: Number(body.fence),
    ttlMs: Number(body.ttl_ms),
    expiresAt: new Date(String(body.expires_at)),
    mode: body.mode === "shared" ? "shared" : "exclusive",
  };
}

/** The path of lock `name`. An empty name, `.` and `..` are refused
 * here: URLs normalise the last two away (escaped or not), so no request
 * could name them. lockd judges every other name (a 400 for a bad one). */
function lockPath(name: string): string {
  if (name === "" || name === "." || name === "..") {
    throw new RangeError(`a lock name is 1 to 200 characters, and not "." or "..": got "${name}"`);
  }
  return `/locks/${encodeURIComponent(name)}`;
}

/** A fresh token: 32 characters of URL-safe base64 from 24 random bytes. */
function newToken(): string {
  const bytes = new Uint8Array(24);
  globalThis.crypto.getRandomValues(bytes);
  let text = "";
  for (const b of bytes) text += String.fromCharCode(b);
  return btoa(text).replace(/\+/g, "-").replace(/\//g, "_");
}
