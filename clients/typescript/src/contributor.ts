/**
 * Serve a contributor webhook (docs/contract.md, "Webhook protocol") from one function, on `node:http`:
 *
 * ```ts
 * import { createServer } from "node:http";
 * import { createContributorHandler } from "context-assembly-client";
 *
 * const handler = createContributorHandler({
 *   secret: process.env.CONTRIBUTOR_SECRET, // "whsec_<base64>", shared with the service
 *   async contribute(packet, { signal }) {
 *     const notes = await loadNotes(packet.scope, { signal }); // authorise against the scope yourself
 *     return { revision: notes.version, blocks: notes.items.map((n) => ({ id: n.key, text: n.text })) };
 *   },
 * });
 * createServer(handler).listen(9001, "127.0.0.1");
 * ```
 *
 * For each request the handler:
 *
 * 1. Accepts `POST` only (405 otherwise) and reads the body up to `maxBodyBytes` (413).
 * 2. With a secret, verifies the Standard Webhooks signature over the exact body bytes: the
 *    `webhook-id`, `webhook-timestamp` and `webhook-signature` headers must be present, the
 *    timestamp within `toleranceSeconds` of now (the replay window), and one of the
 *    space-separated `v1,<base64>` signatures must equal
 *    base64(HMAC-SHA256(key, `${id}.${timestamp}.${body}`)), compared in constant time
 *    (`timingSafeEqual`); the secret is `whsec_` + the base64 key, and several secrets may be
 *    given during a rotation. Anything else is 401.
 * 3. Parses the packet: 400 on invalid JSON, an unknown `type` or a malformed packet.
 * 4. Runs the function under the deadline of `X-Contributor-Timeout-Ms` (the service's remaining
 *    budget, relative, so no clock sync is needed): the function gets an `AbortSignal` that
 *    aborts at the deadline (and when the service hangs up), and the answer at the deadline is
 *    504, which the service records as a failed contributor. A function should pass the signal
 *    on to its own I/O; a result that arrives later is dropped.
 * 5. Answers `200 {revision, blocks}` for `contribute` and `200 {revision}` for `revision` (from
 *    `revision(packet)` when given, else from `contribute` called with a contribute-shaped packet
 *    whose `ctx.check` is `"revision"`), as `application/json`. A function that throws or
 *    returns a malformed answer gives 500 (reported to `onError`; nothing of it is sent back).
 *
 * The packet carries no credentials and grants no authority: the function must authorise what it
 * reads against `packet.scope` itself.
 *
 * The packets and answers are the OpenAPI document's (its `webhooks`; the types `openapi.ts`
 * generates from it), so a field the service adds to a packet reaches these types with the next
 * `npm run gen-types`.
 */

import { createHmac, timingSafeEqual } from "node:crypto";
import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from "node:http";

import type { Block, ContributorAnswer, Message, ContributePacket as PacketOfTheDocument, RevisionPacket, Scope } from "./types.js";

export const TIMEOUT_HEADER = "x-contributor-timeout-ms";
export const SECRET_PREFIX = "whsec_";
export const DEFAULT_TOLERANCE_SECONDS = 300;
export const DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024;

/** A source's revision: a finite number or a string (the document's `ContributorAnswer.revision`). */
export type Revision = ContributorAnswer["revision"];

/**
 * A `contribute` packet: the document's `ContributePacket`, what the service asks a contributor
 * for. `deadline_unix_ms` is `null` only in the packet `contribute` gets for a revision check
 * (`ctx.check === "revision"`) that named no deadline.
 */
export type ContributePacket = Omit<PacketOfTheDocument, "deadline_unix_ms"> & { deadline_unix_ms: number | null };

/** A `revision` packet (the document's): the dispatch-time check of a source's current revision. */
export type { RevisionPacket };

/** What `contribute` returns: the document's `ContributorAnswer`, with `blocks` optional (none is `[]`). */
export type ContributionAnswer = Omit<ContributorAnswer, "blocks"> & { blocks?: Block[] };

export interface ContributorContext {
  /** Aborts at the deadline of `X-Contributor-Timeout-Ms`, or when the caller disconnects. */
  signal: AbortSignal;
  /** The deadline as `Date.now()` milliseconds, or null when the call named none. */
  deadline: number | null;
  /** The `webhook-id` of this delivery (stable across retries of the same delivery). */
  webhookId: string | null;
  /** Which packet is being answered: `"revision"` when `contribute` serves a revision check. */
  check: "contribute" | "revision";
  headers: IncomingHttpHeaders;
}

export type ContributeFn = (packet: ContributePacket, context: ContributorContext) => ContributionAnswer | Promise<ContributionAnswer>;
export type RevisionFn = (packet: RevisionPacket, context: ContributorContext) => Revision | { revision: Revision } | Promise<Revision | { revision: Revision }>;

export interface ContributorHandlerOptions {
  contribute: ContributeFn;
  /** Answers revision checks; when omitted, `contribute` is called and its revision answered. */
  revision?: RevisionFn;
  /** Standard Webhooks secret(s), `whsec_<base64>`; without one, unsigned calls are accepted. */
  secret?: string | readonly string[];
  /** The replay window: how far `webhook-timestamp` may be from now (default 300 s). */
  toleranceSeconds?: number;
  /** The largest packet accepted (default 8 MiB). */
  maxBodyBytes?: number;
  /** Called with what the function threw or returned wrongly (default: `console.error`). */
  onError?: (error: unknown) => void;
  /** The clock, `Date.now()`-style milliseconds (tests). */
  now?: () => number;
}

export type ContributorHandler = (req: IncomingMessage, res: ServerResponse) => void;

class Reply extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly headers: Record<string, string> = {},
  ) {
    super(message);
  }
}

const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

/** The HMAC key of a Standard Webhooks secret (`whsec_` + base64). */
export function decodeSecret(secret: string): Buffer {
  const raw = secret.startsWith(SECRET_PREFIX) ? secret.slice(SECRET_PREFIX.length) : secret;
  if (raw === "" || !BASE64.test(raw)) {
    throw new TypeError("a contributor secret is 'whsec_' followed by base64");
  }
  return Buffer.from(raw, "base64");
}

/**
 * The `webhook-signature` value for `body` (one `v1,` signature per secret), as the service
 * sends it; for tests and for callers that sign their own deliveries.
 */
export function signWebhook(secret: string | readonly string[], webhookId: string, timestampSeconds: number, body: string | Buffer): string {
  const secrets = typeof secret === "string" ? [secret] : secret;
  const signed = Buffer.concat([Buffer.from(`${webhookId}.${timestampSeconds}.`), Buffer.isBuffer(body) ? body : Buffer.from(body)]);
  return secrets.map((s) => `v1,${createHmac("sha256", decodeSecret(s)).update(signed).digest("base64")}`).join(" ");
}

function header(headers: IncomingHttpHeaders, name: string): string | undefined {
  const value = headers[name];
  return Array.isArray(value) ? value.join(" ") : value;
}

function isObject(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

function isRevision(value: unknown): value is Revision {
  return typeof value === "string" || (typeof value === "number" && Number.isFinite(value));
}

function readBody(req: IncomingMessage, maxBytes: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    let done = false;
    const fail = (error: Error): void => {
      if (done) return;
      done = true;
      reject(error);
    };
    const declared = Number(req.headers["content-length"]);
    if (Number.isFinite(declared) && declared > maxBytes) {
      fail(new Reply(413, `body over ${maxBytes} bytes`));
      req.resume();
      return;
    }
    req.on("data", (chunk: Buffer) => {
      if (done) return;
      size += chunk.length;
      if (size > maxBytes) {
        fail(new Reply(413, `body over ${maxBytes} bytes`));
        req.resume();
        return;
      }
      chunks.push(chunk);
    });
    req.on("end", () => {
      if (done) return;
      done = true;
      resolve(Buffer.concat(chunks));
    });
    req.on("error", fail);
    req.on("aborted", () => fail(new Reply(400, "client disconnected")));
  });
}

function parsePacket(body: Buffer): ContributePacket | RevisionPacket {
  let data: unknown;
  try {
    data = JSON.parse(body.toString("utf8"));
  } catch {
    throw new Reply(400, "body is not valid JSON");
  }
  if (!isObject(data)) throw new Reply(400, "the packet must be a JSON object");
  const scope = data.scope === undefined || data.scope === null ? {} : data.scope;
  if (!isObject(scope)) throw new Reply(400, "malformed packet: scope must be an object");
  if (typeof data.source !== "string") throw new Reply(400, "malformed packet: source must be a string");
  if (data.type === "revision") {
    return { type: "revision", source: data.source, scope: scope as Scope };
  }
  if (data.type !== "contribute") throw new Reply(400, "packet type must be 'contribute' or 'revision'");
  const input = data.input ?? [];
  const limit = data.source_token_limit ?? null;
  const deadline = data.deadline_unix_ms ?? null;
  if (
    typeof data.preparation_id !== "string" ||
    typeof data.model !== "string" ||
    !Array.isArray(input) ||
    typeof data.data_budget_tokens !== "number" ||
    (limit !== null && typeof limit !== "number") ||
    (deadline !== null && typeof deadline !== "number")
  ) {
    throw new Reply(400, "malformed contribute packet");
  }
  return {
    ...(data as object),
    type: "contribute",
    preparation_id: data.preparation_id,
    source: data.source,
    model: data.model,
    input: input as Message[],
    data_budget_tokens: data.data_budget_tokens,
    source_token_limit: limit as number | null,
    scope: scope as Scope,
    deadline_unix_ms: deadline as number | null,
  };
}

function parseTimeoutMs(raw: string | undefined): number | null {
  if (raw === undefined) return null;
  const text = raw.trim();
  if (!/^-?\d+$/.test(text)) throw new Reply(400, `${TIMEOUT_HEADER} must be integer milliseconds`);
  return Math.max(Number(text), 0);
}

function checkAnswer(value: unknown): { revision: Revision; blocks: Block[] } {
  if (!isObject(value)) throw new TypeError("contribute must return {revision, blocks}");
  if (!isRevision(value.revision)) throw new TypeError("revision must be a string or a finite number");
  const blocks = value.blocks ?? [];
  if (!Array.isArray(blocks)) throw new TypeError("blocks must be an array");
  for (const block of blocks) {
    if (!isObject(block) || typeof block.id !== "string" || typeof block.text !== "string") {
      throw new TypeError("every block needs a string id and a string text");
    }
  }
  return { revision: value.revision, blocks: blocks as Block[] };
}

function send(res: ServerResponse, status: number, payload: unknown, headers: Record<string, string> = {}): void {
  if (res.headersSent || res.destroyed) return;
  const body = JSON.stringify(payload);
  res.writeHead(status, {
    "content-type": "application/json",
    "content-length": String(Buffer.byteLength(body)),
    ...headers,
  });
  res.end(body);
}

/** A `node:http` request handler serving `contribute` (and `revision`); see the module doc. */
export function createContributorHandler(options: ContributorHandlerOptions): ContributorHandler {
  if (typeof options?.contribute !== "function") throw new TypeError("contribute must be a function");
  const secrets = options.secret === undefined ? [] : typeof options.secret === "string" ? [options.secret] : [...options.secret];
  const keys = secrets.map(decodeSecret);
  const tolerance = options.toleranceSeconds ?? DEFAULT_TOLERANCE_SECONDS;
  const maxBody = options.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES;
  const now = options.now ?? Date.now;
  const onError =
    options.onError ??
    ((error: unknown) => {
      console.error("context-assembly contributor: the function failed:", error);
    });

  function verify(headers: IncomingHttpHeaders, body: Buffer): void {
    const id = header(headers, "webhook-id");
    const timestamp = header(headers, "webhook-timestamp");
    const signatures = header(headers, "webhook-signature");
    if (!id || !timestamp || !signatures) throw new Reply(401, "missing webhook signature headers");
    if (!/^\d+$/.test(timestamp.trim())) throw new Reply(401, "invalid webhook-timestamp");
    const sentAt = Number(timestamp.trim());
    if (Math.abs(now() / 1000 - sentAt) > tolerance) throw new Reply(401, "webhook-timestamp outside the replay window");
    const signed = Buffer.concat([Buffer.from(`${id}.${sentAt}.`), body]);
    const expected = keys.map((key) => Buffer.from(createHmac("sha256", key).update(signed).digest("base64")));
    for (const item of signatures.split(/\s+/)) {
      const comma = item.indexOf(",");
      if (comma < 0 || item.slice(0, comma) !== "v1") continue;
      const given = Buffer.from(item.slice(comma + 1));
      let matched = false;
      for (const candidate of expected) {
        // Every key is compared (no early exit to time); lengths are public (base64 of 32 bytes).
        if (candidate.length === given.length && timingSafeEqual(candidate, given)) matched = true;
      }
      if (matched) return;
    }
    throw new Reply(401, "no valid webhook signature");
  }

  async function answer(packet: ContributePacket | RevisionPacket, context: ContributorContext): Promise<unknown> {
    if (packet.type === "contribute") return checkAnswer(await options.contribute(packet, context));
    if (options.revision !== undefined) {
      const value: unknown = await options.revision(packet, context);
      const revision = isObject(value) ? value.revision : value;
      if (!isRevision(revision)) throw new TypeError("revision must return a string or a finite number");
      return { revision };
    }
    const asContribute: ContributePacket = {
      type: "contribute",
      preparation_id: "",
      source: packet.source,
      model: "",
      input: [],
      data_budget_tokens: 0,
      source_token_limit: null,
      scope: packet.scope,
      deadline_unix_ms: context.deadline,
    };
    const result = checkAnswer(await options.contribute(asContribute, { ...context, check: "revision" }));
    return { revision: result.revision };
  }

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const started = now();
    if (req.method !== "POST") {
      req.resume();
      throw new Reply(405, "use POST", { allow: "POST" });
    }
    const body = await readBody(req, maxBody);
    if (keys.length > 0) verify(req.headers, body);
    const timeoutMs = parseTimeoutMs(header(req.headers, TIMEOUT_HEADER));
    const packet = parsePacket(body);

    const controller = new AbortController();
    const DEADLINE = new DOMException("the contributor deadline passed", "TimeoutError");
    const deadline = timeoutMs === null ? null : started + timeoutMs;
    const context: ContributorContext = {
      signal: controller.signal,
      deadline,
      webhookId: header(req.headers, "webhook-id") ?? null,
      check: packet.type,
      headers: req.headers,
    };
    // Settles when the signal aborts: at the deadline, or when the caller hangs up.
    const stopped = new Promise<"deadline" | "gone">((resolve) => {
      controller.signal.addEventListener("abort", () => resolve(controller.signal.reason === DEADLINE ? "deadline" : "gone"), { once: true });
    });
    let timer: NodeJS.Timeout | undefined;
    if (deadline !== null) {
      const remaining = deadline - now();
      if (remaining <= 0) throw new Reply(504, "the contributor did not finish before the deadline");
      timer = setTimeout(() => controller.abort(DEADLINE), remaining);
    }
    const onClose = (): void => {
      if (!res.writableEnded) controller.abort(new DOMException("the caller disconnected", "AbortError"));
    };
    res.once("close", onClose);
    try {
      const work = answer(packet, context).then((value) => ({ value }));
      work.catch(() => undefined); // a failure after the deadline is dropped, never unhandled
      const outcome = await Promise.race([work, stopped]);
      if (outcome === "deadline") throw new Reply(504, "the contributor did not finish before the deadline");
      if (outcome === "gone") return; // nobody is left to answer
      send(res, 200, outcome.value);
    } catch (error) {
      if (error instanceof Reply) throw error;
      if (controller.signal.aborted) {
        // The function gave up because of the abort (e.g. it rejected with the signal's reason).
        if (controller.signal.reason === DEADLINE) throw new Reply(504, "the contributor did not finish before the deadline");
        return;
      }
      onError(error);
      throw new Reply(500, "the contributor function failed");
    } finally {
      if (timer !== undefined) clearTimeout(timer);
      res.off("close", onClose);
    }
  }

  return (req, res) => {
    handle(req, res).catch((error: unknown) => {
      if (error instanceof Reply) {
        send(res, error.status, { error: error.message }, error.headers);
      } else {
        onError(error);
        send(res, 500, { error: "internal error" });
      }
    });
  };
}
