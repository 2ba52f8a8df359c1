// Starts a real redis-server and a real lockd on free loopback ports for a
// test file: lockd is $LOCKD_BIN, else the repository's target/debug/lockd
// (scripts/client-tests.sh sets it).
import { before, after } from "node:test";
import { spawn, execFileSync } from "node:child_process";
import { createServer } from "node:net";
import { fileURLToPath } from "node:url";
import path from "node:path";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../..");
const lockdBin =
  process.env.LOCKD_BIN ?? path.join(process.env.CARGO_TARGET_DIR ?? path.join(root, "target"), "debug/lockd");

/** The package's directory (clients/typescript). */
export const here = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

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

/** Polls `check` every 50 ms until it is true; fails after `withinMs`. */
export async function until(what, check, withinMs = 30_000) {
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

/** Waits for `signal` to abort; fails after 30 s (only a hang waits that long). */
export async function aborted(signal) {
  let timer;
  await new Promise((resolve, reject) => {
    if (signal.aborted) resolve();
    signal.addEventListener("abort", resolve, { once: true });
    timer = setTimeout(() => reject(new Error("the signal never aborted")), 30_000);
  });
  clearTimeout(timer);
}

/** The servers of this test file: `servers.url` is lockd's. */
export const servers = { url: "", redisPort: 0 };

/** Runs redis-cli against the test file's redis-server. */
export function redis(...args) {
  return execFileSync("redis-cli", ["-p", String(servers.redisPort), ...args], {
    encoding: "utf8",
    stdio: ["ignore", "pipe", "ignore"],
  }).trim();
}

const children = [];

before(async () => {
  servers.redisPort = await freePort();
  const lockdPort = await freePort();
  children.push(
    spawn("redis-server", ["--bind", "127.0.0.1", "--port", String(servers.redisPort), "--save", "", "--appendonly", "no"], {
      stdio: "ignore",
    }),
  );
  await until("redis-server answering", () => redis("ping") === "PONG");
  children.push(
    spawn(
      lockdBin,
      ["serve", "--listen", `127.0.0.1:${lockdPort}`, "--redis-url", `redis://127.0.0.1:${servers.redisPort}`],
      { stdio: "ignore" },
    ),
  );
  servers.url = `http://127.0.0.1:${lockdPort}`;
  await until("lockd ready", async () => (await fetch(`${servers.url}/readyz`)).ok);
});

after(() => {
  for (const child of children) child.kill();
});
