// Client behaviour without a service: error mapping, retries, timeouts, headers (a fake fetch).

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { describe, test } from "node:test";

import {
  APIConnectionError,
  APIResponseValidationError,
  APIStatusError,
  APITimeoutError,
  APIUserAbortError,
  AssemblyTimeoutError,
  AuthenticationError,
  BadRequestError,
  ContextAssemblyClient,
  ContributorFailedError,
  InternalServerError,
  InvalidRequestError,
  NotFoundError,
  PayloadTooLargeError,
  PROBLEM_CODES,
  RecordTooNewError,
  StaleError,
  StoreUnavailableError,
  makeStatusError,
  retryDelayMs,
  type FetchLike,
} from "../src/index.js";
import { close, listen, PACKAGE_DIR } from "./support.js";

interface Seen {
  url: string;
  init: RequestInit;
}

function problem(status: number, code: string, extra: Record<string, unknown> = {}, headers: Record<string, string> = {}): Response {
  return new Response(JSON.stringify({ type: "about:blank", title: code, status, detail: `${code} happened`, code, ...extra }), {
    status,
    headers: { "content-type": "application/problem+json", ...headers },
  });
}

function json(value: unknown, status = 200): Response {
  return new Response(JSON.stringify(value), { status, headers: { "content-type": "application/json" } });
}

/** A fetch that answers from `script` in order and records every call. */
function scripted(...script: Array<Response | Error | (() => Response | Promise<Response>)>): { fetch: FetchLike; seen: Seen[] } {
  const seen: Seen[] = [];
  const fetch: FetchLike = async (url, init) => {
    seen.push({ url, init });
    const next = script.shift();
    if (next === undefined) throw new Error("the script ran out");
    if (next instanceof Error) throw next;
    return typeof next === "function" ? next() : next;
  };
  return { fetch, seen };
}

const FAST_RETRY = { "retry-after-ms": "1" };

describe("errors from problem+json", () => {
  test("PROBLEM_CODES are the codes of the document's ProblemCode", () => {
    const document = JSON.parse(readFileSync(resolve(PACKAGE_DIR, "../../openapi/openapi.json"), "utf8")) as {
      components: { schemas: { ProblemCode: { enum: string[] } } };
    };
    assert.deepEqual([...PROBLEM_CODES].sort(), [...document.components.schemas.ProblemCode.enum].sort());
  });

  // 418: a status no class stands for, so the code alone chooses.
  for (const code of PROBLEM_CODES) {
    test(`${code} -> the class that names it`, async () => {
      const { fetch } = scripted(problem(418, code));
      const client = new ContextAssemblyClient({ baseUrl: "http://svc", fetch, maxRetries: 0 });
      const error = await client.prepare({ model: "m" }).then(
        () => assert.fail("expected an error"),
        (e: unknown) => e,
      );
      assert.ok(error instanceof APIStatusError);
      const cls = error.constructor as typeof APIStatusError;
      assert.equal(cls.expectedCode, code);
      assert.equal(error.status, 418);
      assert.equal(error.code, code);
      assert.equal(error.detail, `${code} happened`);
      assert.equal(error.name, cls.name);
      assert.equal(error.message, `418 ${code}: ${code} happened`);
    });
  }

  test("the classes of the codes are the exported ones", () => {
    const classes: Array<[string, typeof APIStatusError]> = [
      ["CONTEXT_ASSEMBLY_INVALID", InvalidRequestError],
      ["CONTEXT_ASSEMBLY_STALE", StaleError],
      ["STORE_UNAVAILABLE", StoreUnavailableError],
      ["RECORD_TOO_NEW", RecordTooNewError],
      ["INTERNAL", InternalServerError],
    ];
    for (const [code, cls] of classes) assert.ok(makeStatusError(418, { code }) instanceof cls, code);
  });

  test("extensions: reasons, source, sources, errors", () => {
    const stale = makeStatusError(409, { code: "CONTEXT_ASSEMBLY_STALE", reasons: ["model_changed", "revision_changed:memory"] });
    assert.ok(stale instanceof StaleError);
    assert.deepEqual(stale.reasons, ["model_changed", "revision_changed:memory"]);
    const failed = makeStatusError(502, { code: "CONTRIBUTOR_FAILED", source: "memory", contributor_status: "error" });
    assert.ok(failed instanceof ContributorFailedError);
    assert.equal(failed.source, "memory");
    assert.equal(failed.contributorStatus, "error");
    const late = makeStatusError(504, { code: "CONTEXT_ASSEMBLY_TIMEOUT", sources: ["memory"] });
    assert.ok(late instanceof AssemblyTimeoutError);
    assert.deepEqual(late.sources, ["memory"]);
    const invalid = makeStatusError(422, { code: "CONTEXT_ASSEMBLY_INVALID", errors: [{ loc: "model", msg: "too short" }] });
    assert.ok(invalid instanceof InvalidRequestError);
    assert.equal(invalid.errors[0]?.loc, "model");
  });

  test("without a known code the status decides", () => {
    assert.ok(makeStatusError(400, {}) instanceof BadRequestError);
    assert.ok(makeStatusError(401, {}) instanceof AuthenticationError);
    assert.ok(makeStatusError(404, {}) instanceof NotFoundError);
    assert.ok(makeStatusError(413, {}) instanceof PayloadTooLargeError);
    assert.ok(makeStatusError(500, { code: "INTERNAL" }) instanceof InternalServerError);
    assert.ok(makeStatusError(502, { code: "SOMETHING_NEW" }) instanceof InternalServerError);
    const plain = makeStatusError(418, {});
    assert.equal(plain.constructor, APIStatusError);
    assert.equal(plain.code, null);
  });

  test("a non-JSON error body gives an empty problem", async () => {
    const { fetch } = scripted(new Response("<html>bad gateway</html>", { status: 502, statusText: "Bad Gateway", headers: { "content-type": "text/html" } }));
    const client = new ContextAssemblyClient({ baseUrl: "http://svc", fetch });
    const error = await client.prepare({ model: "m" }).then(
      () => assert.fail("expected an error"),
      (e: unknown) => e,
    );
    assert.ok(error instanceof InternalServerError);
    assert.deepEqual(error.problem, {});
    assert.equal(error.message, "502 HTTP error: Bad Gateway");
  });

  test("a 2xx body that is not a JSON object is an APIResponseValidationError", async () => {
    const { fetch } = scripted(new Response("not json", { status: 200 }));
    const client = new ContextAssemblyClient({ baseUrl: "http://svc", fetch });
    await assert.rejects(client.models(), APIResponseValidationError);
  });
});

describe("requests", () => {
  test("URL, method, headers and body", async () => {
    const { fetch, seen } = scripted(json({ preparation_id: "p/1", accounting: {} }), json({ status: "ok" }), new Response("text view", { status: 200 }));
    const client = new ContextAssemblyClient({ baseUrl: "http://svc/base/", apiKey: "k1", fetch, headers: { "x-tenant-hint": "t" } });
    await client.reportUsage("p/1", { report_id: "r", provider: "openai", usage: { prompt_tokens: 1 } });
    const first = seen[0]!;
    assert.equal(first.url, "http://svc/base/v1/preparations/p%2F1/usage");
    assert.equal(first.init.method, "POST");
    const headers = first.init.headers as Record<string, string>;
    assert.equal(headers.authorization, "Bearer k1");
    assert.equal(headers["content-type"], "application/json");
    assert.equal(headers.accept, "application/json");
    assert.equal(headers["x-tenant-hint"], "t");
    assert.deepEqual(JSON.parse(first.init.body as string), { report_id: "r", provider: "openai", usage: { prompt_tokens: 1 } });

    await client.health({ headers: { "x-request-id": "abc" } });
    assert.equal(seen[1]!.url, "http://svc/base/healthz");
    assert.equal(seen[1]!.init.body, undefined);
    assert.equal((seen[1]!.init.headers as Record<string, string>)["x-request-id"], "abc");

    assert.equal(await client.breakdown("p1", { html: true }), "text view");
    assert.equal((seen[2]!.init.headers as Record<string, string>).accept, "text/html");
  });

  test("an empty id or base URL is refused before any request", async () => {
    assert.throws(() => new ContextAssemblyClient({ baseUrl: "" }), TypeError);
    const { fetch, seen } = scripted();
    const client = new ContextAssemblyClient({ baseUrl: "http://svc", fetch });
    assert.throws(() => client.getPreparation(""), TypeError);
    assert.equal(seen.length, 0);
  });
});

describe("retries", () => {
  test("GETs are retried on 502/503/504 and on connection errors", async () => {
    const { fetch, seen } = scripted(
      new TypeError("fetch failed"),
      problem(503, "STORE_UNAVAILABLE", {}, FAST_RETRY),
      new Response("", { status: 504, headers: FAST_RETRY }),
      json({ models: [], fallback_context_window: 128000 }),
    );
    const client = new ContextAssemblyClient({ baseUrl: "http://svc", fetch, maxRetries: 3 });
    const originalRandom = Math.random;
    Math.random = () => 1; // shortest jittered backoff for the connection error (375 ms)
    try {
      const models = await client.models();
      assert.equal(models.fallback_context_window, 128000);
    } finally {
      Math.random = originalRandom;
    }
    assert.equal(seen.length, 4);
    assert.equal((seen[3]!.init.headers as Record<string, string>)["x-retry-count"], "3");
  });

  test("retries stop at maxRetries and throw the last error", async () => {
    const { fetch, seen } = scripted(problem(503, "STORE_UNAVAILABLE", {}, FAST_RETRY), problem(503, "STORE_UNAVAILABLE", {}, FAST_RETRY));
    const client = new ContextAssemblyClient({ baseUrl: "http://svc", fetch, maxRetries: 1 });
    await assert.rejects(client.getPreparation("p"), StoreUnavailableError);
    assert.equal(seen.length, 2);
  });

  test("reportUsage is retried (idempotent by report_id)", async () => {
    const { fetch, seen } = scripted(problem(502, "CONTRIBUTOR_FAILED", {}, FAST_RETRY), json({ preparation_id: "p", accounting: {} }));
    const client = new ContextAssemblyClient({ baseUrl: "http://svc", fetch });
    await client.reportUsage("p", { report_id: "r", provider: "openai", usage: {} });
    assert.equal(seen.length, 2);
    assert.equal(seen[0]!.init.body, seen[1]!.init.body);
  });

  test("prepare, validate, refresh and repair are never retried", async () => {
    for (const call of [
      (c: ContextAssemblyClient) => c.prepare({ model: "m" }),
      (c: ContextAssemblyClient) => c.budget({ model: "m" }),
      (c: ContextAssemblyClient) => c.validate("p", { model: "m", frame: {} }),
      (c: ContextAssemblyClient) => c.refresh("p", { model: "m" }),
      (c: ContextAssemblyClient) => c.repair("p", { model: "m", frame: {}, answer: "a" }),
    ]) {
      const { fetch, seen } = scripted(problem(503, "STORE_UNAVAILABLE", {}, FAST_RETRY), new TypeError("fetch failed"));
      const client = new ContextAssemblyClient({ baseUrl: "http://svc", fetch, maxRetries: 5 });
      await assert.rejects(call(client), StoreUnavailableError);
      assert.equal(seen.length, 1);
    }
  });

  test("other statuses are not retried", async () => {
    const { fetch, seen } = scripted(problem(404, "NOT_FOUND"));
    const client = new ContextAssemblyClient({ baseUrl: "http://svc", fetch, maxRetries: 5 });
    await assert.rejects(client.getPreparation("p"), NotFoundError);
    assert.equal(seen.length, 1);
  });

  test("backoff: exponential, capped, jittered; sensible server hints obeyed", () => {
    assert.equal(retryDelayMs(0, null, () => 0), 500);
    assert.equal(retryDelayMs(1, null, () => 0), 1000);
    assert.equal(retryDelayMs(10, null, () => 0), 8000);
    assert.equal(retryDelayMs(0, null, () => 1), 375);
    assert.equal(retryDelayMs(0, new Headers({ "retry-after": "2" }), () => 0), 2000);
    assert.equal(retryDelayMs(0, new Headers({ "retry-after-ms": "15" }), () => 0), 15);
    assert.equal(retryDelayMs(0, new Headers({ "retry-after": "3600" }), () => 0), 500, "too long a hint is ignored");
    const date = new Date(Date.now() + 3_000).toUTCString();
    const fromDate = retryDelayMs(0, new Headers({ "retry-after": date }), () => 0);
    assert.ok(fromDate > 1_000 && fromDate <= 3_000, String(fromDate));
  });
});

describe("timeouts and aborts", () => {
  test("a server that never answers is an APITimeoutError after timeoutMs (GET retried)", async () => {
    let requests = 0;
    const { server, url } = await listen(() => {
      requests += 1; // never answer
    });
    try {
      const client = new ContextAssemblyClient({ baseUrl: url, timeoutMs: 5_000, maxRetries: 1 });
      const started = Date.now();
      const originalRandom = Math.random;
      Math.random = () => 1;
      try {
        await assert.rejects(client.health({ timeoutMs: 100 }), (error: unknown) => {
          assert.ok(error instanceof APITimeoutError);
          assert.ok(error instanceof APIConnectionError);
          assert.equal(error.timeoutMs, 100);
          return true;
        });
      } finally {
        Math.random = originalRandom;
      }
      const elapsed = Date.now() - started;
      assert.equal(requests, 2);
      assert.ok(elapsed >= 500 && elapsed < 3_000, `took ${elapsed} ms`); // 2 x 100 ms + 375 ms backoff
      await assert.rejects(client.prepare({ model: "m" }, { timeoutMs: 50 }), APITimeoutError);
      assert.equal(requests, 3, "prepare is sent once");
    } finally {
      await close(server);
    }
  });

  test("the caller's signal aborts the call (and a backoff wait)", async () => {
    const { server, url } = await listen(() => undefined);
    try {
      const client = new ContextAssemblyClient({ baseUrl: url });
      const controller = new AbortController();
      setTimeout(() => controller.abort(), 50);
      await assert.rejects(client.health({ signal: controller.signal }), APIUserAbortError);
      await assert.rejects(client.health({ signal: AbortSignal.abort() }), APIUserAbortError);
    } finally {
      await close(server);
    }
    const { fetch } = scripted(problem(503, "STORE_UNAVAILABLE", {}, { "retry-after": "30" }));
    const client = new ContextAssemblyClient({ baseUrl: "http://svc", fetch });
    const controller = new AbortController();
    setTimeout(() => controller.abort(), 50);
    const started = Date.now();
    await assert.rejects(client.models({ signal: controller.signal }), APIUserAbortError);
    assert.ok(Date.now() - started < 5_000);
  });
});
