/**
 * `ContextAssemblyClient`: a dependency-free client of the context-assembly HTTP API (docs/api.md),
 * built on the global `fetch` of Node 20+ (or any `fetch` passed in).
 *
 * - Every attempt has one timeout (`timeoutMs`, per client or per call) covering the whole
 *   exchange, headers and body, through `AbortSignal.timeout`; a caller's `signal` is honoured too.
 * - Only calls that are safe to repeat are retried: the `GET` calls and `reportUsage` (the service
 *   records one report per `report_id`). They are retried on no answer (connection error or
 *   timeout) and on 502/503/504, at most `maxRetries` times, with capped exponential backoff and
 *   jitter (a server's `retry-after-ms` / `Retry-After` is obeyed when it asks for at most 60 s).
 *   `prepare`, `budget`, `validate`, `refresh` (allowed once per preparation) and `repair` are
 *   sent once: a lost answer to them is reported, never silently repeated.
 * - A non-2xx answer throws the `APIStatusError` subclass of its problem `code` (see errors.ts).
 */

import {
  APIConnectionError,
  APIResponseValidationError,
  APITimeoutError,
  APIUserAbortError,
  makeStatusError,
  parseProblem,
} from "./errors.js";
import type {
  BudgetResponse,
  Frame,
  Health,
  ModelList,
  PreparationView,
  PrepareRequest,
  PrepareResponse,
  RepairRequest,
  RepairResponse,
  Timeline,
  UsageRequest,
  UsageResponse,
  ValidateRequest,
  ValidateResponse,
} from "./types.js";

export const VERSION = "0.1.0";

/** Per-attempt timeout when none is given: a prepare is bounded by its own `timeout_ms` (≤ 30 s). */
export const DEFAULT_TIMEOUT_MS = 60_000;
/** Retries after the first attempt, for retry-safe calls only. */
export const DEFAULT_MAX_RETRIES = 2;
/** Milliseconds before the first retry; doubles on each further retry up to the cap. */
export const INITIAL_RETRY_DELAY_MS = 500;
export const MAX_RETRY_DELAY_MS = 8_000;
/** A server's retry hint is obeyed only when it asks for more than 0 and at most this long. */
export const MAX_RETRY_AFTER_MS = 60_000;
export const RETRYABLE_STATUSES: ReadonlySet<number> = new Set([502, 503, 504]);

export type FetchLike = (input: string, init: RequestInit) => Promise<Response>;

export interface ClientOptions {
  /** The service's base URL, e.g. `http://127.0.0.1:8080` (a path prefix is kept). */
  baseUrl: string;
  /** Sent as `Authorization: Bearer <key>` when the service requires API keys. */
  apiKey?: string;
  /** Timeout of one attempt in milliseconds (default 60000). */
  timeoutMs?: number;
  /** Retries of retry-safe calls after the first attempt (default 2; 0 disables). */
  maxRetries?: number;
  /** A `fetch` implementation (default: the global one). */
  fetch?: FetchLike;
  /** Extra headers sent with every request. */
  headers?: Record<string, string>;
}

export interface RequestOptions {
  /** Timeout of each attempt of this call, in milliseconds. */
  timeoutMs?: number;
  /** Retries of this call (retry-safe calls only). */
  maxRetries?: number;
  /** Aborts the call (and any backoff wait); throws `APIUserAbortError`. */
  signal?: AbortSignal;
  /** Extra headers for this call. */
  headers?: Record<string, string>;
}

export interface BreakdownOptions extends RequestOptions {
  /** `true` asks for the HTML page (`Accept: text/html`), otherwise plain text. */
  html?: boolean;
}

interface Call {
  method: "GET" | "POST";
  path: string;
  body?: unknown;
  retrySafe: boolean;
  accept: string;
  as: "json" | "text";
}

function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(new APIUserAbortError({ cause: signal.reason }));
      return;
    }
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(new APIUserAbortError({ cause: signal?.reason }));
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** Milliseconds a server asked to wait (`retry-after-ms`, then `Retry-After`), else null. */
export function parseRetryAfterMs(headers: Headers | null, now: number = Date.now()): number | null {
  if (headers === null) return null;
  const ms = headers.get("retry-after-ms");
  if (ms !== null && ms.trim() !== "" && Number.isFinite(Number(ms))) return Number(ms);
  const value = headers.get("retry-after");
  if (value === null || value.trim() === "") return null;
  if (/^\s*\d+(\.\d+)?\s*$/.test(value)) return Number(value) * 1000;
  const date = Date.parse(value);
  return Number.isNaN(date) ? null : date - now;
}

/**
 * How long to wait before retry number `retriesDone + 1`: the server's hint when it is in
 * (0, 60 s], else `min(500 ms * 2^retriesDone, 8 s)` reduced by up to 25 % of jitter.
 */
export function retryDelayMs(retriesDone: number, headers: Headers | null = null, random: () => number = Math.random): number {
  const hinted = parseRetryAfterMs(headers);
  if (hinted !== null && hinted > 0 && hinted <= MAX_RETRY_AFTER_MS) return hinted;
  const base = Math.min(INITIAL_RETRY_DELAY_MS * 2 ** retriesDone, MAX_RETRY_DELAY_MS);
  return base * (1 - 0.25 * random());
}

function isObject(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

/**
 * The neutral frame of a prepare response, typed, for `validate` and `repair`. Throws when the
 * preparation was rendered for a provider (`render` other than `neutral`).
 */
export function neutralFrame(response: Pick<PrepareResponse, "frame" | "render">): Frame {
  if (response.render !== "neutral") {
    throw new TypeError(`the frame is rendered for ${response.render}, not neutral`);
  }
  const frame = response.frame;
  if (!Array.isArray(frame.messages)) throw new TypeError("the frame has no messages array");
  return frame as Frame;
}

export class ContextAssemblyClient {
  readonly baseUrl: string;
  readonly timeoutMs: number;
  readonly maxRetries: number;
  readonly #apiKey: string | undefined;
  readonly #fetch: FetchLike;
  readonly #headers: Record<string, string>;

  constructor(options: ClientOptions) {
    if (typeof options?.baseUrl !== "string" || options.baseUrl === "") {
      throw new TypeError("baseUrl is required, e.g. http://127.0.0.1:8080");
    }
    this.baseUrl = options.baseUrl.replace(/\/+$/, "");
    this.timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    this.maxRetries = options.maxRetries ?? DEFAULT_MAX_RETRIES;
    if (!(this.timeoutMs > 0)) throw new RangeError("timeoutMs must be positive");
    if (!Number.isInteger(this.maxRetries) || this.maxRetries < 0) throw new RangeError("maxRetries must be a non-negative integer");
    this.#apiKey = options.apiKey;
    const fetchImpl = options.fetch ?? globalThis.fetch;
    if (typeof fetchImpl !== "function") throw new TypeError("no fetch available: pass options.fetch");
    this.#fetch = fetchImpl;
    this.#headers = { ...(options.headers ?? {}) };
  }

  /** `POST /v1/prepare`: run contributors, select under the budget, lay out. */
  prepare(body: PrepareRequest, options?: RequestOptions): Promise<PrepareResponse> {
    return this.#json({ method: "POST", path: "/v1/prepare", body, retrySafe: false }, options);
  }

  /** `POST /v1/budget`: the budget of what is already materialisable; no contributor runs. */
  budget(body: PrepareRequest, options?: RequestOptions): Promise<BudgetResponse> {
    return this.#json({ method: "POST", path: "/v1/budget", body, retrySafe: false }, options);
  }

  /** `GET /v1/preparations/{id}`: manifest, budget, fingerprint, accounting (no block bodies). */
  getPreparation(preparationId: string, options?: RequestOptions): Promise<PreparationView> {
    return this.#json({ method: "GET", path: this.#prep(preparationId), retrySafe: true }, options);
  }

  /** `POST /v1/preparations/{id}/validate`: the final dispatch check; `StaleError` when stale. */
  validate(preparationId: string, body: ValidateRequest, options?: RequestOptions): Promise<ValidateResponse> {
    return this.#json({ method: "POST", path: this.#prep(preparationId, "/validate"), body, retrySafe: false }, options);
  }

  /**
   * `POST /v1/preparations/{id}/refresh`: one more round after host hooks edited history or input,
   * with the edited prepare request. At most once per preparation (`StaleError` `refresh_used`).
   */
  refresh(preparationId: string, body: PrepareRequest, options?: RequestOptions): Promise<PrepareResponse> {
    return this.#json({ method: "POST", path: this.#prep(preparationId, "/refresh"), body, retrySafe: false }, options);
  }

  /** `POST /v1/preparations/{id}/repair`: a structured-output repair frame over the frozen frame. */
  repair(preparationId: string, body: RepairRequest, options?: RequestOptions): Promise<RepairResponse> {
    return this.#json({ method: "POST", path: this.#prep(preparationId, "/repair"), body, retrySafe: false }, options);
  }

  /** `POST /v1/preparations/{id}/usage`: the provider's raw usage; idempotent per `report_id`. */
  reportUsage(preparationId: string, body: UsageRequest, options?: RequestOptions): Promise<UsageResponse> {
    return this.#json({ method: "POST", path: this.#prep(preparationId, "/usage"), body, retrySafe: true }, options);
  }

  /** `GET /v1/preparations/{id}/breakdown`: the human view, plain text or (`html: true`) HTML. */
  breakdown(preparationId: string, options: BreakdownOptions = {}): Promise<string> {
    const { html, ...rest } = options;
    return this.#send<string>(
      {
        method: "GET",
        path: this.#prep(preparationId, "/breakdown"),
        retrySafe: true,
        accept: html === true ? "text/html" : "text/plain",
        as: "text",
      },
      rest,
    );
  }

  /** `GET /v1/preparations/{id}/timeline`: the turns of the preparation's scope, oldest first. */
  timeline(preparationId: string, options?: RequestOptions): Promise<Timeline> {
    return this.#json({ method: "GET", path: this.#prep(preparationId, "/timeline"), retrySafe: true }, options);
  }

  /** `GET /v1/models`: the capacity registry. */
  models(options?: RequestOptions): Promise<ModelList> {
    return this.#json({ method: "GET", path: "/v1/models", retrySafe: true }, options);
  }

  /** `GET /healthz`: liveness. */
  health(options?: RequestOptions): Promise<Health> {
    return this.#json({ method: "GET", path: "/healthz", retrySafe: true }, options);
  }

  /** `GET /readyz`: readiness (the store answers); `StoreUnavailableError` when it does not. */
  ready(options?: RequestOptions): Promise<Health> {
    return this.#json({ method: "GET", path: "/readyz", retrySafe: true }, options);
  }

  #prep(preparationId: string, suffix = ""): string {
    if (typeof preparationId !== "string" || preparationId === "") {
      throw new TypeError("a preparation id is required");
    }
    return `/v1/preparations/${encodeURIComponent(preparationId)}${suffix}`;
  }

  #json<T>(call: Omit<Call, "accept" | "as">, options: RequestOptions | undefined): Promise<T> {
    return this.#send<T>({ ...call, accept: "application/json", as: "json" }, options ?? {});
  }

  #headersFor(call: Call, options: RequestOptions, retriesDone: number): Record<string, string> {
    const headers: Record<string, string> = {
      accept: call.accept,
      "user-agent": `context-assembly-client-ts/${VERSION}`,
      ...this.#headers,
    };
    if (call.body !== undefined) headers["content-type"] = "application/json";
    if (this.#apiKey !== undefined) headers.authorization = `Bearer ${this.#apiKey}`;
    if (retriesDone > 0) headers["x-retry-count"] = String(retriesDone);
    return { ...headers, ...(options.headers ?? {}) };
  }

  async #send<T>(call: Call, options: RequestOptions): Promise<T> {
    const timeoutMs = options.timeoutMs ?? this.timeoutMs;
    if (!(timeoutMs > 0)) throw new RangeError("timeoutMs must be positive");
    const maxRetries = call.retrySafe ? (options.maxRetries ?? this.maxRetries) : 0;
    const url = this.baseUrl + call.path;
    const payload = call.body === undefined ? undefined : JSON.stringify(call.body);
    const userSignal = options.signal;

    for (let retriesDone = 0; ; retriesDone++) {
      if (userSignal?.aborted) throw new APIUserAbortError({ cause: userSignal.reason });
      const timeout = AbortSignal.timeout(timeoutMs);
      const signal = userSignal === undefined ? timeout : AbortSignal.any([userSignal, timeout]);
      const init: RequestInit = { method: call.method, headers: this.#headersFor(call, options, retriesDone), signal };
      if (payload !== undefined) init.body = payload;

      let response: Response;
      let text: string;
      try {
        response = await this.#fetch(url, init);
        text = await response.text(); // the body is read under the same signal (one deadline)
      } catch (error) {
        if (userSignal?.aborted) throw new APIUserAbortError({ cause: userSignal.reason });
        const failure = timeout.aborted
          ? new APITimeoutError(timeoutMs, { cause: error })
          : new APIConnectionError(`connection error: ${error instanceof Error ? error.message : String(error)}`, { cause: error });
        if (retriesDone < maxRetries) {
          await sleep(retryDelayMs(retriesDone), userSignal);
          continue;
        }
        throw failure;
      }

      if (!response.ok) {
        if (retriesDone < maxRetries && RETRYABLE_STATUSES.has(response.status)) {
          await sleep(retryDelayMs(retriesDone, response.headers), userSignal);
          continue;
        }
        const problem = parseProblem(response.headers.get("content-type"), text);
        throw makeStatusError(response.status, problem, response.headers, response.statusText);
      }

      if (call.as === "text") return text as T;
      try {
        const value: unknown = JSON.parse(text);
        if (!isObject(value)) throw new TypeError("not a JSON object");
        return value as T;
      } catch (error) {
        throw new APIResponseValidationError(response.status, `${call.method} ${call.path}: the answer is not a JSON object`, { cause: error });
      }
    }
  }
}
