// The AI SDK middleware against a real `context-assembly serve` process, with the AI SDK's own
// mock language model (ai/test) standing in for the provider. The service has no API keys and two
// registered contributors that fail on purpose: `down` (a closed port: the prepare answers 502)
// and `slow` (a handler in this process that answers only when the test lets it).

import assert from "node:assert/strict";
import { randomBytes, randomUUID } from "node:crypto";
import type { Server } from "node:http";
import { after, before, describe, test } from "node:test";

import { generateText, jsonSchema, simulateReadableStream, streamText, tool, wrapLanguageModel, type ModelMessage } from "ai";
import { MockLanguageModelV3 } from "ai/test";

import {
  APIConnectionError,
  APITimeoutError,
  ContextAssemblyClient,
  ContributorFailedError,
  InvalidRequestError,
  createContributorHandler,
  type Contribution,
  type PreparationView,
} from "../src/index.js";
import {
  FrameMappingError,
  USAGE_REPORT_ID,
  contextAssemblyMiddleware,
  type CallInfo,
  type ContextAssemblyMiddlewareOptions,
  type ErrorInfo,
  type PrepareTemplate,
} from "../src/ai-sdk.js";
import { close, freePort, listen, startService, type RunningService } from "./support.js";

const BLOCK_TEXT = "The user takes their tea without sugar.";
const SECRET = `whsec_${randomBytes(24).toString("base64")}`;
const PNG = new Uint8Array([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 1, 2, 3, 4]);
const USAGE = {
  inputTokens: { total: 1200, noCache: 1000, cacheRead: 200, cacheWrite: undefined },
  outputTokens: { total: 9, text: 9, reasoning: undefined },
};

type CallParams = MockLanguageModelV3["doGenerateCalls"][number];
type PromptMessage = CallParams["prompt"][number];

let service: RunningService;
let client: ContextAssemblyClient;
let slowServer: Server;
let releaseSlow: () => void = () => undefined;
const slowReleased = new Promise<void>((ok) => {
  releaseSlow = ok;
});

before(async () => {
  // `slow` answers once the timeout test has seen the adapter give up (never by a timer).
  const slow = await listen(
    createContributorHandler({
      secret: SECRET,
      async contribute() {
        await slowReleased;
        return { revision: "1", blocks: [] };
      },
    }),
  );
  slowServer = slow.server;
  service = await startService({
    contributors: {
      down: { url: `http://127.0.0.1:${await freePort()}/`, secret: SECRET, failurePolicy: "fail" },
      slow: { url: `${slow.url}/`, secret: SECRET },
    },
  });
  client = new ContextAssemblyClient({ baseUrl: service.baseUrl, timeoutMs: 10_000 });
});

after(async () => {
  releaseSlow();
  await service?.stop();
  if (slowServer !== undefined) await close(slowServer);
});

/** The AI SDK's mock model; `provider` is its AI SDK provider id (the mock's own by default). */
function mockModel(modelId = "gpt-4o-mini", provider?: string): MockLanguageModelV3 {
  return new MockLanguageModelV3({
    modelId,
    ...(provider === undefined ? {} : { provider }),
    doGenerate: async () => ({
      content: [{ type: "text", text: "Without sugar." }],
      finishReason: { unified: "stop", raw: "stop" },
      usage: USAGE,
      warnings: [],
      response: { id: "mock-response-1" },
    }),
    doStream: async () => ({
      stream: simulateReadableStream({
        initialDelayInMs: null,
        chunkDelayInMs: null,
        chunks: [
          { type: "stream-start", warnings: [] },
          { type: "response-metadata", id: "mock-stream-1" },
          { type: "text-start", id: "t1" },
          { type: "text-delta", id: "t1", delta: "Without " },
          { type: "text-delta", id: "t1", delta: "sugar." },
          { type: "text-end", id: "t1" },
          { type: "finish", finishReason: { unified: "stop", raw: "stop" }, usage: USAGE },
        ],
      }),
    }),
  });
}

/** A template of its own scope per test, so that the scope's timeline counts this test's prepares. */
function template(overrides: Partial<PrepareTemplate> = {}): PrepareTemplate {
  return {
    plugins: [{ name: "notes", instructions: "Notes about the user." }],
    assembly: { max_data_tokens: 512, layout: "stable-prefix" },
    scope: { account_id: "acct-ai-sdk", task_id: randomUUID() },
    ...overrides,
  };
}

const notes = (): Contribution[] => [{ source: "notes", revision: "3", blocks: [{ id: "tea", text: BLOCK_TEXT, priority: 5 }] }];

function textOf(message: PromptMessage | undefined): string {
  if (message === undefined) return "";
  if (typeof message.content === "string") return message.content;
  return message.content.map((part) => ("text" in part ? part.text : "")).join("");
}

function preparationIdOf(metadata: unknown): string {
  const id = (metadata as { contextAssembly?: { preparationId?: unknown } } | undefined)?.contextAssembly?.preparationId;
  assert.equal(typeof id, "string", `providerMetadata.contextAssembly.preparationId in ${JSON.stringify(metadata)}`);
  return id as string;
}

/** The accounting after the middleware's background reports have settled. */
async function settledView(middleware: { flush(): Promise<void> }, preparationId: string): Promise<PreparationView> {
  await middleware.flush();
  return client.getPreparation(preparationId);
}

function recorder(): { errors: [unknown, ErrorInfo][]; onError: (error: unknown, info: ErrorInfo) => void } {
  const errors: [unknown, ErrorInfo][] = [];
  return { errors, onError: (error, info) => errors.push([error, info]) };
}

/** The prompt the model gets without the middleware: what a failed-open call must get. */
async function unwrappedPrompt(call: (model: MockLanguageModelV3) => Promise<unknown>): Promise<CallParams["prompt"]> {
  const model = mockModel();
  await call(model);
  assert.equal(model.doGenerateCalls.length, 1);
  return model.doGenerateCalls[0]!.prompt;
}

describe("contextAssemblyMiddleware with generateText and streamText", () => {
  test("generateText: the model gets the frame with the contributed block, and its usage is reported once", async () => {
    const model = mockModel();
    const seen: CallParams[] = [];
    const infos: CallInfo[] = [];
    const middleware = contextAssemblyMiddleware({
      baseUrl: service.baseUrl,
      template: template(),
      contributions: (params, info) => {
        seen.push(params);
        infos.push(info);
        return notes();
      },
    });
    const result = await generateText({
      model: wrapLanguageModel({ model, middleware }),
      system: "You are a careful assistant.",
      prompt: "How do I take my tea?",
    });
    assert.equal(result.text, "Without sugar.");
    assert.equal(seen.length, 1, "contributions is called once per model call");
    assert.equal(textOf(seen[0]!.prompt.at(-1)), "How do I take my tea?", "contributions gets the call's own params");
    assert.deepEqual(infos, [{ type: "generate", provider: "mock-provider", modelId: "gpt-4o-mini" }], "and the wrapped model");

    assert.equal(model.doGenerateCalls.length, 1);
    const prompt = model.doGenerateCalls[0]!.prompt;
    assert.deepEqual(
      prompt.map((m) => m.role),
      ["system", "system", "user", "user"],
      "instructions, the per-turn developer message (as system), the data message, the input",
    );
    assert.ok(textOf(prompt[0]).startsWith("You are a careful assistant."));
    assert.ok(textOf(prompt[0]).includes("## notes"), "plugin instructions follow the host's");
    assert.ok(textOf(prompt[2]).includes(BLOCK_TEXT), "the data message carries the block");
    assert.equal(textOf(prompt[3]), "How do I take my tea?");

    const preparationId = preparationIdOf(result.providerMetadata);
    const timeline = await client.timeline(preparationId);
    assert.equal(timeline.turns.length, 1, "one prepare in this scope");
    const view = await settledView(middleware, preparationId);
    assert.equal(view.model, "gpt-4o-mini", "the wrapped model's id is the model");
    assert.equal(view.selection.blocks.find((b) => b.id === "tea")?.status, "selected");
    const last = view.accounting.last;
    assert.equal(last?.report_id, USAGE_REPORT_ID);
    assert.equal(last?.provider, "normalized");
    assert.equal(last?.call, "main");
    assert.equal(last?.provider_input_tokens, 1200);
    assert.equal(last?.cached_input_tokens, 200);
    assert.equal(last?.output_tokens, 9);
    assert.equal(last?.response_id, "mock-response-1", "the provider's response id");
    assert.deepEqual(middleware.stats, { prepared: 1, failedOpen: 0, mappingFailures: 0, cacheMarkersSkipped: 0, nativeCompactionSkipped: 0, usageReports: 1, usageReportFailures: 0 });
  });

  test("streamText: the stream passes through and the usage is reported at its finish part", async () => {
    const model = mockModel();
    const middleware = contextAssemblyMiddleware({ baseUrl: service.baseUrl, template: template(), contributions: async () => notes() });
    const result = streamText({ model: wrapLanguageModel({ model, middleware }), prompt: "How do I take my tea?" });
    assert.equal(await result.text, "Without sugar.");
    const preparationId = preparationIdOf(await result.providerMetadata);

    assert.equal(model.doStreamCalls.length, 1);
    const prompt = model.doStreamCalls[0]!.prompt;
    assert.ok(prompt.some((m) => m.role === "user" && textOf(m).includes(BLOCK_TEXT)), "the data message reached the model");
    assert.equal(textOf(prompt.at(-1)), "How do I take my tea?");

    assert.equal((await client.timeline(preparationId)).turns.length, 1);
    const view = await settledView(middleware, preparationId);
    assert.equal(view.accounting.last?.report_id, USAGE_REPORT_ID);
    assert.equal(view.accounting.last?.provider_input_tokens, 1200);
    assert.equal(view.accounting.last?.response_id, "mock-stream-1", "the response id of the stream's response-metadata part");
    assert.equal(middleware.stats.usageReports, 1);
  });

  test("a closed port: the call answers with its original prompt, after one warning", async () => {
    const closed = `http://127.0.0.1:${await freePort()}`;
    const call = (model: MockLanguageModelV3, options?: ContextAssemblyMiddlewareOptions) =>
      generateText({
        model: options === undefined ? model : wrapLanguageModel({ model, middleware: contextAssemblyMiddleware(options) }),
        system: "You are a careful assistant.",
        prompt: "How do I take my tea?",
      });
    const original = await unwrappedPrompt((model) => call(model));

    const { errors, onError } = recorder();
    const options: ContextAssemblyMiddlewareOptions = { baseUrl: closed, template: template(), contributions: notes, onError };
    const model = mockModel();
    const result = await call(model, options);
    assert.equal(result.text, "Without sugar.");
    assert.deepEqual(model.doGenerateCalls[0]!.prompt, original);
    assert.equal(result.providerMetadata?.contextAssembly, undefined, "no preparation, no id");
    assert.equal(errors.length, 1);
    assert.ok(errors[0]![0] instanceof APIConnectionError);
    assert.deepEqual(errors[0]![1], { phase: "prepare" });
  });

  test("without onError the one warning goes to console.warn and names no text", async (t) => {
    const warn = t.mock.method(console, "warn", () => undefined);
    const middleware = contextAssemblyMiddleware({ baseUrl: `http://127.0.0.1:${await freePort()}`, template: template(), contributions: notes });
    await generateText({ model: wrapLanguageModel({ model: mockModel(), middleware }), prompt: "How do I take my tea?" });
    assert.equal(warn.mock.callCount(), 1);
    const line = String(warn.mock.calls[0]!.arguments[0]);
    assert.match(line, /^context-assembly: prepare failed; the model call goes on with its original prompt \(APIConnectionError\)$/);
    assert.equal(middleware.stats.failedOpen, 1);
  });

  test("failOpen: false throws when the service cannot be reached, and the model is not called", async () => {
    const model = mockModel();
    const middleware = contextAssemblyMiddleware({ baseUrl: `http://127.0.0.1:${await freePort()}`, template: template(), failOpen: false });
    await assert.rejects(generateText({ model: wrapLanguageModel({ model, middleware }), prompt: "hi" }), APIConnectionError);
    assert.equal(model.doGenerateCalls.length, 0);
  });

  test("a 4xx answer (a bad template) throws even when failing open", async () => {
    const model = mockModel();
    const { errors, onError } = recorder();
    const middleware = contextAssemblyMiddleware({ baseUrl: service.baseUrl, template: template({ assembly: { max_data_tokens: -1 } }), onError });
    await assert.rejects(generateText({ model: wrapLanguageModel({ model, middleware }), prompt: "hi" }), (error: unknown) => {
      assert.ok(error instanceof InvalidRequestError);
      assert.equal(error.status, 422);
      return true;
    });
    assert.equal(model.doGenerateCalls.length, 0);
    assert.equal(errors.length, 0, "a thrown error is not also reported");
  });

  test("a 5xx answer fails open (a registered contributor with failure policy fail is down)", async () => {
    const { errors, onError } = recorder();
    const model = mockModel();
    const middleware = contextAssemblyMiddleware({
      baseUrl: service.baseUrl,
      template: template({ plugins: [{ name: "remote" }], contributors: [{ source: "remote", endpoint: "down" }] }),
      onError,
    });
    const result = await generateText({ model: wrapLanguageModel({ model, middleware }), prompt: "How do I take my tea?" });
    assert.equal(result.text, "Without sugar.");
    assert.equal(textOf(model.doGenerateCalls[0]!.prompt.at(-1)), "How do I take my tea?");
    assert.equal(model.doGenerateCalls[0]!.prompt.length, 1, "the original prompt: one user message");
    assert.equal(errors.length, 1);
    assert.ok(errors[0]![0] instanceof ContributorFailedError);
    assert.equal((errors[0]![0] as ContributorFailedError).status, 502);
  });

  test("a service slower than timeoutMs fails open", async () => {
    const { errors, onError } = recorder();
    const model = mockModel();
    const middleware = contextAssemblyMiddleware({
      baseUrl: service.baseUrl,
      timeoutMs: 300,
      template: template({ plugins: [{ name: "remote" }], contributors: [{ source: "remote", endpoint: "slow" }], assembly: { timeout_ms: 30_000 } }),
      onError,
    });
    try {
      const result = await generateText({ model: wrapLanguageModel({ model, middleware }), prompt: "How do I take my tea?" });
      assert.equal(result.text, "Without sugar.");
      assert.equal(model.doGenerateCalls[0]!.prompt.length, 1);
      assert.equal(errors.length, 1);
      assert.ok(errors[0]![0] instanceof APITimeoutError);
    } finally {
      releaseSlow();
    }
  });

  test("a usage report the service refuses is counted and warned about; the answer is unchanged", async () => {
    const { errors, onError } = recorder();
    const model = new MockLanguageModelV3({
      doGenerate: async () => ({
        content: [{ type: "text", text: "ok" }],
        finishReason: { unified: "stop", raw: "stop" },
        // More cached tokens than input tokens: the usage route refuses it (422).
        usage: { inputTokens: { total: 10, noCache: 0, cacheRead: 50, cacheWrite: undefined }, outputTokens: { total: 1, text: 1, reasoning: undefined } },
        warnings: [],
      }),
    });
    const middleware = contextAssemblyMiddleware({ baseUrl: service.baseUrl, template: template({ model: "gpt-4o-mini" }), onError });
    const result = await generateText({ model: wrapLanguageModel({ model, middleware }), prompt: "hi" });
    assert.equal(result.text, "ok");
    const view = await settledView(middleware, preparationIdOf(result.providerMetadata));
    assert.equal(view.accounting.last, null);
    assert.equal(middleware.stats.usageReportFailures, 1);
    assert.equal(errors.length, 1);
    assert.ok(errors[0]![0] instanceof InvalidRequestError);
    assert.equal(errors[0]![1].phase, "usage");
  });
});

describe("what the middleware prepares for", () => {
  test("the wrapped model's id without a template model; the template's model when it names one", async () => {
    for (const [overrides, expected] of [
      [{}, "claude-sonnet-4-5"],
      [{ model: "claude-haiku-4-5" }, "claude-haiku-4-5"],
    ] as const) {
      const middleware = contextAssemblyMiddleware({ client, template: template(overrides) });
      const result = await generateText({ model: wrapLanguageModel({ model: mockModel("claude-sonnet-4-5", "anthropic.messages"), middleware }), prompt: "hi" });
      const view = await client.getPreparation(preparationIdOf(result.providerMetadata));
      assert.equal(view.model, expected);
    }
  });

  test("the transcript layout unless the template's assembly names one", async () => {
    const layouts: string[] = [];
    for (const assembly of [undefined, { max_data_tokens: 256 }, { layout: "stable-prefix" as const }]) {
      const middleware = contextAssemblyMiddleware({ client, template: { scope: { account_id: "acct-ai-sdk", task_id: randomUUID() }, ...(assembly === undefined ? {} : { assembly }) } });
      const result = await generateText({ model: wrapLanguageModel({ model: mockModel(), middleware }), prompt: "hi" });
      layouts.push((await client.getPreparation(preparationIdOf(result.providerMetadata))).layout);
    }
    assert.deepEqual(layouts, ["transcript", "transcript", "stable-prefix"]);
  });

  test("the call's output limit is the reserve the budget kept, unless the call asked for less", async () => {
    const limits: (number | undefined)[] = [];
    for (const maxOutputTokens of [undefined, 100, 5_000]) {
      const model = mockModel("claude-sonnet-4-5", "anthropic.messages");
      const middleware = contextAssemblyMiddleware({
        client,
        template: template({ response_reserve: 700, assembly: { reasoning_reserve_tokens: 300, layout: "stable-prefix" } }),
      });
      await generateText({ model: wrapLanguageModel({ model, middleware }), prompt: "hi", ...(maxOutputTokens === undefined ? {} : { maxOutputTokens }) });
      limits.push(model.doGenerateCalls[0]!.maxOutputTokens);
    }
    assert.deepEqual(limits, [1_000, 100, 1_000]);
  });
});

describe("a mapping failure (a bug of the adapter)", () => {
  /** A client whose prepare answers a frame naming a tool the call does not have: the adapter cannot map it back. */
  class TamperingClient extends ContextAssemblyClient {
    override async prepare(...args: Parameters<ContextAssemblyClient["prepare"]>): ReturnType<ContextAssemblyClient["prepare"]> {
      const prepared = await super.prepare(...args);
      return { ...prepared, frame: { ...prepared.frame, tools: [{ name: "secret-tool-name", description: "", parameters: {} }] } };
    }
  }

  test("fails open, is counted, and is logged with its stack frames, not its message", async (t) => {
    const warn = t.mock.method(console, "warn", () => undefined);
    const model = mockModel();
    const middleware = contextAssemblyMiddleware({ client: new TamperingClient({ baseUrl: service.baseUrl }), template: template(), contributions: notes });
    const result = await generateText({ model: wrapLanguageModel({ model, middleware }), prompt: "How do I take my tea?" });
    assert.equal(result.text, "Without sugar.");
    assert.equal(model.doGenerateCalls[0]!.prompt.length, 1, "the original prompt");
    assert.deepEqual(middleware.stats, { prepared: 0, failedOpen: 1, mappingFailures: 1, cacheMarkersSkipped: 0, nativeCompactionSkipped: 0, usageReports: 0, usageReportFailures: 0 });
    assert.equal(warn.mock.callCount(), 1);
    const text = String(warn.mock.calls[0]!.arguments[0]);
    const [first, ...frames] = text.split("\n");
    assert.equal(first, "context-assembly: mapping the call failed (a bug of the adapter); the model call goes on with its original prompt (FrameMappingError)");
    assert.ok(frames.length > 0, text);
    for (const frame of frames) assert.match(frame, /^ {4}at /);
    assert.ok(frames.some((frame) => frame.includes("applyFrame")), "the frame that threw");
    assert.ok(!text.includes("secret-tool-name"), "no message text");
  });

  test("onError gets the error with its frames and the preparation; failOpen: false throws it", async () => {
    const { errors, onError } = recorder();
    const middleware = contextAssemblyMiddleware({ client: new TamperingClient({ baseUrl: service.baseUrl }), template: template(), onError });
    await generateText({ model: wrapLanguageModel({ model: mockModel(), middleware }), prompt: "hi" });
    assert.equal(errors.length, 1);
    const [error, info] = errors[0]!;
    assert.ok(error instanceof FrameMappingError);
    assert.equal(info.phase, "mapping");
    assert.match(info.preparationId ?? "", /^prep_/);
    assert.ok((info.frames ?? []).length > 0 && info.frames!.every((frame) => frame.startsWith("at ")));

    const strict = contextAssemblyMiddleware({ client: new TamperingClient({ baseUrl: service.baseUrl }), template: template(), failOpen: false });
    await assert.rejects(generateText({ model: wrapLanguageModel({ model: mockModel(), middleware: strict }), prompt: "hi" }), FrameMappingError);
    assert.equal(strict.stats.mappingFailures, 1);
    assert.equal(strict.stats.failedOpen, 0);
  });
});

describe("what the frame keeps of the caller's prompt", () => {
  const tools = {
    lookup: tool({ description: "Look a thing up.", inputSchema: jsonSchema<{ q: string }>({ type: "object", properties: { q: { type: "string" } } }) }),
    atlas: tool({ description: "Find a place.", inputSchema: jsonSchema<{ city: string }>({ type: "object", properties: { city: { type: "string" } } }) }),
  };
  const conversation: ModelMessage[] = [
    {
      role: "user",
      content: [
        { type: "text", text: "What is in this picture, and where is Oslo?" },
        { type: "image", image: PNG, mediaType: "image/png" },
      ],
    },
    {
      role: "assistant",
      content: [
        { type: "text", text: "Let me check." },
        { type: "tool-call", toolCallId: "call-1", toolName: "lookup", input: { q: "picture" } },
        { type: "tool-call", toolCallId: "call-2", toolName: "atlas", input: { city: "Oslo" } },
      ],
    },
    {
      role: "tool",
      content: [
        { type: "tool-result", toolCallId: "call-1", toolName: "lookup", output: { type: "json", value: { animal: "cat" } } },
        { type: "tool-result", toolCallId: "call-2", toolName: "atlas", output: { type: "text", value: "Norway" } },
      ],
    },
    { role: "assistant", content: "A cat; Oslo is in Norway." },
    { role: "user", content: "Thanks. Which breed?" },
  ];

  async function both(messages: ModelMessage[]): Promise<{ original: CallParams; framed: CallParams; view: PreparationView }> {
    const plain = mockModel();
    await generateText({ model: plain, system: "You are a careful assistant.", messages, tools });
    const model = mockModel();
    const middleware = contextAssemblyMiddleware({ baseUrl: service.baseUrl, template: template(), contributions: notes });
    const result = await generateText({ model: wrapLanguageModel({ model, middleware }), system: "You are a careful assistant.", messages, tools });
    const view = await client.getPreparation(preparationIdOf(result.providerMetadata));
    return { original: plain.doGenerateCalls[0]!, framed: model.doGenerateCalls[0]!, view };
  }

  /** The framed prompt without the messages the service wrote: the leading instructions, the per-turn and data messages. */
  function callersOwn(framed: CallParams): PromptMessage[] {
    const written = (m: PromptMessage) => m.role === "user" && (textOf(m).includes(BLOCK_TEXT) || textOf(m).startsWith("[developer instructions]\n"));
    return framed.prompt.slice(1).filter((m) => m.role !== "system" && !written(m));
  }

  test("history and input come back as the caller's own messages: tool call and result pairs, the image, output types", async () => {
    const { original, framed, view } = await both(conversation);
    assert.deepEqual(callersOwn(framed), original.prompt.slice(1), "every caller's message, unchanged and in order");
    const image = framed.prompt.flatMap((m) => (m.role === "user" ? m.content : [])).find((p) => p.type === "file");
    assert.ok(image !== undefined && image.data instanceof Uint8Array);
    assert.deepEqual([...image.data], [...PNG], "the image bytes are the caller's");
    assert.equal(view.selection.opaque_or_multimodal, true, "the service counted an image");

    const roles = framed.prompt.map((m) => m.role);
    assert.deepEqual(roles, ["system", "user", "assistant", "tool", "assistant", "user", "user", "user"]);
    assert.match(textOf(framed.prompt[5]), /^\[developer instructions\]\nCurrent date and time: /, "the per-turn developer message, after the first turn, as a marked user message");
    const toolMessage = framed.prompt[3];
    assert.equal(toolMessage?.role, "tool");
    assert.deepEqual(
      toolMessage.content.map((part) => (part.type === "tool-result" ? [part.toolCallId, part.output.type] : [part.type])),
      [
        ["call-1", "json"],
        ["call-2", "text"],
      ],
      "both results, in one tool message, right after their calls",
    );
    assert.deepEqual(
      framed.tools?.map((t) => t.name),
      ["atlas", "lookup"],
      "tools in frame order (sorted by name in stable-prefix)",
    );
    assert.deepEqual(
      framed.tools?.map((t) => t),
      [...(original.tools ?? [])].sort((a, b) => a.name.localeCompare(b.name)),
      "the caller's own tool definitions",
    );
  });

  test("a prompt that ends with tool results: the user's question, the calls and the results are the input, after the data", async () => {
    const { original, framed, view } = await both(conversation.slice(0, 3));
    assert.equal(view.budget.history_tokens, 0, "nothing is history");
    assert.ok(view.budget.input_tokens > 0);
    assert.deepEqual(
      framed.prompt.map((m) => m.role),
      ["system", "system", "user", "user", "assistant", "tool"],
    );
    assert.ok(textOf(framed.prompt[2]).includes(BLOCK_TEXT), "the data message comes before the user's question");
    assert.deepEqual(framed.prompt.slice(3), original.prompt.slice(1));
  });

  test("equal messages keep their own options, also when the service drops the oldest history", async () => {
    const model = mockModel();
    const middleware = contextAssemblyMiddleware({
      baseUrl: service.baseUrl,
      template: template({
        max_context_tokens: 1_000,
        response_reserve: 64,
        assembly: { max_data_tokens: 64, layout: "stable-prefix", history_policy: { mode: "drop_oldest", keep_last_messages: 2 } },
      }),
    });
    const result = await generateText({
      model: wrapLanguageModel({ model, middleware }),
      messages: [
        { role: "user", content: "ok", providerOptions: { test: { copy: 1 } } },
        { role: "assistant", content: "word ".repeat(3_000) },
        { role: "user", content: "ok", providerOptions: { test: { copy: 2 } } },
        { role: "assistant", content: "Noted." },
        { role: "user", content: "ok", providerOptions: { test: { copy: 3 } } },
      ],
    });
    const view = await client.getPreparation(preparationIdOf(result.providerMetadata));
    assert.equal(view.budget.history_dropped_messages, 2);
    const kept = model.doGenerateCalls[0]!.prompt.filter((m) => textOf(m) === "ok");
    assert.deepEqual(
      kept.map((m) => m.providerOptions),
      [{ test: { copy: 2 } }, { test: { copy: 3 } }],
    );
  });
});

describe("cache plans: each provider's options for that provider only", () => {
  const long = Array.from({ length: 400 }, (_, i) => `Rule ${i}: check each figure twice before you answer.`).join(" ");
  const tools = {
    search: tool({ description: long, inputSchema: jsonSchema<{ q: string }>({ type: "object", properties: { q: { type: "string" } } }) }),
    calendar: tool({ description: "Read the calendar.", inputSchema: jsonSchema<{ day: string }>({ type: "object", properties: { day: { type: "string" } } }) }),
  };
  const messages: ModelMessage[] = [
    { role: "user", content: "What is on today?" },
    { role: "assistant", content: "Two meetings." },
    { role: "user", content: "And tomorrow?" },
  ];

  async function cached(model: MockLanguageModelV3) {
    const middleware = contextAssemblyMiddleware({
      client,
      template: template({ cache: { breakpoints: true, ttl: "1h", key: "conversation-7", retention: "24h" } }),
      contributions: notes,
    });
    const result = await generateText({
      model: wrapLanguageModel({ model, middleware }),
      system: `You are a careful assistant. ${long}`,
      messages,
      tools,
      providerOptions: { openai: { user: "u-1" } },
    });
    const view = await client.getPreparation(preparationIdOf(result.providerMetadata));
    const plan = view.selection.cache as unknown as { breakpoints: { after: string; message?: number }[] };
    assert.deepEqual(
      plan.breakpoints.map((b) => b.after),
      ["tools", "instructions", "history"],
      JSON.stringify(view.selection.cache),
    );
    return { params: model.doGenerateCalls[0]!, plan, middleware };
  }

  test("an Anthropic model: breakpoints become cacheControl on the planned messages and the last tool, and no OpenAI option is added", async () => {
    const { params, plan, middleware } = await cached(mockModel("claude-sonnet-4-5", "anthropic.messages"));
    const marker = { type: "ephemeral", ttl: "1h" };
    const marked = params.prompt.flatMap((m, i) => (m.providerOptions?.anthropic?.cacheControl === undefined ? [] : [i]));
    assert.deepEqual(
      marked,
      plan.breakpoints.flatMap((b) => (b.message === undefined ? [] : [b.message])),
    );
    for (const i of marked) assert.deepEqual(params.prompt[i]!.providerOptions?.anthropic?.cacheControl, marker);
    assert.equal(textOf(params.prompt[marked.at(-1)!]), "Two meetings.", "the last history message");
    const lastTool = params.tools?.at(-1);
    assert.equal(lastTool?.name, "search");
    assert.deepEqual(lastTool?.type === "function" ? lastTool.providerOptions?.anthropic?.cacheControl : undefined, marker);
    assert.equal(params.tools?.[0]?.type === "function" ? params.tools[0].providerOptions : "provider", undefined, "only the last tool is marked");
    assert.deepEqual(params.providerOptions?.openai, { user: "u-1" }, "the caller's OpenAI options only");
    assert.equal(middleware.stats.cacheMarkersSkipped, 0);
  });

  test("an OpenAI model: the key and retention become OpenAI options, and no Anthropic marker is placed", async () => {
    const { params, plan, middleware } = await cached(mockModel("gpt-4o-mini", "openai.chat"));
    assert.deepEqual(params.providerOptions?.openai, { promptCacheKey: "conversation-7", promptCacheRetention: "24h", user: "u-1" });
    assert.ok(
      params.prompt.every((m) => m.providerOptions?.anthropic === undefined),
      "no message carries Anthropic options",
    );
    assert.ok(params.tools?.every((t) => t.type !== "function" || t.providerOptions === undefined));
    assert.equal(middleware.stats.cacheMarkersSkipped, plan.breakpoints.length, "the plan's markers are counted as skipped");
  });

  test("another provider gets neither", async () => {
    const { params, plan, middleware } = await cached(mockModel("claude-sonnet-4-5"));
    assert.deepEqual(params.providerOptions?.openai, { user: "u-1" });
    assert.ok(params.prompt.every((m) => m.providerOptions?.anthropic === undefined));
    assert.equal(middleware.stats.cacheMarkersSkipped, plan.breakpoints.length);
  });
});
