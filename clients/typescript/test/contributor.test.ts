// createContributorHandler on node:http: signatures, replay window, deadline, dispatch, errors.

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import type { Server } from "node:http";
import { after, before, describe, test } from "node:test";

import {
  createContributorHandler,
  decodeSecret,
  signWebhook,
  type ContributorHandlerOptions,
} from "../src/index.js";
import { close, listen } from "./support.js";

const SECRET = `whsec_${randomBytes(32).toString("base64")}`;
const OTHER_SECRET = `whsec_${randomBytes(32).toString("base64")}`;

const CONTRIBUTE = {
  type: "contribute",
  preparation_id: "prep_test",
  source: "memory",
  model: "gpt-4o-mini",
  input: [{ role: "user", content: "hi" }],
  data_budget_tokens: 1000,
  source_token_limit: null,
  scope: { account_id: "a" },
  deadline_unix_ms: Date.now() + 10_000,
};
const REVISION = { type: "revision", source: "memory", scope: { account_id: "a" } };

const servers: Server[] = [];

async function serve(options: ContributorHandlerOptions): Promise<string> {
  const { server, url } = await listen(createContributorHandler(options));
  servers.push(server);
  return url;
}

after(async () => {
  await Promise.all(servers.map(close));
});

interface PostOptions {
  secret?: string | string[] | null;
  timestamp?: number;
  id?: string;
  headers?: Record<string, string>;
  signature?: string;
}

async function post(url: string, packet: unknown, options: PostOptions = {}): Promise<{ status: number; body: unknown; contentType: string | null }> {
  const body = typeof packet === "string" ? packet : JSON.stringify(packet);
  const headers: Record<string, string> = { "content-type": "application/json", ...options.headers };
  const secret = options.secret === undefined ? SECRET : options.secret;
  if (secret !== null) {
    const id = options.id ?? "msg_test";
    const timestamp = options.timestamp ?? Math.floor(Date.now() / 1000);
    headers["webhook-id"] = id;
    headers["webhook-timestamp"] = String(timestamp);
    headers["webhook-signature"] = options.signature ?? signWebhook(secret, id, timestamp, body);
  }
  const response = await fetch(url, { method: "POST", headers, body, signal: AbortSignal.timeout(5_000) });
  const text = await response.text();
  return { status: response.status, body: text === "" ? null : JSON.parse(text), contentType: response.headers.get("content-type") };
}

const blocks = [{ id: "units", text: "metric" }];

describe("signature verification", () => {
  let url: string;
  const calls: unknown[] = [];

  before(async () => {
    url = await serve({
      secret: SECRET,
      contribute(packet) {
        calls.push(packet);
        return { revision: 7, blocks };
      },
    });
  });

  test("a correctly signed packet is answered as JSON", async () => {
    const answer = await post(url, CONTRIBUTE);
    assert.equal(answer.status, 200);
    assert.equal(answer.contentType, "application/json");
    assert.deepEqual(answer.body, { revision: 7, blocks });
    assert.equal((calls.at(-1) as { preparation_id: string }).preparation_id, "prep_test");
  });

  test("missing signature headers are 401", async () => {
    const count = calls.length;
    const answer = await post(url, CONTRIBUTE, { secret: null });
    assert.equal(answer.status, 401);
    assert.equal(answer.contentType, "application/json");
    assert.equal(calls.length, count, "the function is not called");
  });

  test("a forged signature is 401", async () => {
    assert.equal((await post(url, CONTRIBUTE, { secret: OTHER_SECRET })).status, 401);
    assert.equal((await post(url, CONTRIBUTE, { signature: "v1,AAAA" })).status, 401);
    assert.equal((await post(url, CONTRIBUTE, { signature: "" })).status, 401);
    // A signature over another body, id or version prefix does not verify.
    const ts = Math.floor(Date.now() / 1000);
    const other = signWebhook(SECRET, "msg_test", ts, JSON.stringify({ ...CONTRIBUTE, source: "x" }));
    assert.equal((await post(url, CONTRIBUTE, { timestamp: ts, signature: other })).status, 401);
    const good = signWebhook(SECRET, "msg_test", ts, JSON.stringify(CONTRIBUTE));
    assert.equal((await post(url, CONTRIBUTE, { timestamp: ts, signature: good.replace("v1,", "v2,") })).status, 401);
    assert.equal((await post(url, CONTRIBUTE, { timestamp: ts, id: "msg_other", signature: good })).status, 401);
  });

  test("a stale or future timestamp is 401 (replay window)", async () => {
    const now = Math.floor(Date.now() / 1000);
    assert.equal((await post(url, CONTRIBUTE, { timestamp: now - 600 })).status, 401);
    assert.equal((await post(url, CONTRIBUTE, { timestamp: now + 600 })).status, 401);
    assert.equal((await post(url, CONTRIBUTE, { timestamp: now - 200 })).status, 200);
    const bad = await post(url, CONTRIBUTE, { headers: {}, id: "m", signature: "v1,x", timestamp: Number.NaN });
    assert.equal(bad.status, 401);
  });

  test("one valid signature among several is enough", async () => {
    const ts = Math.floor(Date.now() / 1000);
    const body = JSON.stringify(CONTRIBUTE);
    const signature = `${signWebhook(OTHER_SECRET, "msg_test", ts, body)} ${signWebhook(SECRET, "msg_test", ts, body)}`;
    assert.equal((await post(url, CONTRIBUTE, { timestamp: ts, signature })).status, 200);
  });

  test("several secrets during a rotation", async () => {
    const rotating = await serve({ secret: [OTHER_SECRET, SECRET], contribute: () => ({ revision: "r", blocks: [] }) });
    assert.equal((await post(rotating, CONTRIBUTE, { secret: SECRET })).status, 200);
    assert.equal((await post(rotating, CONTRIBUTE, { secret: OTHER_SECRET })).status, 200);
    assert.equal((await post(rotating, CONTRIBUTE, { secret: `whsec_${randomBytes(32).toString("base64")}` })).status, 401);
  });

  test("a malformed secret is refused when the handler is created", () => {
    assert.throws(() => createContributorHandler({ secret: "whsec_not base64!", contribute: () => ({ revision: 1 }) }), TypeError);
    assert.equal(decodeSecret(SECRET).length, 32);
  });
});

describe("deadline", () => {
  test("a slow contribute is aborted at X-Contributor-Timeout-Ms and answered 504", async () => {
    let aborted: unknown = null;
    let abortedAfterMs = -1;
    const url = await serve({
      secret: SECRET,
      contribute(_packet, { signal }) {
        const started = Date.now();
        return new Promise((_resolve, reject) => {
          const timer = setTimeout(() => _resolve({ revision: "late", blocks: [] }), 5_000);
          signal.addEventListener("abort", () => {
            clearTimeout(timer);
            aborted = signal.reason;
            abortedAfterMs = Date.now() - started;
            reject(signal.reason);
          });
        });
      },
      onError: () => undefined,
    });
    const started = Date.now();
    const answer = await post(url, CONTRIBUTE, { headers: { "X-Contributor-Timeout-Ms": "150" } });
    const elapsed = Date.now() - started;
    assert.equal(answer.status, 504);
    assert.equal(answer.contentType, "application/json");
    assert.ok(elapsed >= 140 && elapsed < 2_000, `answered after ${elapsed} ms`);
    assert.ok(aborted instanceof DOMException && aborted.name === "TimeoutError", String(aborted));
    assert.ok(abortedAfterMs >= 100 && abortedAfterMs < 2_000, `aborted after ${abortedAfterMs} ms`);
  });

  test("a function that ignores the signal is still answered 504 at the deadline", async () => {
    const url = await serve({
      contribute: () => new Promise((resolve) => setTimeout(() => resolve({ revision: 1, blocks: [] }), 1_000)),
    });
    const started = Date.now();
    const answer = await post(url, CONTRIBUTE, { secret: null, headers: { "X-Contributor-Timeout-Ms": "100" } });
    assert.equal(answer.status, 504);
    assert.ok(Date.now() - started < 900);
  });

  test("the context carries the deadline; a fast answer within it is 200", async () => {
    let deadline: number | null = null;
    const url = await serve({
      contribute(_packet, ctx) {
        deadline = ctx.deadline;
        return { revision: 1, blocks };
      },
    });
    const before = Date.now();
    const answer = await post(url, CONTRIBUTE, { secret: null, headers: { "X-Contributor-Timeout-Ms": "2000" } });
    assert.equal(answer.status, 200);
    assert.ok(deadline !== null && deadline >= before + 1_900 && deadline <= Date.now() + 2_000);
  });

  test("no time left: 504 without calling the function", async () => {
    let called = false;
    const url = await serve({
      contribute: () => {
        called = true;
        return { revision: 1, blocks };
      },
    });
    assert.equal((await post(url, CONTRIBUTE, { secret: null, headers: { "X-Contributor-Timeout-Ms": "0" } })).status, 504);
    assert.equal(called, false);
  });

  test("the signal aborts when the caller hangs up", async () => {
    let resolveReason: (reason: unknown) => void = () => undefined;
    const reason = new Promise<unknown>((resolve) => {
      resolveReason = resolve;
    });
    const url = await serve({
      contribute: (_packet, { signal }) =>
        new Promise((_resolve, reject) => {
          signal.addEventListener("abort", () => {
            resolveReason(signal.reason);
            reject(signal.reason);
          });
        }),
      onError: () => assert.fail("an abort is not a function failure"),
    });
    await assert.rejects(
      fetch(url, { method: "POST", body: JSON.stringify(CONTRIBUTE), signal: AbortSignal.timeout(100) }),
      (error: unknown) => error instanceof DOMException && error.name === "TimeoutError",
    );
    const got = await Promise.race([reason, new Promise((resolve) => setTimeout(() => resolve("no abort"), 3_000))]);
    assert.ok(got instanceof DOMException && got.name === "AbortError", String(got));
  });

  test("a non-integer timeout header is 400", async () => {
    const url = await serve({ contribute: () => ({ revision: 1, blocks }) });
    assert.equal((await post(url, CONTRIBUTE, { secret: null, headers: { "X-Contributor-Timeout-Ms": "soon" } })).status, 400);
  });
});

describe("dispatch and answers", () => {
  test("revision packets use revision(), or fall back to contribute's revision", async () => {
    const withRevision = await serve({
      contribute: () => assert.fail("contribute must not be called for a revision packet"),
      revision: (packet) => `rev-of-${packet.source}`,
    });
    assert.deepEqual((await post(withRevision, REVISION, { secret: null })).body, { revision: "rev-of-memory" });

    const objectRevision = await serve({ contribute: () => ({ revision: 0 }), revision: () => ({ revision: 42 }) });
    assert.deepEqual((await post(objectRevision, REVISION, { secret: null })).body, { revision: 42 });

    let check: string | null = null;
    const fallback = await serve({
      contribute(packet, ctx) {
        check = ctx.check;
        assert.equal(packet.source, "memory");
        return { revision: 9, blocks };
      },
    });
    assert.deepEqual((await post(fallback, REVISION, { secret: null })).body, { revision: 9 });
    assert.equal(check, "revision");
  });

  test("bad JSON, an unknown type and a malformed packet are 400", async () => {
    const url = await serve({ secret: SECRET, contribute: () => ({ revision: 1, blocks }) });
    assert.equal((await post(url, "{not json")).status, 400);
    assert.equal((await post(url, { ...CONTRIBUTE, type: "delete" })).status, 400);
    assert.equal((await post(url, [1, 2])).status, 400);
    assert.equal((await post(url, { ...CONTRIBUTE, source: 5 })).status, 400);
    assert.equal((await post(url, { ...CONTRIBUTE, data_budget_tokens: "lots" })).status, 400);
  });

  test("a throwing function or a malformed answer is 500 and reported", async () => {
    const errors: unknown[] = [];
    const throwing = await serve({
      contribute: () => {
        throw new Error("database down: secret detail");
      },
      onError: (e) => errors.push(e),
    });
    const answer = await post(throwing, CONTRIBUTE, { secret: null });
    assert.equal(answer.status, 500);
    assert.ok(!JSON.stringify(answer.body).includes("secret detail"), "nothing of the error is sent back");
    assert.equal(errors.length, 1);

    const malformed = await serve({
      // @ts-expect-error: a wrong answer on purpose
      contribute: () => ({ revision: true, blocks: "no" }),
      onError: (e) => errors.push(e),
    });
    assert.equal((await post(malformed, CONTRIBUTE, { secret: null })).status, 500);
    assert.equal(errors.length, 2);
  });

  test("only POST is served; an oversized body is 413", async () => {
    const url = await serve({ contribute: () => ({ revision: 1, blocks }), maxBodyBytes: 1024 });
    const get = await fetch(url, { signal: AbortSignal.timeout(5_000) });
    assert.equal(get.status, 405);
    assert.equal(get.headers.get("allow"), "POST");
    await get.text();
    const big = await post(url, { ...CONTRIBUTE, input: [{ role: "user", content: "x".repeat(4096) }] }, { secret: null });
    assert.equal(big.status, 413);
  });

  test("without a secret, unsigned packets are served", async () => {
    const url = await serve({ contribute: (packet) => ({ revision: packet.model, blocks }) });
    assert.deepEqual((await post(url, CONTRIBUTE, { secret: null })).body, { revision: "gpt-4o-mini", blocks });
  });
});
