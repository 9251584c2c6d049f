// The conformance kit of the AI SDK middleware: multi-turn tool loops through the AI SDK's real
// provider classes (`@ai-sdk/anthropic`, and `@ai-sdk/openai` with the Chat and the Responses
// API), each pointed at a loopback stand-in of the provider's HTTP API (provider-stand-ins.ts),
// against a real `context-assembly serve` process. Every request body the provider sends is
// checked as the provider's API would read it: roles and tool pairs it accepts, the contributed
// text, the per-turn developer message, the cache markers where the plan put them, the output
// limit the budget reserved, and the usage reports with the provider's response ids.

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, describe, test } from "node:test";

import { createAnthropic } from "@ai-sdk/anthropic";
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, jsonSchema, stepCountIs, streamText, tool, wrapLanguageModel, type ModelMessage } from "ai";

import { ContextAssemblyClient, type Contribution, type PreparationView } from "../src/index.js";
import { contextAssemblyMiddleware, type PrepareTemplate } from "../src/ai-sdk.js";
import {
  RESPONSES_DIAGNOSTICS,
  STAND_IN_USAGE,
  startStandIn,
  type AnthropicBlock,
  type AnthropicBody,
  type ChatBody,
  type ChatMessage,
  type Recorded,
  type ResponsesBody,
  type ResponsesItem,
  type StandIn,
} from "./provider-stand-ins.js";
import { startService, type RunningService } from "./support.js";

const BLOCK_TEXT = "The user carries an umbrella from October to March.";
const DATE_LINE = "Current date and time: ";
const DEVELOPER_MARKER = "[developer instructions]\n";
const QUESTIONS = ["What is the weather in Oslo?", "And what is it in Bergen?", "Then how about in Tromsø?"];
/** Long enough for a cache breakpoint after the instructions (the model's minimum cacheable length). */
const SYSTEM = `You are a careful weather assistant. ${Array.from({ length: 300 }, (_, i) => `Rule ${i}: name the city and the source of each forecast.`).join(" ")}`;
const RESPONSE_RESERVE = 700;
const REASONING_RESERVE = 324;
const RESERVE = RESPONSE_RESERVE + REASONING_RESERVE;

const tools = {
  weather: tool({
    description: "The weather forecast of a city.",
    inputSchema: jsonSchema<{ city: string }>({ type: "object", properties: { city: { type: "string" } }, required: ["city"] }),
    execute: async ({ city }) => `rain, 12 °C in ${city}`,
  }),
};

let service: RunningService;
let client: ContextAssemblyClient;
let standIn: StandIn;

before(async () => {
  service = await startService();
  client = new ContextAssemblyClient({ baseUrl: service.baseUrl, timeoutMs: 10_000 });
  standIn = await startStandIn();
});

after(async () => {
  await standIn?.close();
  await service?.stop();
});

const notes = (): Contribution[] => [{ source: "notes", revision: "1", blocks: [{ id: "umbrella", text: BLOCK_TEXT, priority: 5 }] }];

type Layout = NonNullable<NonNullable<PrepareTemplate["assembly"]>["layout"]>;

function template(cache: PrepareTemplate["cache"], layout?: Layout): PrepareTemplate {
  // No `model` (the wrapped model's id) and, unless given, no layout (the middleware's default, `transcript`).
  return {
    plugins: [{ name: "notes", instructions: "Notes about the user." }],
    response_reserve: RESPONSE_RESERVE,
    assembly: { max_data_tokens: 512, reasoning_reserve_tokens: REASONING_RESERVE, ...(layout === undefined ? {} : { layout }) },
    scope: { account_id: "acct-conformance", task_id: randomUUID() },
    cache,
  };
}

function lastIndex<T>(items: readonly T[], predicate: (item: T) => boolean): number {
  for (let i = items.length - 1; i >= 0; i--) if (predicate(items[i]!)) return i;
  return -1;
}

function preparationIdOf(metadata: unknown): string {
  const id = (metadata as { contextAssembly?: { preparationId?: unknown } } | undefined)?.contextAssembly?.preparationId;
  assert.equal(typeof id, "string", `providerMetadata.contextAssembly.preparationId in ${JSON.stringify(metadata)}`);
  return id as string;
}

interface Conversation {
  /** The bodies the provider sent, in order, one per model call. */
  requests: Recorded[];
  /** The preparation of each model call, in the same order. */
  views: PreparationView[];
  /** The final text of each turn. */
  answers: string[];
  stats: ReturnType<typeof contextAssemblyMiddleware>["stats"];
}

/**
 * Three user turns, each a tool loop (a `weather` call, then the answer): the first two with
 * `generateText`, the last with `streamText`; each turn sends the conversation so far back,
 * the AI SDK's response messages included, as an application does.
 */
type WrappableModel = Parameters<typeof wrapLanguageModel>[0]["model"];

async function converse(model: WrappableModel, cache: PrepareTemplate["cache"], layout?: Layout): Promise<Conversation> {
  const first = standIn.requests.length;
  const middleware = contextAssemblyMiddleware({ client, template: template(cache, layout), contributions: notes, failOpen: false });
  const wrapped = wrapLanguageModel({ model, middleware });
  const messages: ModelMessage[] = [];
  const ids: string[] = [];
  const answers: string[] = [];
  for (const [turn, question] of QUESTIONS.entries()) {
    messages.push({ role: "user", content: question });
    const call = { model: wrapped, system: SYSTEM, messages: [...messages], tools, stopWhen: stepCountIs(4) };
    if (turn < QUESTIONS.length - 1) {
      const result = await generateText(call);
      answers.push(result.text);
      messages.push(...result.response.messages);
      ids.push(...result.steps.map((step) => preparationIdOf(step.providerMetadata)));
    } else {
      const result = streamText(call);
      answers.push(await result.text);
      messages.push(...(await result.response).messages);
      ids.push(...(await result.steps).map((step) => preparationIdOf(step.providerMetadata)));
    }
  }
  await middleware.flush();
  const requests = standIn.requests.slice(first);
  assert.equal(requests.length, QUESTIONS.length * 2, "two model calls per turn: the tool call, then the answer");
  assert.equal(ids.length, requests.length, "every call was prepared");
  const views = await Promise.all(ids.map((id) => client.getPreparation(id)));
  return { requests, views, answers, stats: middleware.stats };
}

function planOf(view: PreparationView): { breakpoints: { after: string; message?: number }[]; prompt_cache_key?: string | null } {
  assert.ok(view.selection.cache, `a cache plan in ${view.preparation_id}`);
  return view.selection.cache as unknown as { breakpoints: { after: string; message?: number }[]; prompt_cache_key?: string | null };
}

/** The checks every provider shares: the answers, the transcript layout, the usage reports. */
function checkCommon(conversation: Conversation): void {
  assert.deepEqual(conversation.answers, ["Forecast: rain, 12 °C in Oslo.", "Forecast: rain, 12 °C in Bergen.", "Forecast: rain, 12 °C in Tromsø."]);
  for (const [i, view] of conversation.views.entries()) {
    assert.equal(view.layout, "transcript", "the middleware's default layout");
    assert.equal(view.model, conversation.requests[i]!.body.model, "prepared for the model the provider was called with");
    assert.equal(view.selection.blocks.find((b) => b.id === "umbrella")?.status, "selected");
    const last = view.accounting.last;
    assert.ok(last, `a usage report for call ${i}`);
    assert.equal(last.output_tokens, STAND_IN_USAGE.output);
    assert.equal(last.response_id, conversation.requests[i]!.responseId, "the provider's response id of that call");
  }
  assert.equal(conversation.stats.prepared, conversation.requests.length);
  assert.equal(conversation.stats.failedOpen, 0);
  assert.equal(conversation.stats.mappingFailures, 0);
  assert.equal(conversation.stats.usageReports, conversation.requests.length);
  assert.equal(conversation.stats.usageReportFailures, 0);
}

// --------------------------------------------------------------------------- Anthropic

function blocksOf(content: string | AnthropicBlock[] | undefined): AnthropicBlock[] {
  if (content === undefined) return [];
  return typeof content === "string" ? [{ type: "text", text: content }] : content;
}

/** Without `cache_control` anywhere: what a prefix comparison compares. */
function unmarked(value: unknown): unknown {
  return JSON.parse(JSON.stringify(value, (key, item: unknown) => (key === "cache_control" ? undefined : item)));
}

/** Roles and tool pairs as the Messages API takes them. */
function checkAnthropicShape(body: AnthropicBody, where: string): void {
  const roles = body.messages.map((m) => m.role);
  assert.ok(
    roles.every((role) => role === "user" || role === "assistant"),
    `${where}: only user and assistant turns inside messages (no system role), got ${JSON.stringify(roles)}`,
  );
  assert.equal(roles[0], "user", `${where}: the conversation opens with a user turn`);
  for (let i = 1; i < roles.length; i++) assert.notEqual(roles[i], roles[i - 1], `${where}: turns alternate (messages[${i}])`);
  for (const [i, message] of body.messages.entries()) {
    const blocks = blocksOf(message.content);
    assert.ok(blocks.length > 0, `${where}: messages[${i}] has content`);
    const uses = message.role === "assistant" ? blocks.filter((b) => b.type === "tool_use").map((b) => b.id) : [];
    if (uses.length > 0) {
      const next = body.messages[i + 1];
      assert.equal(next?.role, "user", `${where}: the tool_use of messages[${i}] is answered by the next user message`);
      const opening = blocksOf(next.content).slice(0, uses.length);
      assert.deepEqual(
        opening.map((b) => [b.type, b.tool_use_id]),
        uses.map((id) => ["tool_result", id]),
        `${where}: the tool_result blocks open messages[${i + 1}]`,
      );
    }
    const results = blocks.filter((b) => b.type === "tool_result");
    if (results.length > 0) {
      const previous = i > 0 ? blocksOf(body.messages[i - 1]!.content) : [];
      for (const result of results) {
        assert.ok(
          previous.some((b) => b.type === "tool_use" && b.id === result.tool_use_id),
          `${where}: tool_result ${result.tool_use_id} follows its tool_use`,
        );
      }
      assert.ok(
        blocks.slice(0, results.length).every((b) => b.type === "tool_result"),
        `${where}: messages[${i}] opens with its tool results`,
      );
    }
  }
}

function checkAnthropicCache(body: AnthropicBody, previous: AnthropicBody | undefined, view: PreparationView, where: string): void {
  const plan = planOf(view);
  const system = blocksOf(body.system);
  const marked: string[] = [];
  if (body.tools?.at(-1)?.cache_control !== undefined) marked.push("tools");
  assert.ok(body.tools?.slice(0, -1).every((t) => t.cache_control === undefined), `${where}: only the last tool is marked`);
  if (system[0]?.cache_control !== undefined) marked.push("instructions");
  assert.ok(system.slice(1).every((b) => b.cache_control === undefined), `${where}: only the instructions' system block is marked`);
  const messageMarks: [number, number][] = [];
  body.messages.forEach((message, i) => blocksOf(message.content).forEach((block, j) => block.cache_control !== undefined && messageMarks.push([i, j])));
  const expectedMessageMarks: [number, number][] = [];
  for (const breakpoint of plan.breakpoints) {
    if (breakpoint.after === "history") {
      // In `transcript` the stable prefix is the previous call's whole conversation: the mark ends it.
      assert.ok(previous !== undefined, `${where}: a history marker needs a previous call`);
      const at = previous.messages.length - 1;
      expectedMessageMarks.push([at, blocksOf(previous.messages[at]!.content).length - 1]);
    } else if (breakpoint.after === "end") {
      const at = body.messages.length - 1;
      expectedMessageMarks.push([at, blocksOf(body.messages[at]!.content).length - 1]);
    }
  }
  assert.deepEqual(
    marked,
    plan.breakpoints.flatMap((b) => (b.after === "tools" || b.after === "instructions" ? [b.after] : [])),
    `${where}: tools and system markers as planned`,
  );
  assert.deepEqual(messageMarks, expectedMessageMarks, `${where}: message markers where the plan put them (${JSON.stringify(plan.breakpoints)})`);
  for (const block of [...(body.tools ?? []), ...system, ...body.messages.flatMap((m) => blocksOf(m.content))]) {
    if (block.cache_control !== undefined) assert.deepEqual(block.cache_control, { type: "ephemeral" });
  }
}

/** The per-turn developer message of each call: none in the question's user message on the first turn, one marked user text after it. */
function checkAnthropicDeveloper(conversation: Conversation): void {
  for (const [i, { body }] of conversation.requests.entries()) {
    const anthropic = body as AnthropicBody;
    const system = blocksOf(anthropic.system).map((b) => b.text ?? "");
    assert.ok(system[0]?.startsWith("You are a careful weather assistant."), `call ${i}: the instructions lead the system prompt`);
    const turn = Math.floor(i / 2);
    const question = QUESTIONS[turn]!;
    const holder = anthropic.messages[lastIndex(anthropic.messages, (m) => blocksOf(m.content).some((b) => b.text === question))];
    assert.ok(holder, `call ${i}: the question is sent`);
    const blocks = blocksOf(holder.content);
    const at = blocks.findIndex((b) => b.text === question);
    const developer = blocks.slice(0, at).filter((b) => b.text?.startsWith(DEVELOPER_MARKER));
    if (turn === 0) {
      assert.equal(developer.length, 0, `call ${i}: no marked developer text on the first turn`);
      assert.ok(system.some((text) => text.startsWith(DATE_LINE)), `call ${i}: the first turn's developer message is part of the system prompt`);
    } else {
      assert.equal(developer.length, 1, `call ${i}: the marked developer text in the question's user message`);
      assert.ok(developer[0]!.text!.slice(DEVELOPER_MARKER.length).startsWith(DATE_LINE));
    }
  }
}

describe("through @ai-sdk/anthropic with the stable-prefix layout", () => {
  let conversation: Conversation;

  before(async () => {
    const anthropic = createAnthropic({ baseURL: standIn.baseURL, apiKey: "stand-in" });
    conversation = await converse(anthropic("claude-sonnet-4-5"), undefined, "stable-prefix");
  });

  test("no system role inside messages: after the first turn the developer message is a user text marked [developer instructions]", () => {
    for (const [i, { body }] of conversation.requests.entries()) checkAnthropicShape(body as AnthropicBody, `call ${i}`);
    checkAnthropicDeveloper(conversation);
    assert.ok(conversation.views.every((view) => view.layout === "stable-prefix"));
  });
});

describe("through @ai-sdk/anthropic (Messages API)", () => {
  let conversation: Conversation;

  before(async () => {
    const anthropic = createAnthropic({ baseURL: standIn.baseURL, apiKey: "stand-in" });
    conversation = await converse(anthropic("claude-sonnet-4-5"), { breakpoints: true });
  });

  test("every body has only user and assistant turns, alternating, with each tool_use answered by the tool_result opening the next user message", () => {
    for (const [i, { body }] of conversation.requests.entries()) checkAnthropicShape(body as AnthropicBody, `call ${i}`);
  });

  test("the per-turn developer message: in the system prompt on the first turn, after it a user text marked [developer instructions] right before the question", () => {
    checkAnthropicDeveloper(conversation);
    for (const [i, { body }] of conversation.requests.entries()) {
      const system = blocksOf((body as AnthropicBody).system).map((b) => b.text ?? "");
      assert.ok(system.some((text) => text.startsWith(DATE_LINE)), `call ${i}: in transcript the first turn's developer message stays in the system prompt`);
    }
  });

  test("the contributed block reaches the model in a user message", () => {
    for (const [i, { body }] of conversation.requests.entries()) {
      const texts = (body as AnthropicBody).messages.filter((m) => m.role === "user").flatMap((m) => blocksOf(m.content).map((b) => b.text ?? ""));
      assert.ok(texts.some((text) => text.includes(BLOCK_TEXT)), `call ${i}`);
    }
  });

  test("max_tokens is the reserve the budget kept (not the model's 64000)", () => {
    for (const [i, { body }] of conversation.requests.entries()) assert.equal((body as AnthropicBody).max_tokens, RESERVE, `call ${i}`);
  });

  test("cache_control where the plan put it: the instructions, the previous call's end, the frame's end; no OpenAI option", () => {
    let placed = 0;
    for (const [i, { body }] of conversation.requests.entries()) {
      const previous = i > 0 ? (conversation.requests[i - 1]!.body as AnthropicBody) : undefined;
      checkAnthropicCache(body as AnthropicBody, previous, conversation.views[i]!, `call ${i}`);
      placed += planOf(conversation.views[i]!).breakpoints.length;
      assert.equal("prompt_cache_key" in body, false);
    }
    assert.ok(placed >= conversation.requests.length * 2, "the plans placed markers (instructions and end at least)");
    assert.equal(conversation.stats.cacheMarkersSkipped, 0);
  });

  test("each call's conversation begins with the previous call's (the transcript layout through the provider)", () => {
    for (let i = 1; i < conversation.requests.length; i++) {
      const before = unmarked((conversation.requests[i - 1]!.body as AnthropicBody).messages) as unknown[];
      const now = unmarked((conversation.requests[i]!.body as AnthropicBody).messages) as unknown[];
      assert.deepEqual(now.slice(0, before.length), before, `call ${i}`);
      assert.deepEqual(unmarked((conversation.requests[i]!.body as AnthropicBody).system), unmarked((conversation.requests[0]!.body as AnthropicBody).system));
    }
  });

  test("streaming and not, the usage reports carry the provider's response id", () => {
    assert.deepEqual(
      conversation.requests.map((r) => (r.body as AnthropicBody).stream === true),
      [false, false, false, false, true, true],
    );
    checkCommon(conversation);
    assert.deepEqual(conversation.views[0]!.accounting.last?.diagnostics, { stand_in: true }, "the provider's cache diagnostics of a generated answer");
  });

  test("an application's smaller maxOutputTokens is kept", async () => {
    const anthropic = createAnthropic({ baseURL: standIn.baseURL, apiKey: "stand-in" });
    const first = standIn.requests.length;
    const middleware = contextAssemblyMiddleware({ client, template: template(undefined), contributions: notes, failOpen: false });
    await generateText({ model: wrapLanguageModel({ model: anthropic("claude-sonnet-4-5"), middleware }), prompt: QUESTIONS[0]!, maxOutputTokens: 200 });
    assert.equal((standIn.requests[first]!.body as AnthropicBody).max_tokens, 200);
  });
});

// --------------------------------------------------------------------------- OpenAI

function chatText(message: ChatMessage | undefined): string {
  const content = message?.content;
  if (typeof content === "string") return content;
  return (content ?? []).map((part) => part.text ?? "").join("");
}

/** Tool messages right after the assistant message that called them, and no other. */
function checkChatShape(body: ChatBody, where: string): void {
  const messages = body.messages;
  assert.ok(["system", "developer"].includes(messages[0]?.role ?? ""), `${where}: the instructions lead`);
  for (const [i, message] of messages.entries()) {
    assert.ok(["system", "developer", "user", "assistant", "tool"].includes(message.role), `${where}: role ${message.role}`);
    const calls = (message.tool_calls ?? []).map((call) => call.id);
    if (calls.length > 0) {
      const answers = messages.slice(i + 1, i + 1 + calls.length);
      assert.deepEqual(
        answers.map((m) => [m.role, m.tool_call_id]),
        calls.map((id) => ["tool", id]),
        `${where}: the tool messages right after messages[${i}]`,
      );
    }
    if (message.role === "tool") {
      let j = i - 1;
      while (j >= 0 && messages[j]!.role === "tool") j--;
      assert.ok(
        messages[j]?.tool_calls?.some((call) => call.id === message.tool_call_id),
        `${where}: messages[${i}] answers a call of the assistant message right before it`,
      );
    }
  }
}

/** The per-turn instructions message, with its date line, right before the latest question (the data message may stand between). */
function checkChatDeveloper(body: ChatBody, question: string, where: string): void {
  const messages = body.messages;
  const at = lastIndex(messages, (m) => m.role === "user" && chatText(m) === question);
  assert.ok(at > 0, `${where}: the question is sent`);
  const before = messages.slice(0, at).map((m, i) => [i, m] as const).filter(([, m]) => m.role !== "user" || !chatText(m).includes(BLOCK_TEXT));
  const [index, perTurn] = before.at(-1)!;
  assert.ok(["system", "developer"].includes(perTurn.role), `${where}: a ${perTurn.role} message before the question`);
  assert.ok(chatText(perTurn).startsWith(DATE_LINE), `${where}: with the date line`);
  assert.ok(at - index <= 2, `${where}: right before the question`);
}

describe("through @ai-sdk/openai (Chat Completions API)", () => {
  let conversation: Conversation;

  before(async () => {
    const openai = createOpenAI({ baseURL: standIn.baseURL, apiKey: "stand-in" });
    conversation = await converse(openai.chat("gpt-5-mini"), { key: "conversation-42" });
  });

  test("every body has each call's tool messages right after it", () => {
    for (const [i, { body }] of conversation.requests.entries()) checkChatShape(body as ChatBody, `call ${i}`);
  });

  test("the per-turn instructions stand right before each question, in the role @ai-sdk/openai gives system messages", () => {
    for (const [i, { body }] of conversation.requests.entries()) checkChatDeveloper(body as ChatBody, QUESTIONS[Math.floor(i / 2)]!, `call ${i}`);
    const roles = new Set((conversation.requests.at(-1)!.body as ChatBody).messages.map((m) => m.role));
    assert.ok(roles.has("developer"), "a reasoning model's system messages are sent as developer messages");
  });

  test("the contributed block, the output limit, the cache key; no Anthropic marker", () => {
    for (const [i, { body }] of conversation.requests.entries()) {
      const chat = body as ChatBody;
      assert.ok(chat.messages.some((m) => m.role === "user" && chatText(m).includes(BLOCK_TEXT)), `call ${i}: the block`);
      assert.equal(chat.max_completion_tokens, RESERVE, `call ${i}: max_completion_tokens`);
      assert.equal(chat.max_tokens, undefined, `call ${i}`);
      assert.equal(chat.prompt_cache_key, planOf(conversation.views[i]!).prompt_cache_key, `call ${i}: the plan's key`);
      assert.equal(chat.prompt_cache_key, "conversation-42");
      assert.ok(!JSON.stringify(chat).includes("cache_control"), `call ${i}`);
    }
  });

  test("each call's messages begin with the previous call's", () => {
    for (let i = 1; i < conversation.requests.length; i++) {
      const before = (conversation.requests[i - 1]!.body as ChatBody).messages;
      assert.deepEqual((conversation.requests[i]!.body as ChatBody).messages.slice(0, before.length), before, `call ${i}`);
    }
  });

  test("streaming and not, the usage reports carry the provider's response id", () => {
    assert.deepEqual(
      conversation.requests.map((r) => (r.body as ChatBody).stream === true),
      [false, false, false, false, true, true],
    );
    checkCommon(conversation);
  });
});

function itemText(item: ResponsesItem | undefined): string {
  const content = item?.content;
  if (typeof content === "string") return content;
  return (content ?? []).map((part) => part.text ?? "").join("");
}

/** Each run of function calls is answered by the run of function_call_output items right after it. */
function checkResponsesShape(body: ResponsesBody, issued: Map<string, ResponsesItem>, where: string): void {
  const items = body.input.map((item) => (item.type === "item_reference" ? { ...issued.get(item.id ?? ""), referenced: true } : item));
  assert.ok(["system", "developer"].includes(items[0]?.role ?? ""), `${where}: the instructions lead`);
  for (let i = 0; i < items.length; i++) {
    if (items[i]!.type !== "function_call") continue;
    let j = i;
    const calls: string[] = [];
    while (items[j]?.type === "function_call") calls.push(items[j++]!.call_id ?? "");
    const outputs: string[] = [];
    while (items[j]?.type === "function_call_output") outputs.push(items[j++]!.call_id ?? "");
    assert.deepEqual(outputs, calls, `${where}: the outputs right after the calls at input[${i}]`);
    i = j - 1;
  }
  for (const [i, item] of items.entries()) {
    if (item.type === "function_call_output") assert.ok(items.slice(0, i).some((c) => c.type === "function_call" && c.call_id === item.call_id), `${where}: input[${i}] answers an earlier call`);
  }
}

describe("through @ai-sdk/openai (Responses API)", () => {
  let conversation: Conversation;

  before(async () => {
    const openai = createOpenAI({ baseURL: standIn.baseURL, apiKey: "stand-in" });
    conversation = await converse(openai.responses("gpt-4o-mini"), { key: "conversation-43" });
  });

  test("every body answers each function_call with its function_call_output right after it", () => {
    for (const [i, { body }] of conversation.requests.entries()) checkResponsesShape(body as ResponsesBody, standIn.issued, `call ${i}`);
  });

  test("the per-turn instructions, the contributed block, the output limit, the cache key", () => {
    for (const [i, { body }] of conversation.requests.entries()) {
      const responses = body as ResponsesBody;
      const question = QUESTIONS[Math.floor(i / 2)]!;
      const at = lastIndex(responses.input, (item) => item.role === "user" && itemText(item) === question);
      assert.ok(at > 0, `call ${i}: the question`);
      const earlier = responses.input.slice(0, at);
      const perTurn = earlier[lastIndex(earlier, (item) => item.role === "system" || item.role === "developer")];
      assert.ok(itemText(perTurn).startsWith(DATE_LINE), `call ${i}: the per-turn message before the question`);
      assert.ok(responses.input.some((item) => item.role === "user" && itemText(item).includes(BLOCK_TEXT)), `call ${i}: the block`);
      assert.equal(responses.max_output_tokens, RESERVE, `call ${i}: max_output_tokens`);
      assert.equal(responses.prompt_cache_key, "conversation-43", `call ${i}`);
      assert.ok(!JSON.stringify(responses).includes("cache_control"), `call ${i}`);
    }
  });

  test("streaming and not, the usage reports carry the provider's response id and its cache diagnostics", () => {
    assert.deepEqual(
      conversation.requests.map((r) => (r.body as ResponsesBody).stream === true),
      [false, false, false, false, true, true],
    );
    checkCommon(conversation);
    for (const view of conversation.views) assert.deepEqual(view.accounting.last?.diagnostics, RESPONSES_DIAGNOSTICS);
  });
});
