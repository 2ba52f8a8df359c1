// A Cloudflare Workers-style fetch handler (the module syntax: `export
// default { fetch }`) that lets one request at a time rebuild a tenant's
// cache. `await using` releases the lease when the block ends, however it
// ends (TypeScript 5.2 or later; runtimes without `Symbol.asyncDispose`
// work too, through TypeScript's helper).
import { Lockd, LockHeldError } from "lockd-client";

export interface Env {
  LOCKD_URL: string;
  LOCKD_API_KEY?: string;
}

export default {
  async fetch(request: Request, env: Env): Promise<Response> {
    const tenant = new URL(request.url).searchParams.get("tenant");
    if (!tenant) return new Response("?tenant= is required\n", { status: 400 });
    const lockd = new Lockd({ url: env.LOCKD_URL, apiKey: env.LOCKD_API_KEY });
    try {
      await using lease = await lockd.acquire(`rebuild:${tenant}`, { ttlMs: 10_000 });
      // ... rebuild, giving lease.fence to the storage written ...
      return Response.json({ tenant, fence: lease.fence });
    } catch (e) {
      if (e instanceof LockHeldError) {
        const seconds = Math.ceil((e.retryAfterMs ?? 1_000) / 1_000);
        return new Response("a rebuild runs already\n", { status: 409, headers: { "retry-after": String(seconds) } });
      }
      throw e;
    }
  },
};
