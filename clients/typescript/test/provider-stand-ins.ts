// Loopback stand-ins of the providers' HTTP APIs, for the AI SDK's real provider classes
// (`@ai-sdk/anthropic`, `@ai-sdk/openai`) pointed at them with `baseURL`: a real HTTP server on
// 127.0.0.1 that answers Anthropic Messages (`POST /v1/messages`), OpenAI Chat Completions
// (`POST /v1/chat/completions`) and OpenAI Responses (`POST /v1/responses`), each as JSON or, when
// the body asks for `stream: true`, as server-sent events, and records every request body.
//
// The answers follow a script that makes a tool loop: while the conversation's last assistant
// turn has no tool result after it, the model calls the `weather` tool for the city named in the
// latest user text ("... in Oslo?"); once the results are there, it answers in text. An
// Anthropic request that asks for compaction (`context_management`) while its conversation holds
// no compaction block yet is answered as one that crossed the threshold: the answer opens with a
// `compaction` block whose summary is `COMPACTED`.

import type { IncomingMessage, Server, ServerResponse } from "node:http";

import { close, listen } from "./support.js";

export type Api = "anthropic" | "openai-chat" | "openai-responses";

// The parts of the request bodies the stand-ins and the tests read.

export interface AnthropicBlock {
  type: string;
  text?: string;
  id?: string;
  name?: string;
  input?: unknown;
  tool_use_id?: string;
  content?: unknown;
  cache_control?: unknown;
}
export interface AnthropicMessage {
  role: string;
  content: string | AnthropicBlock[];
}
export interface AnthropicBody {
  model: string;
  max_tokens?: number;
  system?: string | AnthropicBlock[];
  messages: AnthropicMessage[];
  tools?: { name: string; cache_control?: unknown }[];
  stream?: boolean;
  context_management?: unknown;
}

export interface ChatMessage {
  role: string;
  content?: string | { type: string; text?: string }[] | null;
  tool_calls?: { id: string; type: string; function: { name: string; arguments: string } }[];
  tool_call_id?: string;
}
export interface ChatBody {
  model: string;
  messages: ChatMessage[];
  max_tokens?: number;
  max_completion_tokens?: number;
  prompt_cache_key?: string;
  stream?: boolean;
}

export interface ResponsesItem {
  type?: string;
  role?: string;
  id?: string;
  content?: string | { type: string; text?: string }[];
  call_id?: string;
  name?: string;
  arguments?: string;
  output?: unknown;
}
export interface ResponsesBody {
  model: string;
  input: ResponsesItem[];
  max_output_tokens?: number;
  prompt_cache_key?: string;
  stream?: boolean;
}

export interface Recorded {
  api: Api;
  body: AnthropicBody | ChatBody | ResponsesBody;
  /** The id the stand-in gave its answer (`msg_…`, `chatcmpl-…`, `resp_…`). */
  responseId: string;
  /** The request's headers (lower-case names). */
  headers: Record<string, string>;
}

/** The summary of the compaction block the Anthropic stand-in opens an answer with when asked to compact. */
export const COMPACTED = "The user asked about the weather; it rains.";

/** The usage every answer reports. */
export const STAND_IN_USAGE = { input: 1500, output: 20 };
/** The cache diagnostics object the Responses stand-in returns (OpenAI's `prompt_cache_diagnostics`). */
export const RESPONSES_DIAGNOSTICS = { type: "prefix_mismatch", reason: "stand-in", cache_missed_tokens: 0, comparison_reusable_tokens: 1024 };

export interface StandIn {
  /** `http://127.0.0.1:<port>/v1`: the provider's `baseURL`. */
  baseURL: string;
  requests: Recorded[];
  /** Every output item the Responses stand-in gave, by id (what an `item_reference` names). */
  issued: Map<string, ResponsesItem>;
  close(): Promise<void>;
}

/** The answer the script gives: a call of `weather`, or the final text. */
type Answer = { kind: "tool"; callId: string; city: string } | { kind: "text"; text: string };

function textsOf(content: unknown): string[] {
  if (typeof content === "string") return [content];
  if (!Array.isArray(content)) return [];
  return content.flatMap((part: unknown) => {
    const text = (part as { text?: unknown } | null)?.text;
    return typeof text === "string" ? [text] : [];
  });
}

function cityOf(texts: string[]): string {
  for (const text of [...texts].reverse()) {
    const match = /\bin ([A-Z][\p{L}]+)\?/u.exec(text);
    if (match?.[1] !== undefined) return match[1];
  }
  return "Nowhere";
}

/** The script: results after the last assistant turn → text; else a tool call. */
function answer(n: number, afterAssistantHasResults: boolean, userTexts: string[], results: string[]): Answer {
  if (afterAssistantHasResults) return { kind: "text", text: `Forecast: ${results.join("; ")}.` };
  return { kind: "tool", callId: `call_${n}`, city: cityOf(userTexts) };
}

function anthropicAnswer(body: AnthropicBody, n: number): Answer {
  const messages = body.messages;
  const lastAssistant = messages.map((m) => m.role).lastIndexOf("assistant");
  const after = messages.slice(lastAssistant + 1).flatMap((m) => (typeof m.content === "string" ? [] : m.content));
  const results = after.filter((block) => block.type === "tool_result").flatMap((block) => textsOf(block.content));
  const userTexts = messages.filter((m) => m.role === "user").flatMap((m) => textsOf(m.content));
  return answer(n, results.length > 0, userTexts, results);
}

function chatAnswer(body: ChatBody, n: number): Answer {
  const messages = body.messages;
  const lastAssistant = messages.map((m) => m.role).lastIndexOf("assistant");
  const results = messages.slice(lastAssistant + 1).filter((m) => m.role === "tool").flatMap((m) => textsOf(m.content));
  const userTexts = messages.filter((m) => m.role === "user").flatMap((m) => textsOf(m.content));
  return answer(n, results.length > 0, userTexts, results);
}

function responsesAnswer(body: ResponsesBody, n: number): Answer {
  const items = body.input;
  let lastAssistant = -1;
  items.forEach((item, i) => {
    if (item.role === "assistant" || item.type === "function_call" || item.type === "item_reference") lastAssistant = i;
  });
  const results = items.slice(lastAssistant + 1).flatMap((item) => (item.type === "function_call_output" ? [String(item.output)] : []));
  const userTexts = items.filter((item) => item.role === "user").flatMap((item) => textsOf(item.content));
  return answer(n, results.length > 0, userTexts, results);
}

function sse(response: ServerResponse, events: { event?: string; data: unknown }[], done = false): void {
  response.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
  for (const { event, data } of events) response.write(`${event === undefined ? "" : `event: ${event}\n`}data: ${JSON.stringify(data)}\n\n`);
  if (done) response.write("data: [DONE]\n\n");
  response.end();
}

function json(response: ServerResponse, status: number, data: unknown): void {
  response.writeHead(status, { "content-type": "application/json" });
  response.end(JSON.stringify(data));
}

function anthropicReply(response: ServerResponse, body: AnthropicBody, id: string, reply: Answer): void {
  const usage = { input_tokens: STAND_IN_USAGE.input, output_tokens: STAND_IN_USAGE.output, cache_creation_input_tokens: 0, cache_read_input_tokens: 0 };
  const block = reply.kind === "tool" ? { type: "tool_use", id: `toolu_${reply.callId}`, name: "weather", input: { city: reply.city } } : { type: "text", text: reply.text };
  const stopReason = reply.kind === "tool" ? "tool_use" : "end_turn";
  const compacts = body.context_management !== undefined && !JSON.stringify(body.messages).includes('"type":"compaction"');
  if (body.stream !== true) {
    json(response, 200, {
      id,
      type: "message",
      role: "assistant",
      model: body.model,
      content: compacts ? [{ type: "compaction", content: COMPACTED }, block] : [block],
      stop_reason: stopReason,
      stop_sequence: null,
      usage,
      diagnostics: { stand_in: true },
    });
    return;
  }
  const start = reply.kind === "tool" ? { ...block, input: {} } : { type: "text", text: "" };
  const delta =
    reply.kind === "tool" ? { type: "input_json_delta", partial_json: JSON.stringify({ city: reply.city }) } : { type: "text_delta", text: reply.text };
  sse(response, [
    {
      event: "message_start",
      data: {
        type: "message_start",
        message: { id, type: "message", role: "assistant", model: body.model, content: [], stop_reason: null, stop_sequence: null, usage: { ...usage, output_tokens: 1 } },
      },
    },
    { event: "content_block_start", data: { type: "content_block_start", index: 0, content_block: start } },
    { event: "content_block_delta", data: { type: "content_block_delta", index: 0, delta } },
    { event: "content_block_stop", data: { type: "content_block_stop", index: 0 } },
    { event: "message_delta", data: { type: "message_delta", delta: { stop_reason: stopReason, stop_sequence: null }, usage: { output_tokens: STAND_IN_USAGE.output } } },
    { event: "message_stop", data: { type: "message_stop" } },
  ]);
}

function chatReply(response: ServerResponse, body: ChatBody, id: string, reply: Answer): void {
  const created = Math.floor(Date.now() / 1000);
  const usage = {
    prompt_tokens: STAND_IN_USAGE.input,
    completion_tokens: STAND_IN_USAGE.output,
    total_tokens: STAND_IN_USAGE.input + STAND_IN_USAGE.output,
    prompt_tokens_details: { cached_tokens: 0 },
  };
  const call = reply.kind === "tool" ? { id: reply.callId, type: "function", function: { name: "weather", arguments: JSON.stringify({ city: reply.city }) } } : null;
  const finish = reply.kind === "tool" ? "tool_calls" : "stop";
  if (body.stream !== true) {
    const message = call === null ? { role: "assistant", content: (reply as { text: string }).text } : { role: "assistant", content: null, tool_calls: [call] };
    json(response, 200, { id, object: "chat.completion", created, model: body.model, choices: [{ index: 0, message, finish_reason: finish }], usage });
    return;
  }
  const chunk = (choices: unknown[], extra: Record<string, unknown> = {}) => ({ data: { id, object: "chat.completion.chunk", created, model: body.model, choices, ...extra } });
  const delta = call === null ? { content: (reply as { text: string }).text } : { tool_calls: [{ index: 0, ...call }] };
  sse(
    response,
    [
      chunk([{ index: 0, delta: { role: "assistant", content: "" }, finish_reason: null }]),
      chunk([{ index: 0, delta, finish_reason: null }]),
      chunk([{ index: 0, delta: {}, finish_reason: finish }]),
      chunk([], { usage }),
    ],
    true,
  );
}

function responsesReply(response: ServerResponse, body: ResponsesBody, id: string, reply: Answer, issued: Map<string, ResponsesItem>, n: number): void {
  const created = Math.floor(Date.now() / 1000);
  const usage = {
    input_tokens: STAND_IN_USAGE.input,
    input_tokens_details: { cached_tokens: 0 },
    output_tokens: STAND_IN_USAGE.output,
    output_tokens_details: { reasoning_tokens: 0 },
    total_tokens: STAND_IN_USAGE.input + STAND_IN_USAGE.output,
  };
  const item =
    reply.kind === "tool"
      ? { type: "function_call", id: `fc_${n}`, call_id: reply.callId, name: "weather", arguments: JSON.stringify({ city: reply.city }), status: "completed" }
      : { type: "message", id: `msg_${n}`, role: "assistant", status: "completed", content: [{ type: "output_text", text: reply.text, annotations: [] }] };
  issued.set(item.id, item);
  const whole = {
    id,
    object: "response",
    created_at: created,
    model: body.model,
    status: "completed",
    output: [item],
    usage,
    incomplete_details: null,
    prompt_cache_diagnostics: RESPONSES_DIAGNOSTICS,
  };
  if (body.stream !== true) {
    json(response, 200, whole);
    return;
  }
  const events: { event?: string; data: Record<string, unknown> }[] = [
    { data: { type: "response.created", response: { ...whole, status: "in_progress", output: [], usage: null } } },
  ];
  if (item.type === "function_call") {
    events.push(
      { data: { type: "response.output_item.added", output_index: 0, item: { ...item, arguments: "", status: "in_progress" } } },
      { data: { type: "response.function_call_arguments.delta", item_id: item.id, output_index: 0, delta: item.arguments } },
      { data: { type: "response.function_call_arguments.done", item_id: item.id, output_index: 0, arguments: item.arguments } },
    );
  } else {
    events.push(
      { data: { type: "response.output_item.added", output_index: 0, item: { ...item, status: "in_progress", content: [] } } },
      { data: { type: "response.output_text.delta", item_id: item.id, output_index: 0, content_index: 0, delta: (reply as { text: string }).text } },
    );
  }
  events.push({ data: { type: "response.output_item.done", output_index: 0, item } }, { data: { type: "response.completed", response: whole } });
  sse(
    response,
    events.map((e) => ({ event: String(e.data.type), data: e.data })),
  );
}

async function readBody(request: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of request) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString("utf8");
}

/** Start a stand-in of the three APIs on an ephemeral loopback port. */
export async function startStandIn(): Promise<StandIn> {
  const requests: Recorded[] = [];
  const issued = new Map<string, ResponsesItem>();
  const { server, url }: { server: Server; url: string } = await listen((request, response) => {
    void (async () => {
      const text = await readBody(request);
      const n = requests.length + 1;
      const path = (request.url ?? "").split("?")[0];
      const headers = Object.fromEntries(Object.entries(request.headers).map(([name, value]) => [name, Array.isArray(value) ? value.join(",") : (value ?? "")]));
      if (request.method !== "POST") return json(response, 405, { error: { message: "POST only" } });
      if (path === "/v1/messages") {
        const body = JSON.parse(text) as AnthropicBody;
        const responseId = `msg_standin_${n}`;
        requests.push({ api: "anthropic", body, responseId, headers });
        return anthropicReply(response, body, responseId, anthropicAnswer(body, n));
      }
      if (path === "/v1/chat/completions") {
        const body = JSON.parse(text) as ChatBody;
        const responseId = `chatcmpl-standin-${n}`;
        requests.push({ api: "openai-chat", body, responseId, headers });
        return chatReply(response, body, responseId, chatAnswer(body, n));
      }
      if (path === "/v1/responses") {
        const body = JSON.parse(text) as ResponsesBody;
        const responseId = `resp_standin_${n}`;
        requests.push({ api: "openai-responses", body, responseId, headers });
        return responsesReply(response, body, responseId, responsesAnswer(body, n), issued, n);
      }
      return json(response, 404, { error: { message: `no route ${path}` } });
    })().catch((error: unknown) => json(response, 500, { error: { message: String(error) } }));
  });
  return { baseURL: `${url}/v1`, requests, issued, close: () => close(server) };
}
