/**
 * The AI SDK's prompt and the service's neutral frame, both ways, for the `ai-sdk` middleware
 * (ai 6: the `LanguageModelV3` call options that a `LanguageModelMiddleware` sees).
 *
 * Out, {@link mapCall}: the call's prompt and tools become the host parts of a prepare request.
 *
 * - The leading system messages are `instructions` (joined with a blank line).
 * - `input` is the latest user turn: from the trailing run of user messages that holds the last
 *   user message to the end of the prompt. In a tool loop that is the user's question, the
 *   assistant's tool calls and their results: a call and its results are never split, and the
 *   service's data message (placed before the input) never lands between them. Everything
 *   between the instructions and the input is `history`. A prompt without a user message is all
 *   input.
 * - Text parts are text. Tool calls are the assistant's `tool_calls` (`{id, name, arguments}`);
 *   each tool result is one `{role: "tool", tool_call_id, content}` message. Content the service
 *   cannot count is carried as an opaque part that names it by digest, never by its bytes:
 *   `{type: "image" | "file", media_type, digest}` for files, `{type: "opaque", part, ...}` for
 *   reasoning, approvals and provider-executed results (reasoning with its text, so that it is
 *   counted). The service counts images and files with its conservative constants.
 * - Function tools are `{name, description, parameters}`; provider tools are sent by name only
 *   (the service cannot know what a provider adds for them).
 * - An Anthropic compaction block (a text part whose `providerOptions.anthropic.type` is
 *   `compaction`, as `@ai-sdk/anthropic` returns it) is a `native` part, so that the service
 *   reads the history as the provider does: from the latest compaction on.
 *
 * Back, {@link applyFrame}: the frame's messages and tools, in frame order, as the AI SDK's types.
 *
 * - A frame message equal to one the adapter sent (history and input pass through the service
 *   unchanged) is the caller's own prompt message again, the same object, with its provider
 *   options, file data, reasoning and tool output types intact. Equal messages are matched from
 *   the end, so when the service dropped the oldest history the newest copies are the ones kept.
 * - The messages the service writes are mapped in the terms of the provider the call goes to
 *   ({@link providerTraits}), as the service's own provider renders place them. The leading run
 *   of `system` / `developer` messages (before the first other message) are AI SDK `system`
 *   messages, which every provider sends as its system prompt. A later one (the per-turn
 *   developer message of `stable-prefix` and `transcript`, before the latest user turn) stays a
 *   `system` message for OpenAI, which takes system messages anywhere; for every other provider
 *   (Anthropic's Messages API refuses a system role inside `messages`) it is a `user` message
 *   whose text begins with the marker line `[developer instructions]` (`[system instructions]`),
 *   as the service's `anthropic` render writes it. The data message is a `user` message.
 * - A message the service rewrote (a tool result it cleared, a summary in place of the history it
 *   folded) matches none that was sent: it is mapped as one the service wrote. History it left
 *   out (before a provider's compaction item, folded, dropped) is not in the prompt.
 * - Tools are the caller's own tool objects, in the frame's order.
 * - With a cache plan (`selection.cache`) and an Anthropic model, each breakpoint puts
 *   `providerOptions.anthropic.cacheControl = {type: "ephemeral"}` (`ttl: "1h"` when planned)
 *   on the message it names, and `after: "tools"` on the last function tool; for another
 *   provider the markers are left out (counted). With an OpenAI model, `prompt_cache_key` /
 *   `prompt_cache_retention` become `providerOptions.openai.promptCacheKey` /
 *   `promptCacheRetention` of the call. Options the caller set already are kept as they are.
 */

import { createHash } from "node:crypto";

import type { LanguageModelMiddleware } from "ai";

import { ContextAssemblyError } from "./errors.js";
import type { CacheBreakpoint, CacheReport, Message, NativePart, OpaquePart, PrepareResponse, TextPart, Tool, ToolCall } from "./types.js";

type TransformArgs = Parameters<NonNullable<LanguageModelMiddleware["transformParams"]>>[0];
/** The call options a language model middleware sees (ai 6: `LanguageModelV3CallOptions`). */
export type CallOptions = TransformArgs["params"];
type PromptMessage = CallOptions["prompt"][number];
type SystemMessage = Extract<PromptMessage, { role: "system" }>;
type UserMessage = Extract<PromptMessage, { role: "user" }>;
type AssistantMessage = Extract<PromptMessage, { role: "assistant" }>;
type ToolMessage = Extract<PromptMessage, { role: "tool" }>;
type UserPart = UserMessage["content"][number];
type AssistantPart = AssistantMessage["content"][number];
type ToolPart = ToolMessage["content"][number];
type ContentPart = UserPart | AssistantPart | ToolPart;
type ToolResultOutput = Extract<ContentPart, { type: "tool-result" }>["output"];
type CallTool = NonNullable<CallOptions["tools"]>[number];
type ProviderOptions = NonNullable<CallOptions["providerOptions"]>;

/** `selection.cache` with the fields an adapter reads (the breakpoint's frame message, OpenAI's options). */
type CachePlan = CacheReport & {
  breakpoints: (CacheBreakpoint & { message?: number | null })[];
  prompt_cache_key?: string | null;
  prompt_cache_retention?: string | null;
};

/** The frame could not be carried back into the AI SDK's prompt types (a failure of the adapter). */
export class FrameMappingError extends ContextAssemblyError {}

/** What the model a call goes to takes, read from its AI SDK provider id (`model.provider`). */
export interface ProviderTraits {
  /** The provider id: `anthropic.messages`, `openai.chat`, `openai.responses`, ... */
  provider: string;
  /** A system message after the first turn is sent as one and accepted (OpenAI). */
  laterSystem: boolean;
  /** Reads Anthropic cache markers (`providerOptions.anthropic.cacheControl`). */
  anthropicCache: boolean;
  /** Reads OpenAI's `providerOptions.openai.promptCacheKey` / `promptCacheRetention`. */
  openaiCache: boolean;
}

/**
 * The traits of an AI SDK provider id. `openai.*` (`@ai-sdk/openai`: Chat, Responses) is OpenAI;
 * an id with an `anthropic` segment (`anthropic.messages`, `vertex.anthropic.messages`) is
 * Anthropic. Any other provider is taken to refuse a later system message and to read neither
 * provider's cache options.
 */
export function providerTraits(provider: string): ProviderTraits {
  const segments = provider.toLowerCase().split(".");
  const openai = segments[0] === "openai";
  return { provider, laterSystem: openai, anthropicCache: segments.includes("anthropic"), openaiCache: openai };
}

/** The call options for the frame, and the cache markers of the plan the provider had no place for. */
export interface AppliedFrame {
  params: CallOptions;
  markersSkipped: number;
}

/** Where a neutral message came from: a whole prompt message, or one part of a tool message. */
interface Origin {
  message: PromptMessage;
  part: ToolPart | null;
}

/** The host parts of a prepare request, and what {@link applyFrame} needs to map the frame back. */
export interface CallMapping {
  instructions: string;
  history: Message[];
  input: Message[];
  tools: Tool[];
  /** Canonical form of each message sent → where it came from, in prompt order. */
  origins: Map<string, Origin[]>;
  /** Digest → the part it names, for an opaque part in a message the service wrote itself. */
  opaque: Map<string, ContentPart>;
  /** Canonical item → the part it came from, for a native part in a message the service wrote. */
  native: Map<string, ContentPart>;
  callTools: Map<string, CallTool>;
}

// --------------------------------------------------------------------------- out

function digest(data: unknown): string {
  const hash = createHash("sha256");
  if (data instanceof Uint8Array) hash.update(data);
  else if (data instanceof URL) hash.update(data.href);
  else if (typeof data === "string") hash.update(data);
  else hash.update(JSON.stringify(data, (_key, value: unknown) => (value instanceof Uint8Array ? digest(value) : value)) ?? "");
  return `sha256:${hash.digest("hex")}`;
}

function fileKind(mediaType: string | undefined): "image" | "file" {
  return mediaType?.startsWith("image/") === true ? "image" : "file";
}

function opaquePart(part: ContentPart, mapping: CallMapping): OpaquePart {
  let opaque: OpaquePart;
  if (part.type === "file") {
    opaque = { type: fileKind(part.mediaType), media_type: part.mediaType, digest: digest(part.data) };
  } else if (part.type === "reasoning") {
    opaque = { type: "opaque", part: "reasoning", text: part.text, digest: digest(part.text) };
  } else {
    opaque = { type: "opaque", part: part.type, digest: digest(part) };
  }
  if (!mapping.opaque.has(opaque.digest as string)) mapping.opaque.set(opaque.digest as string, part);
  return opaque;
}

type SentPart = TextPart | OpaquePart | NativePart;

/** An Anthropic compaction block as `@ai-sdk/anthropic` returns it: a text part so marked. */
function isCompaction(part: ContentPart): boolean {
  const anthropic = (part as { providerOptions?: ProviderOptions }).providerOptions?.anthropic;
  return part.type === "text" && anthropic?.type === "compaction";
}

/** The provider's compaction item, as the service reads it (its summary counted). */
function compactionPart(part: Extract<ContentPart, { type: "text" }>, mapping: CallMapping): NativePart {
  const native: NativePart = { type: "native", format: "anthropic", item: { type: "compaction", content: part.text }, text: part.text };
  const key = canonical(native.item);
  if (!mapping.native.has(key)) mapping.native.set(key, part);
  return native;
}

/** A sole text part is sent as a string, anything else as parts. */
function content(parts: SentPart[]): string | SentPart[] {
  const [first] = parts;
  return parts.length === 1 && first?.type === "text" ? (first as TextPart).text : parts;
}

function toolOutputContent(output: ToolResultOutput): string | (TextPart | OpaquePart)[] {
  switch (output.type) {
    case "text":
    case "error-text":
      return output.value;
    case "json":
    case "error-json":
      return JSON.stringify(output.value);
    case "execution-denied":
      return output.reason ?? "";
    case "content":
      return output.value.map((item): TextPart | OpaquePart => {
        switch (item.type) {
          case "text":
            return { type: "text", text: item.text };
          case "image-data":
          case "image-url":
          case "image-file-id":
            return { type: "image", digest: digest(item) };
          case "file-data":
          case "file-url":
          case "file-id":
            return { type: fileKind("mediaType" in item ? item.mediaType : undefined), digest: digest(item) };
          default:
            return { type: "opaque", part: item.type, digest: digest(item) };
        }
      });
    default:
      return JSON.stringify(output);
  }
}

function toolArguments(input: unknown): ToolCall["arguments"] {
  if (typeof input === "string") return input;
  if (input !== null && typeof input === "object" && !Array.isArray(input)) return input as Record<string, unknown>;
  return JSON.stringify(input ?? null);
}

function canonical(value: unknown): string {
  // Sorted keys, no null or undefined fields: the service answers without its unset fields.
  return JSON.stringify(value, (_key, item: unknown) => {
    if (item === null || typeof item !== "object" || Array.isArray(item)) return item;
    const entries = Object.entries(item as Record<string, unknown>).filter(([, v]) => v !== null && v !== undefined);
    return Object.fromEntries(entries.sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
  });
}

function remember(mapping: CallMapping, message: Message, origin: Origin): Message {
  const key = canonical(message);
  const list = mapping.origins.get(key);
  if (list === undefined) mapping.origins.set(key, [origin]);
  else list.push(origin);
  return message;
}

function neutralMessages(message: PromptMessage, mapping: CallMapping): Message[] {
  const whole: Origin = { message, part: null };
  switch (message.role) {
    case "system":
      return [remember(mapping, { role: "system", content: message.content }, whole)];
    case "user": {
      const parts = message.content.map((part) => (part.type === "text" ? { type: "text" as const, text: part.text } : opaquePart(part, mapping)));
      return [remember(mapping, { role: "user", content: content(parts) }, whole)];
    }
    case "assistant": {
      const parts: SentPart[] = [];
      const calls: ToolCall[] = [];
      for (const part of message.content) {
        if (part.type === "text" && isCompaction(part)) parts.push(compactionPart(part, mapping));
        else if (part.type === "text") parts.push({ type: "text", text: part.text });
        else if (part.type === "tool-call") calls.push({ id: part.toolCallId, name: part.toolName, arguments: toolArguments(part.input) });
        else parts.push(opaquePart(part, mapping));
      }
      const neutral: Message = { role: "assistant", content: parts.length === 0 ? "" : content(parts) };
      if (calls.length > 0) neutral.tool_calls = calls;
      return [remember(mapping, neutral, whole)];
    }
    case "tool":
      return message.content.map((part) => {
        const origin: Origin = { message, part };
        if (part.type === "tool-result") {
          return remember(mapping, { role: "tool", content: toolOutputContent(part.output), tool_call_id: part.toolCallId }, origin);
        }
        return remember(mapping, { role: "tool", content: [opaquePart(part, mapping)] }, origin);
      });
  }
}

/** Where the input starts: the trailing run of user messages that holds the last one. */
function inputStart(messages: readonly PromptMessage[]): number {
  let start = -1;
  for (let i = messages.length - 1; i >= 0; i--) {
    if (messages[i]?.role === "user") {
      start = i;
      break;
    }
  }
  if (start === -1) return 0;
  while (start > 0 && messages[start - 1]?.role === "user") start--;
  return start;
}

/** The host parts of the prepare request for one call (see the module comment). */
export function mapCall(params: CallOptions): CallMapping {
  const mapping: CallMapping = { instructions: "", history: [], input: [], tools: [], origins: new Map(), opaque: new Map(), native: new Map(), callTools: new Map() };
  const prompt = params.prompt;
  let leading = 0;
  const system: string[] = [];
  for (; leading < prompt.length; leading++) {
    const message = prompt[leading];
    if (message?.role !== "system") break;
    system.push(message.content);
  }
  mapping.instructions = system.join("\n\n");
  const rest = prompt.slice(leading);
  const start = inputStart(rest);
  mapping.history = rest.slice(0, start).flatMap((message) => neutralMessages(message, mapping));
  mapping.input = rest.slice(start).flatMap((message) => neutralMessages(message, mapping));
  for (const tool of params.tools ?? []) {
    mapping.callTools.set(tool.name, tool);
    mapping.tools.push(
      tool.type === "function"
        ? { name: tool.name, description: tool.description ?? "", parameters: { ...tool.inputSchema } as Record<string, unknown> }
        : { name: tool.name },
    );
  }
  return mapping;
}

// --------------------------------------------------------------------------- back

function textOf(value: Message["content"], index: number): string {
  if (value === undefined) return "";
  if (typeof value === "string") return value;
  return value
    .map((part) => {
      if (part.type !== "text") throw new FrameMappingError(`frame.messages[${index}] has a ${part.type} part where the AI SDK takes text only`);
      return (part as TextPart).text;
    })
    .join("\n");
}

function partsOf(message: Message, index: number, mapping: CallMapping): ContentPart[] {
  if (message.content === undefined || typeof message.content === "string") {
    return message.content ? [{ type: "text", text: message.content }] : [];
  }
  return message.content.map((part) => {
    if (part.type === "text") return { type: "text", text: (part as TextPart).text };
    if (part.type === "native") {
      const sent = mapping.native.get(canonical((part as NativePart).item));
      if (sent === undefined) throw new FrameMappingError(`frame.messages[${index}] has a native part the adapter did not send`);
      return sent;
    }
    const original = mapping.opaque.get(String((part as OpaquePart).digest));
    if (original === undefined) throw new FrameMappingError(`frame.messages[${index}] has a ${part.type} part the adapter did not send`);
    return original;
  });
}

/**
 * A frame message that is not one the adapter sent (the service wrote it), in the AI SDK's types.
 * `leading`: it is in the frame's leading run of system and developer messages.
 */
function promptMessage(message: Message, index: number, mapping: CallMapping, leading: boolean, traits: ProviderTraits): PromptMessage {
  switch (message.role) {
    case "system":
    case "developer": {
      const text = textOf(message.content, index);
      if (leading || traits.laterSystem) return { role: "system", content: text } satisfies SystemMessage;
      return { role: "user", content: [{ type: "text", text: `[${message.role} instructions]\n${text}` }] } satisfies UserMessage;
    }
    case "user":
      return { role: "user", content: partsOf(message, index, mapping) as UserPart[] } satisfies UserMessage;
    case "assistant": {
      const calls = (message.tool_calls ?? []).map((call): AssistantPart => {
        let input: unknown = call.arguments ?? "";
        if (typeof input === "string") {
          try {
            input = input === "" ? {} : (JSON.parse(input) as unknown);
          } catch {
            // not JSON: kept as the string it is
          }
        }
        return { type: "tool-call", toolCallId: call.id, toolName: call.name, input };
      });
      return { role: "assistant", content: [...(partsOf(message, index, mapping) as AssistantPart[]), ...calls] } satisfies AssistantMessage;
    }
    case "tool":
      throw new FrameMappingError(`frame.messages[${index}] is a tool message`); // handled by toolResult
  }
}

/** A tool message that is not one the adapter sent, as an AI SDK tool result. */
function toolResult(message: Message, index: number, callNames: Map<string, string>): ToolPart {
  const id = message.tool_call_id;
  if (id === undefined || id === null) throw new FrameMappingError(`frame.messages[${index}] is a tool message without tool_call_id`);
  return {
    type: "tool-result",
    toolCallId: id,
    toolName: callNames.get(id) ?? message.name ?? "",
    output: { type: "text", value: textOf(message.content, index) },
  };
}

function withCacheControl<T extends { providerOptions?: ProviderOptions | undefined }>(item: T, ttl: string): T {
  const cacheControl = ttl === "1h" ? { type: "ephemeral", ttl: "1h" } : { type: "ephemeral" };
  const anthropic = { cacheControl, ...item.providerOptions?.anthropic };
  return { ...item, providerOptions: { ...item.providerOptions, anthropic } };
}

/** Where frame message `i` ended up: the prompt message, and its last part when it does not end it. */
interface Placement {
  message: number;
  lastPart: number;
}

/**
 * The call options with the frame's messages and tools (and the cache plan's provider options,
 * for the provider `traits` describe) in place of the caller's. Throws
 * {@link FrameMappingError} when the frame holds something the adapter cannot carry back.
 */
export function applyFrame(
  params: CallOptions,
  mapping: CallMapping,
  prepared: Pick<PrepareResponse, "frame" | "selection">,
  traits: ProviderTraits,
): AppliedFrame {
  const frameMessages = prepared.frame.messages;
  const frameTools = prepared.frame.tools ?? [];
  if (!Array.isArray(frameMessages) || !Array.isArray(frameTools)) throw new FrameMappingError("the frame is not a neutral frame");
  const messages = frameMessages as Message[];
  const tools = frameTools as Tool[];

  // Match the frame's messages with the ones sent, newest first (dropped history is the oldest).
  const queues = new Map([...mapping.origins].map(([key, list]) => [key, [...list]]));
  const matched: (Origin | null)[] = messages.map(() => null);
  for (let i = messages.length - 1; i >= 0; i--) matched[i] = queues.get(canonical(messages[i]))?.pop() ?? null;

  const callNames = new Map<string, string>();
  for (const message of messages) for (const call of message.tool_calls ?? []) callNames.set(call.id, call.name);

  // The leading run of system and developer messages: the provider's system prompt.
  let leadingRun = 0;
  while (leadingRun < messages.length && (messages[leadingRun]?.role === "system" || messages[leadingRun]?.role === "developer")) leadingRun++;

  const prompt: PromptMessage[] = [];
  const placements: Placement[] = [];
  const rebuilt: { at: number; source: ToolMessage }[] = [];
  let open: { source: ToolMessage | null; message: ToolMessage } | null = null; // the tool message being filled
  for (const [index, message] of messages.entries()) {
    const origin = matched[index] ?? null;
    if (origin !== null && origin.part === null) {
      open = null;
      prompt.push(origin.message); // a whole message of the caller's
    } else if (origin === null && message.role !== "tool") {
      open = null;
      prompt.push(promptMessage(message, index, mapping, index < leadingRun, traits)); // written by the service
    } else {
      // A tool result: consecutive results of one caller's tool message (or of none) are one again.
      const source = origin === null ? null : (origin.message as ToolMessage);
      const part = origin?.part ?? toolResult(message, index, callNames);
      if (open !== null && open.source === source) {
        open.message.content.push(part);
      } else {
        open = { source, message: { ...(source ?? { role: "tool" }), content: [part] } };
        if (source !== null) rebuilt.push({ at: prompt.length, source });
        prompt.push(open.message);
      }
    }
    const last = prompt[prompt.length - 1] as PromptMessage;
    placements.push({ message: prompt.length - 1, lastPart: typeof last.content === "string" ? 0 : last.content.length - 1 });
  }
  // A tool message rebuilt whole is the caller's own object again.
  for (const { at, source } of rebuilt) {
    const item = prompt[at] as ToolMessage;
    if (item.content.length === source.content.length && item.content.every((part, n) => part === source.content[n])) prompt[at] = source;
  }

  const plan = (prepared.selection.cache ?? null) as CachePlan | null;
  const breakpoints = plan?.breakpoints ?? [];
  const markers = traits.anthropicCache ? breakpoints : [];
  for (const breakpoint of markers) {
    if (breakpoint.message === undefined || breakpoint.message === null) continue;
    const placement = placements[breakpoint.message];
    const target = placement === undefined ? undefined : prompt[placement.message];
    if (placement === undefined || target === undefined) throw new FrameMappingError(`a cache breakpoint names frame.messages[${breakpoint.message}], which does not exist`);
    const endsMessage = typeof target.content === "string" || placement.lastPart >= target.content.length - 1;
    if (endsMessage) {
      prompt[placement.message] = withCacheControl(target, breakpoint.ttl);
    } else {
      const parts = [...(target.content as ContentPart[])];
      parts[placement.lastPart] = withCacheControl(parts[placement.lastPart] as ContentPart, breakpoint.ttl);
      prompt[placement.message] = { ...target, content: parts } as PromptMessage;
    }
  }

  const callTools = tools.map((tool) => {
    const original = mapping.callTools.get(tool.name);
    if (original === undefined) throw new FrameMappingError(`frame.tools names ${JSON.stringify(tool.name)}, a tool the call does not have`);
    return original;
  });
  let markersSkipped = breakpoints.length - markers.length;
  const toolsMarker = markers.find((breakpoint) => breakpoint.after === "tools");
  const lastTool = callTools.at(-1);
  // Provider tools carry no provider options in the AI SDK: no marker can go on one.
  if (toolsMarker !== undefined) {
    if (lastTool?.type === "function") callTools[callTools.length - 1] = withCacheControl(lastTool, toolsMarker.ttl);
    else markersSkipped++;
  }

  const next: CallOptions = { ...params, prompt };
  if (params.tools !== undefined || callTools.length > 0) next.tools = callTools;
  const key = plan?.prompt_cache_key ?? undefined;
  const retention = plan?.prompt_cache_retention ?? undefined;
  if (traits.openaiCache && (key !== undefined || retention !== undefined)) {
    const openai: Record<string, string> = {};
    if (key !== undefined) openai.promptCacheKey = key;
    if (retention !== undefined) openai.promptCacheRetention = retention;
    next.providerOptions = { ...params.providerOptions, openai: { ...openai, ...params.providerOptions?.openai } };
  }
  return { params: next, markersSkipped };
}
