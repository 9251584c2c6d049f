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
 *    puts the frame in place of the prompt and tools, in the terms of the wrapped model's
 *    provider (`model.provider`), with the cache plan's options for that provider only, and the
 *    output limit the budget reserved as `maxOutputTokens` (unless the call set a smaller one).
 *    The request's `model` is the wrapped model's `modelId` unless the template names one; its
 *    layout is `transcript` unless the template's `assembly` names one.
 * 2. `wrapGenerate` / `wrapStream` let the model answer, then report its usage to the service in
 *    the background (`call: "main"`, the AI SDK's usage as the `normalized` shape, the
 *    provider's response id as `response_id`), when the answer (or the stream's `finish` part)
 *    arrives. A failed report never touches the answer: it is passed to `onError` (else
 *    `console.warn`) and counted in `stats.usageReportFailures`. The answer's
 *    `providerMetadata.contextAssembly` names the preparation (`preparationId`) and carries its
 *    compaction decision (`compaction`).
 *
 * Compaction (docs/integrations.md#compaction): each decision goes to `onCompaction` when it is
 * not `none`. `mode: "native"` needs a provider render, which the middleware cannot ask for: the
 * service decides as in `report` and, for an Anthropic model, the middleware puts Anthropic's
 * compaction edit in `providerOptions.anthropic.contextManagement` (`@ai-sdk/anthropic` adds its
 * beta header); any other provider goes without it (`onError` phase `compaction`, once per
 * provider, and `stats.nativeCompactionSkipped`). {@link foldedMessages} puts a summary
 * (`summarize`) in place of the messages it folded, in the application's own messages.
 *
 * Failures of the service fail open by default: no answer, no answer within `timeoutMs`, a 5xx,
 * or a call or frame the adapter cannot map → one warning, and the call goes on with its
 * original prompt. A mapping failure is a bug of the adapter: its warning carries the error's
 * stack frames (never its message, which may quote the conversation) and
 * `stats.mappingFailures` counts it. `failOpen: false` throws them instead. A 4xx answer (a bad
 * template, an overflow that no selection can fix) always throws, and so does the caller's own
 * abort.
 */

import type { LanguageModelMiddleware } from "ai";

import { ContextAssemblyClient } from "./client.js";
import { APIStatusError, APIUserAbortError, ContextAssemblyError } from "./errors.js";
import { applyFrame, mapCall, providerTraits, type CallOptions, type ProviderTraits } from "./ai-sdk-frame.js";
import type { CompactionReport, Contribution, NativeDirective, PrepareRequest, UsageRequest } from "./types.js";

export { FrameMappingError, providerTraits, type CallOptions, type ProviderTraits } from "./ai-sdk-frame.js";

type WrapGenerateArgs = Parameters<NonNullable<LanguageModelMiddleware["wrapGenerate"]>>[0];
type GenerateResult = Awaited<ReturnType<WrapGenerateArgs["doGenerate"]>>;
type StreamResult = Awaited<ReturnType<WrapGenerateArgs["doStream"]>>;
type StreamPart = StreamResult["stream"] extends ReadableStream<infer Part> ? Part : never;
type Usage = GenerateResult["usage"];
type ProviderMetadata = GenerateResult["providerMetadata"];

/** The adapter's deadline for one prepare when none is given, in milliseconds. */
export const DEFAULT_PREPARE_TIMEOUT_MS = 5_000;
/** The `report_id` of the one `main` usage report each preparation gets. */
export const USAGE_REPORT_ID = "ai-sdk-main";

/** The layout a prepare gets when the template's `assembly` names none. */
export const DEFAULT_LAYOUT = "transcript";

/** Anthropic's compaction edit, the beta it needs and its least trigger, as the service's `anthropic` render writes them. */
export const ANTHROPIC_COMPACTION_EDIT = "compact_20260112";
export const ANTHROPIC_COMPACTION_BETA = "compact-2026-01-12";
export const ANTHROPIC_MIN_THRESHOLD = 50_000;

/** `mode: "native"` for a model whose provider has no place for its compaction in the AI SDK (named in the message). */
export class NativeCompactionUnsupportedError extends ContextAssemblyError {}

/**
 * Everything of a prepare request except the parts the call supplies (`instructions`, `history`,
 * `input` in the neutral shape, `tools`), `render` (always `neutral`) and managed routing
 * (`models`, `routing`: the AI SDK calls the model it wraps, whatever a routing would choose).
 * Without `model`, the wrapped model's `modelId` is the `model`; without `assembly.layout`, the
 * layout is `transcript`.
 */
export type PrepareTemplate = Omit<PrepareRequest, "instructions" | "history" | "input" | "input_format" | "tools" | "render" | "models" | "routing">;

export interface CallInfo {
  type: "generate" | "stream";
  /** The wrapped model's AI SDK provider id (`anthropic.messages`, `openai.chat`, ...). */
  provider: string;
  /** The wrapped model's id. */
  modelId: string;
}

/** Inline blocks for one call, e.g. read from the application's own store. */
export type ContributionsFunction = (params: CallOptions, info: CallInfo) => Contribution[] | PromiseLike<Contribution[]>;

export interface ErrorInfo {
  /**
   * `prepare`: the service or the application's `contributions` failed before the model call;
   * `mapping`: the adapter could not map the call or the frame (a bug of the adapter); in both
   * the call went on with its original prompt. `usage`: the report after the call.
   * `compaction`: `mode: "native"` for a provider that has no place for it; the call went on
   * prepared, without the provider's compaction (once per provider).
   */
  phase: "prepare" | "mapping" | "usage" | "compaction";
  preparationId?: string;
  /** For `mapping`: the error's stack frames (`at ...` lines), without its message. */
  frames?: string[];
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
  /** Receives each call's compaction decision (`selection.compaction`, as `providerMetadata` carries it) when it is not `none`. */
  onCompaction?: (compaction: CompactionReport, info: CallInfo & { preparationId: string }) => void;
}

export type ContextAssemblyMiddlewareOptions = CommonOptions &
  ({ client: ContextAssemblyClient; baseUrl?: undefined; apiKey?: undefined } | { baseUrl: string; apiKey?: string; client?: undefined });

export interface ContextAssemblyMiddlewareStats {
  /** Calls whose prompt came from a preparation. */
  prepared: number;
  /** Calls that went on with their original prompt because the service or the adapter failed. */
  failedOpen: number;
  /** Calls whose prompt or frame the adapter failed to map (thrown or failed open). */
  mappingFailures: number;
  /** Anthropic cache markers of a plan left out: the model's provider does not read them, or the last tool is a provider tool. */
  cacheMarkersSkipped: number;
  /** Calls of `mode: "native"` whose provider has no place for its compaction: they went out without it. */
  nativeCompactionSkipped: number;
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

/** The `at ...` lines of an error's stack: where it was thrown, without its message. */
function stackFrames(error: unknown): string[] {
  const stack = error instanceof Error ? error.stack : undefined;
  if (typeof stack !== "string") return [];
  return stack
    .split("\n")
    .filter((line) => /^\s+at /.test(line))
    .map((line) => line.trim());
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

/**
 * The provider's cache diagnostics object of a response, when it returned one: OpenAI's
 * `prompt_cache_diagnostics` (`providerMetadata.openai.promptCacheDiagnostics`, or the raw body
 * of a generated answer), Anthropic's `diagnostics` (the raw body of a generated answer).
 */
function cacheDiagnostics(traits: ProviderTraits, providerMetadata: ProviderMetadata, body?: unknown): Record<string, unknown> | undefined {
  let found: unknown;
  if (traits.openaiCache) {
    const openai = providerMetadata?.openai;
    found = isPlainObject(openai) && isPlainObject(openai.promptCacheDiagnostics) ? openai.promptCacheDiagnostics : isPlainObject(body) ? body.prompt_cache_diagnostics : undefined;
  } else if (traits.anthropicCache) {
    found = isPlainObject(body) ? body.diagnostics : undefined;
  }
  return isPlainObject(found) ? found : undefined;
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

/** The provider's compaction at the decision's trigger, as the service's `anthropic` render writes it. */
function anthropicDirective(report: CompactionReport): NativeDirective {
  return { parameter: "context_management", threshold_tokens: Math.max(report.trigger_tokens, ANTHROPIC_MIN_THRESHOLD), beta: ANTHROPIC_COMPACTION_BETA };
}

/** The call's Anthropic options with the compaction edit in `contextManagement` (edits the caller set are kept; a compaction edit of theirs wins). */
function withCompactionEdit(params: CallOptions, directive: NativeDirective): NonNullable<CallOptions["providerOptions"]> {
  const anthropic = params.providerOptions?.anthropic ?? {};
  const current = isPlainObject(anthropic.contextManagement) ? anthropic.contextManagement : {};
  const edits = Array.isArray(current.edits) ? [...current.edits] : [];
  if (!edits.some((edit) => isPlainObject(edit) && edit.type === ANTHROPIC_COMPACTION_EDIT)) {
    edits.push({ type: ANTHROPIC_COMPACTION_EDIT, trigger: { type: "input_tokens", value: directive.threshold_tokens } });
  }
  return { ...params.providerOptions, anthropic: { ...anthropic, contextManagement: { ...current, edits } } };
}

/**
 * `messages` with a summary in place of the messages it folded (`mode: "summarize"`: the
 * decision in `providerMetadata.contextAssembly.compaction` with a `summary`), for the
 * application to send from then on. The messages are those the model call was made with
 * (the conversation it sent, `response.messages` appended): leading system messages stay; after
 * them every message counts as one, a tool message as one per tool result, as the middleware
 * sends them. Unchanged when the decision folded nothing.
 */
export function foldedMessages<M extends { role: string; content: unknown }>(messages: readonly M[], compaction: Pick<CompactionReport, "folded_from" | "folded_messages" | "summary"> | null | undefined): (M | { role: "user"; content: string })[] {
  const folded = compaction?.folded_messages ?? 0;
  const summary = compaction?.summary;
  if (folded <= 0 || summary === null || summary === undefined) return [...messages];
  let start = 0;
  while (start < messages.length && messages[start]?.role === "system") start++;
  let skipped = 0; // the history messages before the folded ones (`folded_from`)
  while (start < messages.length && skipped < (compaction?.folded_from ?? 0)) {
    const message = messages[start] as M;
    skipped += message.role === "tool" && Array.isArray(message.content) ? message.content.length : 1;
    start++;
  }
  let counted = 0;
  let end = start;
  while (end < messages.length && counted < folded) {
    const message = messages[end] as M;
    counted += message.role === "tool" && Array.isArray(message.content) ? message.content.length : 1;
    end++;
  }
  if (counted !== folded) return [...messages]; // not the conversation the decision was made for
  const text = typeof summary.content === "string" ? summary.content : "";
  return [...messages.slice(0, start), { role: "user", content: text }, ...messages.slice(end)];
}

export function contextAssemblyMiddleware(options: ContextAssemblyMiddlewareOptions): ContextAssemblyMiddleware {
  const client = options.client ?? new ContextAssemblyClient({ baseUrl: options.baseUrl, apiKey: options.apiKey });
  const failOpen = options.failOpen ?? true;
  const timeoutMs = options.timeoutMs ?? DEFAULT_PREPARE_TIMEOUT_MS;
  const template = options.template;
  const stats: ContextAssemblyMiddlewareStats = {
    prepared: 0,
    failedOpen: 0,
    mappingFailures: 0,
    cacheMarkersSkipped: 0,
    nativeCompactionSkipped: 0,
    usageReports: 0,
    usageReportFailures: 0,
  };
  // transformed params → the preparation id and its compaction decision
  const preparations = new WeakMap<CallOptions, { id: string; compaction: CompactionReport | undefined }>();
  const native = template.assembly?.compaction?.mode === "native";
  const warnedNative = new Set<string>(); // provider ids warned about
  const pending = new Set<Promise<void>>();

  const warn = (error: unknown, info: ErrorInfo): void => {
    if (options.onError === undefined) {
      let line: string;
      if (info.phase === "usage") line = `usage report for ${info.preparationId} failed (${describe(error)})`;
      else if (info.phase === "prepare") line = `prepare failed; the model call goes on with its original prompt (${describe(error)})`;
      else if (info.phase === "compaction") line = `${error instanceof Error ? error.message : describe(error)}`;
      else {
        const frames = (info.frames ?? []).map((frame) => `\n    ${frame}`).join("");
        line = `mapping the call failed (a bug of the adapter); the model call goes on with its original prompt (${describe(error)})${frames}`;
      }
      console.warn(`context-assembly: ${line}`);
      return;
    }
    try {
      options.onError(error, info);
    } catch (hookError) {
      console.warn(`context-assembly: onError threw (${describe(hookError)})`);
    }
  };

  const report = (preparationId: string, usage: Usage, responseId: string | undefined, diagnostics: Record<string, unknown> | undefined): void => {
    const body: UsageRequest = { report_id: USAGE_REPORT_ID, provider: "normalized", call: "main", usage: normalizedUsage(usage) };
    if (responseId !== undefined && responseId !== "") body.response_id = responseId;
    if (diagnostics !== undefined) body.diagnostics = diagnostics;
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

  const tagged = <T extends { providerMetadata?: ProviderMetadata }>(item: T, preparation: { id: string; compaction: CompactionReport | undefined }): T => {
    const contextAssembly: Record<string, NonNullable<ProviderMetadata>[string][string]> = { preparationId: preparation.id };
    if (preparation.compaction !== undefined) contextAssembly.compaction = JSON.parse(JSON.stringify(preparation.compaction)) as NonNullable<ProviderMetadata>[string][string];
    return { ...item, providerMetadata: { ...item.providerMetadata, contextAssembly } };
  };

  return {
    specificationVersion: "v3",
    stats,

    async flush(): Promise<void> {
      while (pending.size > 0) await Promise.all([...pending]);
    },

    async transformParams({ params, type, model }) {
      // Which part failed: the adapter's own mapping (a bug), or the service and contributions.
      let phase: "mapping" | "prepare" = "mapping";
      let preparationId: string | undefined;
      let next: CallOptions;
      let compaction: CompactionReport | undefined;
      let skippedNative = false;
      try {
        const traits = providerTraits(model.provider);
        const mapping = mapCall(params);
        phase = "prepare";
        const extra = options.contributions === undefined ? [] : await options.contributions(params, { type, provider: model.provider, modelId: model.modelId });
        const assembly = { ...template.assembly, layout: template.assembly?.layout ?? DEFAULT_LAYOUT };
        // A neutral frame has no provider body for the native directive (the service refuses
        // "native" without a provider render): the service decides as in "report" and the
        // middleware writes the directive where the provider takes it.
        if (native && assembly.compaction) assembly.compaction = { ...assembly.compaction, mode: "report" };
        const request: PrepareRequest = {
          ...template,
          instructions: mapping.instructions,
          history: mapping.history,
          input: mapping.input,
          input_format: "neutral",
          tools: mapping.tools,
          contributions: [...(template.contributions ?? []), ...extra],
          assembly,
          render: "neutral",
        };
        if (template.model == null) request.model = model.modelId;
        const prepared = await client.prepare(request, { timeoutMs, signal: params.abortSignal });
        phase = "mapping";
        preparationId = prepared.preparation_id;
        const applied = applyFrame(params, mapping, prepared, traits);
        next = applied.params;
        // The output limit the budget reserved (input plus it fit the window), unless the call asked for less.
        const reserve = prepared.budget.response_reserve + prepared.budget.reasoning_reserve_tokens;
        if (params.maxOutputTokens === undefined || params.maxOutputTokens > reserve) next.maxOutputTokens = reserve;
        compaction = prepared.selection.compaction ?? undefined;
        if (native && compaction !== undefined) {
          if (traits.anthropicCache) {
            const directive = anthropicDirective(compaction);
            next.providerOptions = withCompactionEdit(next, directive);
            compaction = { ...compaction, mode: "native", native: directive };
          } else {
            compaction = { ...compaction, mode: "native", native: null };
            skippedNative = true;
          }
        }
        preparations.set(next, { id: prepared.preparation_id, compaction });
        stats.prepared++;
        stats.cacheMarkersSkipped += applied.markersSkipped;
      } catch (error) {
        if (error instanceof APIUserAbortError) throw error;
        const mappingFailed = phase === "mapping";
        if (mappingFailed) stats.mappingFailures++;
        if (!failOpen || (error instanceof APIStatusError && error.status < 500)) throw error;
        stats.failedOpen++;
        if (mappingFailed) {
          const info: ErrorInfo = { phase: "mapping", frames: stackFrames(error) };
          if (preparationId !== undefined) info.preparationId = preparationId;
          warn(error, info);
        } else {
          warn(error, { phase: "prepare" });
        }
        return params;
      }
      if (skippedNative) {
        stats.nativeCompactionSkipped++;
        if (!warnedNative.has(model.provider)) {
          warnedNative.add(model.provider);
          const message = `compaction mode "native" has no place in calls to ${model.provider}; they go out without the provider's compaction`;
          warn(new NativeCompactionUnsupportedError(message), { phase: "compaction", preparationId });
        }
      }
      // The application's own callback: what it throws is its own, never caught here.
      if (compaction !== undefined && compaction.decision !== "none" && options.onCompaction !== undefined) {
        options.onCompaction(compaction, { type, provider: model.provider, modelId: model.modelId, preparationId: preparationId as string });
      }
      return next;
    },

    async wrapGenerate({ doGenerate, params, model }) {
      const result = await doGenerate();
      const preparation = preparations.get(params);
      if (preparation === undefined) return result;
      const diagnostics = cacheDiagnostics(providerTraits(model.provider), result.providerMetadata, result.response?.body);
      report(preparation.id, result.usage, result.response?.id, diagnostics);
      return tagged(result, preparation);
    },

    async wrapStream({ doStream, params, model }) {
      const result = await doStream();
      const preparation = preparations.get(params);
      if (preparation === undefined) return result;
      const traits = providerTraits(model.provider);
      let responseId: string | undefined;
      const stream = result.stream.pipeThrough(
        new TransformStream<StreamPart, StreamPart>({
          transform(part, controller) {
            if (part.type === "response-metadata" && part.id !== undefined) responseId = part.id;
            if (part.type !== "finish") {
              controller.enqueue(part);
              return;
            }
            report(preparation.id, part.usage, responseId, cacheDiagnostics(traits, part.providerMetadata));
            controller.enqueue(tagged(part, preparation));
          },
        }),
      );
      return { ...result, stream };
    },
  };
}
