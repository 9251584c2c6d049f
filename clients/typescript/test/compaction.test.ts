// The compaction decision, Anthropic's own compaction and its returned block through the AI SDK
// middleware and the AI SDK's real provider classes, against the loopback stand-ins
// (provider-stand-ins.ts: the Anthropic one opens its answer with a compaction block when asked
// to compact) and a real `context-assembly serve` process with a registered summarizer
// (docs/integrations.md#compaction).
//
// Each case runs user turns that are each a tool loop (a `weather` call, then the answer). The
// first question is long, so that on the second turn the history before it is worth compacting:
// with `trigger_tokens` between the frame's floor and its input and a horizon over which carrying
// it costs more than compacting, the service decides to act on the third call. The decisions are
// checked with an OpenAI model, which the service counts exactly (an Anthropic model's count is
// held to the stand-in's fixed usage figures).

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import type { Server } from "node:http";
import { after, before, test } from "node:test";

import { createAnthropic } from "@ai-sdk/anthropic";
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, jsonSchema, stepCountIs, tool, wrapLanguageModel, type ModelMessage, type PrepareStepFunction, type StepResult } from "ai";

import { ContextAssemblyClient, type CompactionReport, type PreparationView } from "../src/index.js";
import { contextAssemblyMiddleware, foldedMessages, type ContextAssemblyMiddlewareOptions, type ErrorInfo, type PrepareTemplate } from "../src/ai-sdk.js";
import { COMPACTED, startStandIn, type AnthropicBody, type ChatBody, type Recorded, type StandIn } from "./provider-stand-ins.js";
import { close, listen, startService, type RunningService } from "./support.js";

const FILLER = "The customer wrote a long message about the trip and the weather. ".repeat(150);
const QUESTIONS = [`What is the weather in Oslo? ${FILLER}`, "And what is it in Bergen?", "Then how about in Tromsø?"];
const TRIGGER = 1000;
const DECIDING = { trigger_tokens: TRIGGER, horizon_turns: 1000 };
const BETA = "compact-2026-01-12";
const SUMMARY = "They asked about the weather in Oslo: rain.";
const SUMMARY_HEADING = "[Summary of the earlier conversation]";
const APP_SUMMARY = "The first turn found rain in Oslo.";

/** The `weather` tool; with `long`, the first city's result is long (worth clearing). */
function weatherTools(long = false) {
  return {
    weather: tool({
      description: "The weather forecast of a city.",
      inputSchema: jsonSchema<{ city: string }>({ type: "object", properties: { city: { type: "string" } }, required: ["city"] }),
      execute: async ({ city }) => `result for ${city}: rain, 12 °C. ${long && city === "Oslo" ? FILLER : ""}`,
    }),
  };
}
const tools = weatherTools();

let service: RunningService;
let client: ContextAssemblyClient;
let standIn: StandIn;
let summarizer: Server;
const packets: unknown[] = [];

before(async () => {
  const { server, url } = await listen((request, response) => {
    const chunks: Buffer[] = [];
    request.on("data", (chunk: Buffer) => chunks.push(chunk));
    request.on("end", () => {
      packets.push(JSON.parse(Buffer.concat(chunks).toString("utf8")) as unknown);
      response.writeHead(200, { "content-type": "application/json" });
      response.end(JSON.stringify({ summary: SUMMARY }));
    });
  });
  summarizer = server;
  service = await startService({ contributors: { summarizer: { url: `${url}/summarize`, secret: "whsec_c3VtbWFyaXplci1zZWNyZXQtMDEyMzQ1Njc4OQ==" } } });
  client = new ContextAssemblyClient({ baseUrl: service.baseUrl, timeoutMs: 10_000 });
  standIn = await startStandIn();
});

after(async () => {
  await standIn?.close();
  await service?.stop();
  if (summarizer !== undefined) await close(summarizer);
});

type Compaction = NonNullable<NonNullable<PrepareTemplate["assembly"]>["compaction"]>;
type WrappableModel = Parameters<typeof wrapLanguageModel>[0]["model"];
type Step = StepResult<typeof tools>;
type Extra = Omit<ContextAssemblyMiddlewareOptions, "client" | "baseUrl" | "apiKey" | "template">;

interface Run {
  requests: Recorded[];
  steps: Step[];
  views: PreparationView[];
  messages: ModelMessage[];
  middleware: ReturnType<typeof contextAssemblyMiddleware>;
}

function compactionOf(step: Step): CompactionReport | undefined {
  return (step.providerMetadata?.contextAssembly as { compaction?: CompactionReport } | undefined)?.compaction;
}

function preparationIdOf(step: Step): string {
  return (step.providerMetadata?.contextAssembly as { preparationId: string }).preparationId;
}

/**
 * `turns` user turns of one conversation, each sent with the conversation so far; `between`
 * rewrites the messages after a turn (the application applying a decision), `prepareStep` is the
 * AI SDK's own hook.
 */
async function converse(
  model: WrappableModel,
  compaction: Compaction,
  extra: Extra = {},
  turns = 2,
  hooks: { between?: (messages: ModelMessage[], steps: Step[]) => ModelMessage[]; prepareStep?: PrepareStepFunction<typeof tools>; tools?: typeof tools } = {},
): Promise<Run> {
  const first = standIn.requests.length;
  const middleware = contextAssemblyMiddleware({
    client,
    template: { scope: { task_id: randomUUID() }, assembly: { compaction } },
    failOpen: false,
    ...extra,
  });
  const wrapped = wrapLanguageModel({ model, middleware });
  let messages: ModelMessage[] = [];
  const steps: Step[] = [];
  for (const question of QUESTIONS.slice(0, turns)) {
    messages.push({ role: "user", content: question });
    const result = await generateText({ model: wrapped, system: "You forecast the weather.", messages: [...messages], tools: hooks.tools ?? tools, stopWhen: stepCountIs(4), ...(hooks.prepareStep ? { prepareStep: hooks.prepareStep } : {}) });
    messages.push(...result.response.messages);
    steps.push(...result.steps);
    if (hooks.between) messages = hooks.between(messages, result.steps);
  }
  await middleware.flush();
  const requests = standIn.requests.slice(first);
  assert.equal(requests.length, turns * 2, "two model calls per turn");
  const views = await Promise.all(steps.map((step) => client.getPreparation(preparationIdOf(step))));
  return { requests, steps, views, messages, middleware };
}

function sent(request: Recorded): string {
  const body = request.body as { messages?: unknown; input?: unknown };
  return JSON.stringify(body.messages ?? body.input);
}

/** The text of each tool result an OpenAI Chat body sends, in order. */
function toolResults(request: Recorded): string[] {
  return (request.body as ChatBody).messages.filter((message) => message.role === "tool").map((message) => (typeof message.content === "string" ? message.content : JSON.stringify(message.content)));
}

function openaiModel(): WrappableModel {
  return createOpenAI({ baseURL: standIn.baseURL, apiKey: "stand-in" }).chat("gpt-4o-mini");
}

function anthropicModel(): WrappableModel {
  return createAnthropic({ baseURL: standIn.baseURL, apiKey: "stand-in" })("claude-sonnet-4-5");
}

test("native: @ai-sdk/anthropic gets Anthropic's compaction edit and beta, and the returned block comes back in the history", async () => {
  const run = await converse(anthropicModel(), { mode: "native", trigger_tokens: TRIGGER });
  const edits = [{ type: "compact_20260112", trigger: { type: "input_tokens", value: 50_000 } }];
  for (const [i, request] of run.requests.entries()) {
    assert.deepEqual((request.body as AnthropicBody).context_management, { edits }, `call ${i}`);
    assert.ok((request.headers["anthropic-beta"] ?? "").split(",").includes(BETA), `call ${i}: the beta header`);
  }
  for (const [i, request] of run.requests.entries()) {
    const blocks = (request.body as AnthropicBody).messages.flatMap((m) => (typeof m.content === "string" ? [] : m.content));
    const returned = blocks.filter((b) => b.type === "compaction");
    assert.deepEqual(returned.map((b) => b.content), i === 0 ? [] : [COMPACTED], `call ${i}: the returned block, sent back`);
  }
  assert.deepEqual(
    run.views.map((view) => view.selection.compaction?.provider_item_dropped_messages),
    [0, 0, 1, 1],
    "from the second turn the service leaves out the question before the block, as Anthropic does",
  );
  assert.ok(!sent(run.requests[2]!).includes("Oslo?"), "the first question is not sent once the block stands for it");
  const last = compactionOf(run.steps.at(-1)!);
  assert.equal(last?.mode, "native");
  assert.deepEqual(last?.native, { parameter: "context_management", threshold_tokens: 50_000, beta: BETA });
  assert.equal(run.middleware.stats.mappingFailures, 0);
  assert.equal(run.middleware.stats.nativeCompactionSkipped, 0);
});

test("native: @ai-sdk/openai has no place for it: the calls go out without it, counted, with one warning", async () => {
  const warnings: ErrorInfo[] = [];
  const openai = createOpenAI({ baseURL: standIn.baseURL, apiKey: "stand-in" });
  const run = await converse(openai.responses("gpt-4o-mini"), { mode: "native" }, { onError: (_error, info) => warnings.push(info) });
  assert.ok(run.requests.every((request) => !("context_management" in request.body)));
  assert.equal(run.middleware.stats.nativeCompactionSkipped, 4);
  assert.deepEqual(warnings.map((info) => info.phase), ["compaction"]);
  assert.equal(compactionOf(run.steps[0]!)?.native, null);
});

test("report: each step's providerMetadata and onCompaction carry the decision, and prepareStep compacts on it", async () => {
  const decided: string[] = [];
  const run = await converse(
    openaiModel(),
    DECIDING,
    { onCompaction: (compaction, info) => decided.push(`${compaction.decision} ${info.preparationId}`) },
    2,
    {
      // The application's own summarization, on the service's decision instead of a count of its own.
      prepareStep: ({ steps, messages }) => {
        if (steps.length === 0 || compactionOf(steps.at(-1) as Step)?.decision !== "compact") return undefined;
        let turn = messages.length - 1;
        while (turn > 0 && messages[turn]?.role !== "user") turn--;
        return { messages: [{ role: "user", content: APP_SUMMARY }, ...messages.slice(turn)] };
      },
    },
  );
  assert.deepEqual(
    run.steps.map((step) => compactionOf(step)?.reason),
    ["floor_over_trigger", "floor_over_trigger", "over_trigger", "under_trigger"],
  );
  assert.deepEqual(decided, [`compact ${preparationIdOf(run.steps[2]!)}`]);
  assert.ok(sent(run.requests[2]!).includes("Oslo?"));
  assert.ok(!sent(run.requests[3]!).includes("Oslo?") && sent(run.requests[3]!).includes(APP_SUMMARY), "the step after the decision is summarized");
});

test("summarize: the summary goes out in place of the folded messages, and foldedMessages puts it in the application's messages", async () => {
  const before = packets.length;
  const fold = (messages: ModelMessage[], steps: Step[]): ModelMessage[] => steps.reduce<ModelMessage[]>((current, step) => foldedMessages(current, compactionOf(step)) as ModelMessage[], messages);
  const run = await converse(openaiModel(), { mode: "summarize", summarizer: "summarizer", ...DECIDING }, {}, 3, {
    // The rest of the tool loop (prepareStep), and the conversation the application keeps.
    prepareStep: ({ steps, messages }) => ({ messages: fold(messages, steps) }),
    between: fold,
  });
  assert.equal(packets.length, before + 1, "one summary");
  const third = run.views[2]!.selection.compaction;
  assert.equal(third?.decision, "compact");
  assert.equal(third?.folded_messages, 3);
  for (const request of run.requests.slice(2)) {
    assert.ok(!sent(request).includes("Oslo?") && sent(request).includes(SUMMARY));
  }
  const first = run.messages[0]!;
  assert.equal(first.role, "user");
  assert.ok(typeof first.content === "string" && first.content.startsWith(SUMMARY_HEADING));
  assert.ok(!JSON.stringify(run.messages).includes("Oslo?"));
  assert.equal(run.middleware.stats.mappingFailures, 0);
});

test("clear_tool_results: the first turn's tool result goes out as the service's placeholder; the application's messages keep it", async () => {
  const run = await converse(openaiModel(), { mode: "clear_tool_results", keep_tool_results: 0, clear_at_least: 1, ...DECIDING }, {}, 2, { tools: weatherTools(true) });
  const third = run.views[2]!.selection.compaction;
  assert.equal(third?.decision, "clear_tool_results");
  const [cleared] = third?.cleared_calls ?? [];
  for (const request of run.requests.slice(2)) {
    assert.equal(toolResults(request)[0], `[tool result cleared to save context: weather call ${cleared}]`);
  }
  assert.ok(toolResults(run.requests[3]!)[1]?.startsWith("result for Bergen"), "the second turn's own result, whole");
  assert.ok(JSON.stringify(run.messages).includes("result for Oslo"));
  assert.equal(run.middleware.stats.mappingFailures, 0);
});
