// Test support: a real `context-assembly serve` process, free ports, a loopback contributor.

import { spawn, type ChildProcess } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type RequestListener, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

/** clients/typescript (the tests run from dist/test/). */
export const PACKAGE_DIR = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
/** The service's entry point in the repository's virtualenv (override: CONTEXT_ASSEMBLY_BIN). */
export const SERVICE_BIN = process.env.CONTEXT_ASSEMBLY_BIN ?? resolve(PACKAGE_DIR, "../../.venv/bin/context-assembly");

/** Serve `listener` on an ephemeral loopback port. */
export async function listen(listener: RequestListener): Promise<{ server: Server; url: string; port: number }> {
  const server = createServer(listener);
  await new Promise<void>((ok, fail) => {
    server.once("error", fail);
    server.listen(0, "127.0.0.1", () => ok());
  });
  const { port } = server.address() as AddressInfo;
  return { server, url: `http://127.0.0.1:${port}`, port };
}

export async function close(server: Server): Promise<void> {
  server.closeAllConnections();
  await new Promise<void>((ok) => server.close(() => ok()));
}

export async function freePort(): Promise<number> {
  const { server, port } = await listen(() => undefined);
  await close(server);
  return port;
}

export interface ContributorEndpoint {
  url: string;
  secret: string;
  failurePolicy?: "fail" | "omit";
}

export interface ServiceOptions {
  /** Turns on `[auth] mode = "api_key"` with this one key; without it there are no keys (loopback). */
  apiKey?: string;
  /** Registered contributor endpoints, by name. */
  contributors?: Record<string, ContributorEndpoint>;
}

export interface RunningService {
  baseUrl: string;
  stop(): Promise<void>;
  stderr(): string;
}

function toml(value: string): string {
  return JSON.stringify(value); // a JSON string is a valid TOML basic string
}

/** The service's TOML config: the SQLite store in `folder`, the key and the contributors given. */
function configText(folder: string, options: ServiceOptions): string {
  const lines = ["[server]", 'log_level = "warning"', "drain_seconds = 0", ""];
  if (options.apiKey !== undefined) {
    const keySha = createHash("sha256").update(options.apiKey).digest("hex");
    lines.push("[auth]", 'mode = "api_key"', "[[auth.keys]]", 'tenant = "ts-client-tests"', `key_sha256 = ${toml(keySha)}`, "");
  }
  lines.push("[store]", `path = ${toml(join(folder, "preparations.db"))}`, "");
  for (const [name, endpoint] of Object.entries(options.contributors ?? {})) {
    lines.push(`[contributors.${name}]`, `url = ${toml(endpoint.url)}`, `secret = ${toml(endpoint.secret)}`);
    if (endpoint.failurePolicy !== undefined) lines.push(`failure_policy = ${toml(endpoint.failurePolicy)}`);
    lines.push("");
  }
  return lines.join("\n");
}

/**
 * Start `context-assembly serve` on a free port with a temporary TOML config (SQLite store in a
 * temporary folder, the API key and contributor endpoints given), and wait for `/healthz`.
 */
export async function startService(options: ServiceOptions = {}): Promise<RunningService> {
  if (!existsSync(SERVICE_BIN)) {
    throw new Error(
      `${SERVICE_BIN} not found: install the service into the repository's .venv first ` +
        "(or point CONTEXT_ASSEMBLY_BIN at a context-assembly executable)",
    );
  }
  const folder = mkdtempSync(join(tmpdir(), "ca-ts-client-"));
  const config = join(folder, "service.toml");
  writeFileSync(config, configText(folder, options));
  const port = await freePort();
  const child: ChildProcess = spawn(SERVICE_BIN, ["serve", "--host", "127.0.0.1", "--port", String(port), "--config", config], {
    cwd: folder,
    stdio: ["ignore", "ignore", "pipe"],
    env: { ...process.env, PYTHONUNBUFFERED: "1" },
  });
  let log = "";
  child.stderr?.setEncoding("utf8");
  child.stderr?.on("data", (chunk: string) => {
    log = (log + chunk).slice(-20_000);
  });
  const exited = new Promise<void>((ok) => child.once("exit", () => ok()));
  const baseUrl = `http://127.0.0.1:${port}`;

  const stop = async (): Promise<void> => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill("SIGTERM");
      const timer = setTimeout(() => child.kill("SIGKILL"), 5_000);
      await exited;
      clearTimeout(timer);
    }
    rmSync(folder, { recursive: true, force: true });
  };

  // Bounded readiness polling: give up loudly after 30 s, or as soon as the process exits.
  const deadline = Date.now() + 30_000;
  for (;;) {
    if (child.exitCode !== null || child.signalCode !== null) {
      await stop();
      throw new Error(`the service exited (${child.exitCode ?? child.signalCode}) before it was ready:\n${log}`);
    }
    try {
      const response = await fetch(`${baseUrl}/healthz`, { signal: AbortSignal.timeout(1_000) });
      if (response.ok) break;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) {
      await stop();
      throw new Error(`the service did not answer /healthz within 30 s:\n${log}`);
    }
    await new Promise((ok) => setTimeout(ok, 50));
  }
  return { baseUrl, stop, stderr: () => log };
}
