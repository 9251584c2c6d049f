// The Vercel AI SDK middleware end to end, offline: the AI SDK's own mock model stands in for the
// provider, the service runs at CONTEXT_ASSEMBLY_URL. Prints ids, statuses and token counts,
// never block texts.
//
//   (cd clients/typescript && npm install)      # once: installs `ai` 6 and builds dist/
//   CONTEXT_ASSEMBLY_URL=http://127.0.0.1:8080 node examples/integrations/ai_sdk.mjs
//
// This file lives outside the package, so it loads `ai` and the client from clients/typescript,
// where `npm install` put them. In an application these are plain imports:
//   import { generateText, streamText, wrapLanguageModel } from "ai";
//   import { contextAssemblyMiddleware } from "context-assembly-client/ai-sdk";

import { createServer } from "node:net";
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";

const packageDir = new URL("../../clients/typescript/", import.meta.url);
const fromPackage = createRequire(new URL("package.json", packageDir));
function load(name) {
  let path;
  try {
    path = fromPackage.resolve(name);
  } catch {
    console.error(`${name} is not installed in clients/typescript: run \`npm install\` there first`);
    process.exit(2);
  }
  return import(pathToFileURL(path).href);
}
const { generateText, simulateReadableStream, streamText, wrapLanguageModel } = await load("ai");
const { MockLanguageModelV3 } = await load("ai/test");
const { ContextAssemblyClient } = await import(new URL("dist/src/index.js", packageDir).href);
const { contextAssemblyMiddleware } = await import(new URL("dist/src/ai-sdk.js", packageDir).href);

const baseUrl = process.env.CONTEXT_ASSEMBLY_URL ?? "http://127.0.0.1:8080";
const apiKey = process.env.CONTEXT_ASSEMBLY_API_KEY;
const client = new ContextAssemblyClient({ baseUrl, apiKey, timeoutMs: 10_000 });

// A stand-in for the provider: answers one sentence and bills about a token per 4 characters.
function mockModel() {
  const usageFor = (params) => ({
    inputTokens: { total: Math.ceil(JSON.stringify(params.prompt).length / 4), noCache: undefined, cacheRead: 0, cacheWrite: undefined },
    outputTokens: { total: 6, text: 6, reasoning: undefined },
  });
  return new MockLanguageModelV3({
    provider: "openai.chat", // the middleware maps the frame for the provider it calls
    modelId: "gpt-4o-mini",
    doGenerate: async (params) => ({
      content: [{ type: "text", text: "Metric it is." }],
      finishReason: { unified: "stop", raw: "stop" },
      usage: usageFor(params),
      warnings: [],
    }),
    doStream: async (params) => ({
      stream: simulateReadableStream({
        initialDelayInMs: null,
        chunkDelayInMs: null,
        chunks: [
          { type: "stream-start", warnings: [] },
          { type: "text-start", id: "t" },
          { type: "text-delta", id: "t", delta: "Metric it is." },
          { type: "text-end", id: "t" },
          { type: "finish", finishReason: { unified: "stop", raw: "stop" }, usage: usageFor(params) },
        ],
      }),
    }),
  });
}

// The application's own notes for this user: sent inline with every call.
const notes = () => [
  {
    source: "notes",
    revision: "12",
    blocks: [
      { id: "units", text: "The user prefers metric units.", protected: true },
      { id: "trip", text: "Planning a cycling trip through the Alps in June.", priority: 5 },
      { id: "history", text: "Older conversation summary. ".repeat(200), priority: -5, projection: "Older summary (shortened)." },
    ],
  },
];

const template = {
  plugins: [{ name: "notes", instructions: "Notes about the user, newest first." }],
  assembly: { max_data_tokens: 256, layout: "stable-prefix" },
  scope: { account_id: "acct-example", task_id: `ai-sdk-${process.pid}` },
  cache: { key: "auto" },
};

function roles(prompt) {
  return prompt.map((message) => message.role).join(",");
}

async function show(preparationId, middleware) {
  await middleware.flush(); // the usage report runs in the background
  const view = await client.getPreparation(preparationId);
  for (const block of view.selection.blocks) {
    console.log(`  ${block.source}/${block.id}: ${block.status} (${block.reason}) tokens=${block.tokens} full=${block.full_tokens}`);
  }
  const last = view.accounting.last;
  console.log(`  budget: total_input=${view.budget.total_input_tokens} data=${view.budget.data_tokens}/${view.budget.data_limit_tokens}`);
  console.log(`  usage report ${last?.report_id}: provider=${last?.provider} input=${last?.provider_input_tokens} output=${last?.output_tokens} delta=${last?.input_token_delta}`);
}

// 1. generateText through the middleware.
const middleware = contextAssemblyMiddleware({ client, template, contributions: notes });
const model = mockModel();
const generated = await generateText({
  model: wrapLanguageModel({ model, middleware }),
  system: "You are a careful travel assistant.",
  prompt: "Which units should the route plan use?",
});
const generatedId = generated.providerMetadata?.contextAssembly?.preparationId;
const sent = model.doGenerateCalls[0];
console.log(`generateText: preparation ${generatedId}`);
console.log(`  the model got ${sent.prompt.length} messages (${roles(sent.prompt)}); openai.promptCacheKey set: ${sent.providerOptions?.openai?.promptCacheKey !== undefined}`);
await show(generatedId, middleware);

// 2. streamText: the usage is reported when the stream's finish part arrives.
const streamed = streamText({ model: wrapLanguageModel({ model: mockModel(), middleware }), prompt: "And the climbing totals?" });
const streamedText = await streamed.text;
const streamedId = (await streamed.providerMetadata)?.contextAssembly?.preparationId;
console.log(`streamText: preparation ${streamedId}, ${streamedText.length} characters streamed`);
await show(streamedId, middleware);

// 3. The service out of reach: the call goes on with its original prompt, after one warning.
const port = await new Promise((resolve) => {
  const server = createServer().listen(0, "127.0.0.1", () => {
    const { port } = server.address();
    server.close(() => resolve(port));
  });
});
const failures = [];
const unreachable = contextAssemblyMiddleware({
  baseUrl: `http://127.0.0.1:${port}`,
  template,
  contributions: notes,
  onError: (error, info) => failures.push(`${info.phase}: ${error.name}`),
});
const direct = mockModel();
await generateText({ model: wrapLanguageModel({ model: direct, middleware: unreachable }), prompt: "Which units?" });
console.log(`closed port: ${failures.join("; ")}; the model got ${direct.doGenerateCalls[0].prompt.length} message (${roles(direct.doGenerateCalls[0].prompt)})`);

console.log(`stats: ${JSON.stringify(middleware.stats)}`);
console.log(`closed port stats: ${JSON.stringify(unreachable.stats)}`);
