/**
 * The client's errors: one base, transport errors, and one class per problem code (docs/contract.md, "Errors").
 *
 * ```
 * ContextAssemblyError
 *  ├── APIUserAbortError                 the caller's own AbortSignal fired
 *  ├── APIConnectionError                no HTTP answer (refused, reset, DNS, ...)
 *  │    └── APITimeoutError              the per-attempt timeout ran out
 *  ├── APIResponseValidationError        a 2xx answer that is not the expected JSON
 *  └── APIStatusError                    a non-2xx answer: .status .code .problem
 *       ├── InvalidRequestError          CONTEXT_ASSEMBLY_INVALID   422  .errors
 *       ├── AssemblyOverflowError        CONTEXT_ASSEMBLY_OVERFLOW  422
 *       ├── ContextOverflowError         CONTEXT_OVERFLOW           422
 *       ├── AssemblyTimeoutError         CONTEXT_ASSEMBLY_TIMEOUT   504  .sources
 *       ├── StaleError                   CONTEXT_ASSEMBLY_STALE     409  .reasons
 *       ├── ContributorFailedError       CONTRIBUTOR_FAILED         502  .source
 *       ├── ContributorUrlRejectedError  CONTRIBUTOR_URL_REJECTED   422
 *       ├── AuthenticationError          UNAUTHENTICATED            401
 *       ├── NotFoundError                NOT_FOUND                  404
 *       ├── MethodNotAllowedError        METHOD_NOT_ALLOWED         405
 *       ├── BadRequestError              BAD_REQUEST                400
 *       ├── PayloadTooLargeError         PAYLOAD_TOO_LARGE          413
 *       ├── RequestHeadTooLargeError     REQUEST_HEAD_TOO_LARGE     431
 *       ├── RequestTimeoutError          REQUEST_TIMEOUT            408
 *       ├── StoreUnavailableError        STORE_UNAVAILABLE          503
 *       ├── RecordTooNewError            RECORD_TOO_NEW             503
 *       └── InternalServerError          INTERNAL                   500, any other 5xx
 * ```
 *
 * The class is chosen from the problem `code` first; an answer without a known code (a proxy's
 * page, a future code) falls back by status: 400, 401, 404 and 413 to their classes, any other 5xx
 * to `InternalServerError`, anything else to `APIStatusError` itself. All of that happens in
 * {@link makeStatusError}, the one place that reads an error response.
 *
 * The codes are the OpenAPI document's `ProblemCode` (the type generated into `openapi.ts`): the
 * code→class table below is typed by it, so a code the document gains or loses fails the build
 * until a class stands for it.
 */

import type { ProblemCode } from "./types.js";

/** The problem+json body of an error answer (RFC 9457), with the service's extensions. */
export interface ProblemBody {
  type?: string;
  title?: string;
  status?: number;
  detail?: string;
  code?: string;
  instance?: string | null;
  [extension: string]: unknown;
}

export type { ProblemCode };

/** Base of every error this client throws. */
export class ContextAssemblyError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** The caller's own `signal` aborted the request; it is never retried. */
export class APIUserAbortError extends ContextAssemblyError {
  constructor(options?: { cause?: unknown }) {
    super("request aborted by the caller", options);
  }
}

/** The request got no HTTP answer: connection refused or reset, DNS failure, protocol error. */
export class APIConnectionError extends ContextAssemblyError {
  constructor(message = "connection error", options?: { cause?: unknown }) {
    super(message, options);
  }
}

/** The per-attempt timeout (`timeoutMs`) ran out before the whole answer arrived. */
export class APITimeoutError extends APIConnectionError {
  readonly timeoutMs: number;

  constructor(timeoutMs: number, options?: { cause?: unknown }) {
    super(`request timed out after ${timeoutMs} ms`, options);
    this.timeoutMs = timeoutMs;
  }
}

/** A successful answer whose body is not the JSON the call expects (a contract drift). */
export class APIResponseValidationError extends ContextAssemblyError {
  readonly status: number;

  constructor(status: number, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.status = status;
  }
}

/** A non-2xx answer. `problem` is the parsed problem+json body (`{}` when there was none). */
export class APIStatusError extends ContextAssemblyError {
  /** The problem code this class stands for (`null` on the generic classes). */
  static readonly expectedCode: ProblemCode | null = null;

  readonly status: number;
  readonly code: string | null;
  readonly detail: string | null;
  readonly problem: ProblemBody;
  readonly headers: Headers;
  /** The service's `x-request-id`, for its logs. */
  readonly requestId: string | null;

  constructor(message: string, status: number, problem: ProblemBody, headers: Headers) {
    super(message);
    this.status = status;
    this.problem = problem;
    this.headers = headers;
    this.code = typeof problem.code === "string" ? problem.code : null;
    this.detail = typeof problem.detail === "string" ? problem.detail : null;
    this.requestId = headers.get("x-request-id");
  }
}

function stringList(value: unknown): string[] {
  return Array.isArray(value) ? value.map((item) => String(item)) : [];
}

/** Malformed request or blocks: duplicates, cycles, missing dependencies, unknown source. */
export class InvalidRequestError extends APIStatusError {
  static override readonly expectedCode = "CONTEXT_ASSEMBLY_INVALID";

  /** The offending fields (`{loc, msg, type}`) when the service listed them. */
  get errors(): Array<{ loc?: string; msg?: string; type?: string | null }> {
    const errors = this.problem.errors;
    return Array.isArray(errors) ? (errors as Array<{ loc?: string; msg?: string; type?: string | null }>) : [];
  }
}

/** The protected closure exceeds `max_data_tokens` or a source limit. */
export class AssemblyOverflowError extends APIStatusError {
  static override readonly expectedCode = "CONTEXT_ASSEMBLY_OVERFLOW";
}

/** The whole frame cannot fit the window, even after the allowed history compaction. */
export class ContextOverflowError extends APIStatusError {
  static override readonly expectedCode = "CONTEXT_OVERFLOW";
}

/**
 * Contributors did not finish within the preparation's deadline (failure policy `fail`). A
 * client-side timeout is {@link APITimeoutError}.
 */
export class AssemblyTimeoutError extends APIStatusError {
  static override readonly expectedCode = "CONTEXT_ASSEMBLY_TIMEOUT";

  /** The sources that ran out of time. */
  get sources(): string[] {
    return stringList(this.problem.sources);
  }
}

/**
 * Something the preparation relied on changed; `reasons` lists what (docs/contract.md, "Lifecycle"):
 * `model_changed`, `scope_changed`, `prefix_changed`, `input_changed`, `expired:<source>/<id>`,
 * `revision_changed:<source>`, `revision_unavailable:<source>`, `refresh_used`.
 */
export class StaleError extends APIStatusError {
  static override readonly expectedCode = "CONTEXT_ASSEMBLY_STALE";

  get reasons(): string[] {
    return stringList(this.problem.reasons);
  }
}

/** A contributor failed under failure policy `fail`; `source` names it, `cause` keeps why. */
export class ContributorFailedError extends APIStatusError {
  static override readonly expectedCode = "CONTRIBUTOR_FAILED";

  get source(): string | null {
    return typeof this.problem.source === "string" ? this.problem.source : null;
  }

  get contributorStatus(): string | null {
    const value = this.problem.contributor_status;
    return typeof value === "string" ? value : null;
  }
}

/** An inline contributor URL outside the allowlist or resolving to a forbidden address. */
export class ContributorUrlRejectedError extends APIStatusError {
  static override readonly expectedCode = "CONTRIBUTOR_URL_REJECTED";
}

/** No API key, or a key that maps to no tenant. */
export class AuthenticationError extends APIStatusError {
  static override readonly expectedCode = "UNAUTHENTICATED";
}

/** Unknown preparation id, or another tenant's (the two are indistinguishable on purpose). */
export class NotFoundError extends APIStatusError {
  static override readonly expectedCode = "NOT_FOUND";
}

/**
 * The request was not valid HTTP and was refused before it was read (a malformed request line,
 * header field, `Content-Length` or chunk): a bug in the HTTP stack that sent it, or in a proxy on
 * the way.
 */
export class BadRequestError extends APIStatusError {
  static override readonly expectedCode = "BAD_REQUEST";
}

/** The path exists, but not with this method. */
export class MethodNotAllowedError extends APIStatusError {
  static override readonly expectedCode = "METHOD_NOT_ALLOWED";
}

/** The request body is over the service's configured limit. */
export class PayloadTooLargeError extends APIStatusError {
  static override readonly expectedCode = "PAYLOAD_TOO_LARGE";
}

/** The request head (target and header fields) is over the service's configured limit. */
export class RequestHeadTooLargeError extends APIStatusError {
  static override readonly expectedCode = "REQUEST_HEAD_TOO_LARGE";
}

/**
 * The request head or body did not reach the service within its time limit (a client-side
 * timeout is {@link APITimeoutError}).
 */
export class RequestTimeoutError extends APIStatusError {
  static override readonly expectedCode = "REQUEST_TIMEOUT";
}

/** The service's store cannot be reached right now; retry-safe calls are retried. */
export class StoreUnavailableError extends APIStatusError {
  static override readonly expectedCode = "STORE_UNAVAILABLE";
}

/**
 * The preparation was written by a newer version of the service, whose record the replica that
 * answered does not read (a rolling deploy); retry-safe calls are retried.
 */
export class RecordTooNewError extends APIStatusError {
  static override readonly expectedCode = "RECORD_TOO_NEW";
}

/** An unexpected failure of the service, or a 5xx answer without a known problem code (a proxy's error). */
export class InternalServerError extends APIStatusError {
  static override readonly expectedCode = "INTERNAL";
}

type StatusErrorClass = new (message: string, status: number, problem: ProblemBody, headers: Headers) => APIStatusError;

/**
 * The class of each code of the document's `ProblemCode`, which names it back: the type asks for
 * every code, and only those.
 */
const CLASS_OF: { readonly [Code in ProblemCode]: StatusErrorClass & { readonly expectedCode: Code } } = {
  INTERNAL: InternalServerError,
  CONTEXT_ASSEMBLY_INVALID: InvalidRequestError,
  CONTEXT_ASSEMBLY_OVERFLOW: AssemblyOverflowError,
  CONTEXT_OVERFLOW: ContextOverflowError,
  CONTEXT_ASSEMBLY_TIMEOUT: AssemblyTimeoutError,
  CONTEXT_ASSEMBLY_STALE: StaleError,
  CONTRIBUTOR_FAILED: ContributorFailedError,
  CONTRIBUTOR_URL_REJECTED: ContributorUrlRejectedError,
  UNAUTHENTICATED: AuthenticationError,
  NOT_FOUND: NotFoundError,
  METHOD_NOT_ALLOWED: MethodNotAllowedError,
  BAD_REQUEST: BadRequestError,
  PAYLOAD_TOO_LARGE: PayloadTooLargeError,
  REQUEST_HEAD_TOO_LARGE: RequestHeadTooLargeError,
  REQUEST_TIMEOUT: RequestTimeoutError,
  STORE_UNAVAILABLE: StoreUnavailableError,
  RECORD_TOO_NEW: RecordTooNewError,
};

/** Every problem `code` the service answers with: the document's `ProblemCode` (docs/contract.md, "Errors"). */
export const PROBLEM_CODES: readonly ProblemCode[] = Object.keys(CLASS_OF) as ProblemCode[];

const BY_CODE: ReadonlyMap<string, StatusErrorClass> = new Map<string, StatusErrorClass>(Object.entries(CLASS_OF));

const BY_STATUS: ReadonlyMap<number, StatusErrorClass> = new Map<number, StatusErrorClass>([
  [400, BadRequestError],
  [401, AuthenticationError],
  [404, NotFoundError],
  [413, PayloadTooLargeError],
]);

/** The JSON object of an error body, or `{}` for an empty, non-JSON or non-object body. */
export function parseProblem(contentType: string | null, text: string): ProblemBody {
  const mime = (contentType ?? "").split(";", 1)[0]?.trim().toLowerCase() ?? "";
  if (mime !== "application/json" && !mime.endsWith("+json")) return {};
  try {
    const body: unknown = JSON.parse(text);
    return body !== null && typeof body === "object" && !Array.isArray(body) ? (body as ProblemBody) : {};
  } catch {
    return {};
  }
}

/**
 * The error for a non-2xx answer: picks the class by the problem `code`, falls back by status.
 * The message reads `"<status> <code>: <detail>"`.
 */
export function makeStatusError(status: number, problem: ProblemBody, headers: Headers = new Headers(), statusText = ""): APIStatusError {
  const code = typeof problem.code === "string" ? problem.code : null;
  const cls =
    (code !== null ? BY_CODE.get(code) : undefined) ??
    BY_STATUS.get(status) ??
    (status >= 500 ? InternalServerError : APIStatusError);
  const detail = typeof problem.detail === "string" && problem.detail !== "" ? problem.detail : statusText || "error";
  return new cls(`${status} ${code ?? "HTTP error"}: ${detail}`, status, problem, headers);
}
