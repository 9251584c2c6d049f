/**
 * `contextAssemblyMiddleware`: the service as a Vercel AI SDK language model middleware
 * (`context-assembly-client/ai-sdk`; ai 6, `LanguageModelV3`), for `wrapLanguageModel`.
 *
 * For every model call (`generateText`, `streamText`, each step of a tool loop):
 *
 * 1. `transformParams` maps the call to a prepare request (ai-sdk-frame.ts: system prompt →
 *    `instructions`, earlier messages → `history`, the latest user turn → `input`, tools →
 *    `tools`), adds the application's `template` (model, budgets, plugins, contributors, cache,
 *    scope) and the blocks its `contributions` function returns, forces `render` and
 *    `input_format` to `neutral`, prepares under the adapter's own deadline (`timeoutMs`) and
 *    puts the frame in place of the prompt and tools, with the cache plan's provider options.
 * 2. `wrapGenerate` / `wrapStream` let the model answer, then report its usage to the service in
 *    the background (`call: "main"`, the AI SDK's usage as the `normalized` shape), when the
 *    answer (or the stream's `finish` part) arrives. A failed report never touches the answer:
 *    it is passed to `onError` (else `console.warn`) and counted in `stats.usageReportFailures`.
 *    The answer's `providerMetadata.contextAssembly.preparationId` names the preparation.
 *
 * Failures of the service fail open by default: no answer, no answer within `timeoutMs`, a 5xx,
 * or a frame the adapter cannot map back → one warning, and the call goes on with its original
 * prompt. `failOpen: false` throws them instead. A 4xx answer (a bad template, an overflow that
 * no selection can fix) always throws, and so does the caller's own abort.
 */

import type { LanguageModelMiddleware } from "ai";

import { ContextAssemblyClient } from "./client.js";
import { APIStatusError, APIUserAbortError } from "./errors.js";
import { applyFrame, mapCall, type CallOptions } from "./ai-sdk-frame.js";
import type { Contribution, PrepareRequest } from "./types.js";

export { FrameMappingError, type CallOptions } from "./ai-sdk-frame.js";

type WrapGenerateArgs = Parameters<NonNullable<LanguageModelMiddleware["wrapGenerate"]>>[0];
type GenerateResult = Awaited<ReturnType<WrapGenerateArgs["doGenerate"]>>;
type StreamResult = Awaited<ReturnType<WrapGenerateArgs["doStream"]>>;
type StreamPart = StreamResult["stream"] extends ReadableStream<infer Part> ? Part : never;
type Usage = GenerateResult["usage"];

/** The adapter's deadline for one prepare when none is given, in milliseconds. */
export const DEFAULT_PREPARE_TIMEOUT_MS = 5_000;
/** The `report_id` of the one `main` usage report each preparation gets. */
export const USAGE_REPORT_ID = "ai-sdk-main";

/**
 * Everything of a prepare request except the parts the call supplies (`instructions`, `history`,
 * `input` in the neutral shape, `tools`), `render` (always `neutral`) and managed routing (`models`, `routing`: the
 * AI SDK calls the model it wraps, whatever a routing would choose). Without `model`, the
 * wrapped model's id is the `model`.
 */
export type PrepareTemplate = Omit<PrepareRequest, "instructions" | "history" | "input" | "input_format" | "tools" | "render" | "models" | "routing">;

export interface CallInfo {
  type: "generate" | "stream";
}

/** Inline blocks for one call, e.g. read from the application's own store. */
export type ContributionsFunction = (params: CallOptions, info: CallInfo) => Contribution[] | PromiseLike<Contribution[]>;

export interface ErrorInfo {
  /** `prepare`: before the model call (the call went on with its original prompt); `usage`: the report after it. */
  phase: "prepare" | "usage";
  preparationId?: string;
}

interface CommonOptions {
  template: PrepareTemplate;
  contributions?: ContributionsFunction;
  /** `true` (default): failures of the service or the adapter leave the call as written, with a warning. */
  failOpen?: boolean;
  /** Deadline of one prepare (and of each attempt of a usage report), default 5000 ms. */
  timeoutMs?: number;
  /** Receives every failure that did not throw; without it they go to `console.warn`. */
  onError?: (error: unknown, info: ErrorInfo) => void;
}

export type ContextAssemblyMiddlewareOptions = CommonOptions &
  ({ client: ContextAssemblyClient; baseUrl?: undefined; apiKey?: undefined } | { baseUrl: string; apiKey?: string; client?: undefined });

export interface ContextAssemblyMiddlewareStats {
  /** Calls whose prompt came from a preparation. */
  prepared: number;
  /** Calls that went on with their original prompt because the service or the adapter failed. */
  failedOpen: number;
  usageReports: number;
  usageReportFailures: number;
}

export type ContextAssemblyMiddleware = LanguageModelMiddleware & {
  readonly stats: Readonly<ContextAssemblyMiddlewareStats>;
  /** Resolves when every usage report started so far has settled (before a process exits, in tests). */
  flush(): Promise<void>;
};

function describe(error: unknown): string {
  if (error instanceof APIStatusError) return `${error.name} ${error.status}${error.code ? ` ${error.code}` : ""}`;
  return error instanceof Error ? error.name : typeof error;
}

/** The AI SDK's usage in the service's `normalized` shape; absent counts are left out. */
export function normalizedUsage(usage: Usage): Record<string, number> {
  const fields: [string, number | undefined][] = [
    ["provider_input_tokens", usage.inputTokens.total],
    ["cached_input_tokens", usage.inputTokens.cacheRead],
    ["cache_creation_input_tokens", usage.inputTokens.cacheWrite],
    ["output_tokens", usage.outputTokens.total],
  ];
  return Object.fromEntries(fields.filter((field): field is [string, number] => typeof field[1] === "number"));
}

export function contextAssemblyMiddleware(options: ContextAssemblyMiddlewareOptions): ContextAssemblyMiddleware {
  const client = options.client ?? new ContextAssemblyClient({ baseUrl: options.baseUrl, apiKey: options.apiKey });
  const failOpen = options.failOpen ?? true;
  const timeoutMs = options.timeoutMs ?? DEFAULT_PREPARE_TIMEOUT_MS;
  const template = options.template;
  const stats: ContextAssemblyMiddlewareStats = { prepared: 0, failedOpen: 0, usageReports: 0, usageReportFailures: 0 };
  const preparations = new WeakMap<CallOptions, string>(); // transformed params → preparation id
  const pending = new Set<Promise<void>>();

  const warn = (error: unknown, info: ErrorInfo): void => {
    if (options.onError === undefined) {
      const what = info.phase === "prepare" ? "prepare failed; the model call goes on with its original prompt" : `usage report for ${info.preparationId} failed`;
      console.warn(`context-assembly: ${what} (${describe(error)})`);
      return;
    }
    try {
      options.onError(error, info);
    } catch (hookError) {
      console.warn(`context-assembly: onError threw (${describe(hookError)})`);
    }
  };

  const report = (preparationId: string, usage: Usage): void => {
    const body = { report_id: USAGE_REPORT_ID, provider: "normalized" as const, call: "main" as const, usage: normalizedUsage(usage) };
    const settled = client.reportUsage(preparationId, body, { timeoutMs }).then(
      () => {
        stats.usageReports++;
      },
      (error: unknown) => {
        stats.usageReportFailures++;
        warn(error, { phase: "usage", preparationId });
      },
    );
    pending.add(settled);
    void settled.then(() => pending.delete(settled));
  };

  const tagged = <T extends { providerMetadata?: GenerateResult["providerMetadata"] }>(item: T, preparationId: string): T => ({
    ...item,
    providerMetadata: { ...item.providerMetadata, contextAssembly: { preparationId } },
  });

  return {
    specificationVersion: "v3",
    stats,

    async flush(): Promise<void> {
      while (pending.size > 0) await Promise.all([...pending]);
    },

    async transformParams({ params, type, model }) {
      try {
        const mapping = mapCall(params);
        const extra = options.contributions === undefined ? [] : await options.contributions(params, { type });
        const request: PrepareRequest = {
          ...template,
          instructions: mapping.instructions,
          history: mapping.history,
          input: mapping.input,
          input_format: "neutral",
          tools: mapping.tools,
          contributions: [...(template.contributions ?? []), ...extra],
          render: "neutral",
        };
        if (template.model == null) request.model = model.modelId;
        const prepared = await client.prepare(request, { timeoutMs, signal: params.abortSignal });
        const next = applyFrame(params, mapping, prepared);
        preparations.set(next, prepared.preparation_id);
        stats.prepared++;
        return next;
      } catch (error) {
        if (error instanceof APIUserAbortError) throw error;
        if (!failOpen || (error instanceof APIStatusError && error.status < 500)) throw error;
        stats.failedOpen++;
        warn(error, { phase: "prepare" });
        return params;
      }
    },

    async wrapGenerate({ doGenerate, params }) {
      const result = await doGenerate();
      const preparationId = preparations.get(params);
      if (preparationId === undefined) return result;
      report(preparationId, result.usage);
      return tagged(result, preparationId);
    },

    async wrapStream({ doStream, params }) {
      const result = await doStream();
      const preparationId = preparations.get(params);
      if (preparationId === undefined) return result;
      const stream = result.stream.pipeThrough(
        new TransformStream<StreamPart, StreamPart>({
          transform(part, controller) {
            if (part.type !== "finish") {
              controller.enqueue(part);
              return;
            }
            report(preparationId, part.usage);
            controller.enqueue(tagged(part, preparationId));
          },
        }),
      );
      return { ...result, stream };
    },
  };
}
