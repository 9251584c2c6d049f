// The client against a real `context-assembly serve` process, with a registered contributor
// served by createContributorHandler in this process (signatures verified by the handler).

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import type { Server } from "node:http";
import { after, before, describe, test } from "node:test";

import {
  APIConnectionError,
  AuthenticationError,
  ContextAssemblyClient,
  ContextAssemblyError,
  InvalidRequestError,
  NotFoundError,
  StaleError,
  createContributorHandler,
  neutralFrame,
  type ContributePacket,
  type ContributorContext,
  type PrepareRequest,
  type RevisionPacket,
} from "../src/index.js";
import { close, freePort, listen, startService, type RunningService } from "./support.js";

const SECRET = `whsec_${randomBytes(24).toString("base64")}`;
const API_KEY = `test-key-${randomBytes(8).toString("hex")}`;
const MEMORY_TEXT = "The user prefers metric units.";

interface Seen {
  type: string;
  packet: ContributePacket | RevisionPacket;
  timeoutHeader: string | undefined;
  signature: string | undefined;
  webhookId: string | null;
  deadline: number | null;
}

const seen: Seen[] = [];
let revision = "r1";
let contributorServer: Server;
let service: RunningService;
let client: ContextAssemblyClient;

function record(packet: ContributePacket | RevisionPacket, ctx: ContributorContext): void {
  const timeout = ctx.headers["x-contributor-timeout-ms"];
  const signature = ctx.headers["webhook-signature"];
  seen.push({
    type: ctx.check,
    packet,
    timeoutHeader: Array.isArray(timeout) ? timeout[0] : timeout,
    signature: Array.isArray(signature) ? signature[0] : signature,
    webhookId: ctx.webhookId,
    deadline: ctx.deadline,
  });
}

function request(overrides: Partial<PrepareRequest> = {}): PrepareRequest {
  return {
    model: "gpt-4o-mini",
    instructions: "You are a careful assistant.",
    plugins: [
      { name: "memory", instructions: "Long-term memory of the user.", content: "legacy memory view" },
      { name: "whiteboard", instructions: "Shared task whiteboard." },
    ],
    contributors: [{ source: "memory", endpoint: "mem" }],
    whiteboard: {
      source: "whiteboard",
      entries: [
        { key: "goal", description: "Current goal", value: "ship the client", priority: "high" },
        { key: "deadline", description: "Due date", value: { day: "friday" }, priority: "critical" },
      ],
    },
    input: [{ role: "user", content: "What units should I use?" }],
    scope: { account_id: "acct-1", roles: ["reader"] },
    assembly: { max_data_tokens: 1024, timeout_ms: 5000 },
    ...overrides,
  };
}

before(async () => {
  const handler = createContributorHandler({
    secret: SECRET,
    contribute(packet, ctx) {
      record(packet, ctx);
      return {
        revision,
        blocks: [
          { id: "units", text: MEMORY_TEXT, priority: 10 },
          { id: "hobby", text: "The user climbs on weekends.", projection: "hobby: climbing" },
        ],
      };
    },
    revision(packet, ctx) {
      record(packet, ctx);
      return revision;
    },
  });
  const contributor = await listen(handler);
  contributorServer = contributor.server;
  service = await startService({ apiKey: API_KEY, contributors: { mem: { url: `${contributor.url}/`, secret: SECRET } } });
  client = new ContextAssemblyClient({ baseUrl: service.baseUrl, apiKey: API_KEY, timeoutMs: 10_000 });
});

after(async () => {
  await service?.stop();
  if (contributorServer !== undefined) await close(contributorServer);
});

describe("against a running service", () => {
  test("health and models", async () => {
    assert.deepEqual(await client.health(), { status: "ok" });
    const models = await client.models();
    assert.ok(models.fallback_context_window > 0);
    const mini = models.models.find((m) => m.name === "gpt-4o-mini");
    assert.ok(mini, "gpt-4o-mini is in the registry");
    assert.equal(typeof mini.tokenizer, "string");
  });

  test("prepare with the whiteboard and the registered, signed contributor", async () => {
    const before = seen.length;
    const prepared = await client.prepare(request());
    assert.match(prepared.preparation_id, /^prep_/);
    assert.match(prepared.fingerprint, /^sha256:[0-9a-f]+$/);
    assert.equal(prepared.render, "neutral");

    const sources = Object.fromEntries(prepared.selection.sources.map((s) => [s.source, s]));
    assert.equal(sources.memory?.kind, "webhook");
    assert.equal(sources.memory?.status, "ok");
    assert.equal(sources.memory?.block_count, 2);
    assert.equal(sources.whiteboard?.kind, "whiteboard");

    const blocks = Object.fromEntries(prepared.selection.blocks.map((b) => [`${b.source}/${b.id}`, b]));
    assert.equal(blocks["memory/units"]?.status, "selected");
    assert.equal(blocks["whiteboard/deadline"]?.protected, true);
    assert.equal(blocks["whiteboard/deadline"]?.status, "selected");

    const frame = neutralFrame(prepared);
    assert.ok(JSON.stringify(frame.messages).includes(MEMORY_TEXT), "the contributed block is in the frame");

    // The handler saw one signed contribute packet with the deadline header.
    const calls = seen.slice(before).filter((s) => s.type === "contribute");
    assert.equal(calls.length, 1);
    const call = calls[0]!;
    const packet = call.packet as ContributePacket;
    assert.equal(packet.type, "contribute");
    assert.equal(packet.preparation_id, prepared.preparation_id);
    assert.equal(packet.source, "memory");
    assert.equal(packet.model, "gpt-4o-mini");
    assert.equal(packet.scope.account_id, "acct-1");
    assert.deepEqual(packet.input, [{ role: "user", content: "What units should I use?" }]);
    assert.match(call.signature ?? "", /^v1,[A-Za-z0-9+/]+=*$/);
    assert.match(call.webhookId ?? "", /^msg_/);
    const timeoutMs = Number(call.timeoutHeader);
    assert.ok(timeoutMs >= 1 && timeoutMs <= 5000, `X-Contributor-Timeout-Ms ${call.timeoutHeader}`);
  });

  test("budget calls no contributor and lists it as pending", async () => {
    const before = seen.length;
    const budget = await client.budget(request());
    assert.deepEqual(budget.pending_sources, ["memory"]);
    assert.ok(budget.budget.capacity > 0);
    assert.equal(seen.length, before);
  });

  test("getPreparation returns the manifest without block bodies", async () => {
    const prepared = await client.prepare(request());
    const view = await client.getPreparation(prepared.preparation_id);
    assert.equal(view.preparation_id, prepared.preparation_id);
    assert.equal(view.fingerprint, prepared.fingerprint);
    assert.equal(view.attempt, 1);
    assert.equal(view.refresh_used, false);
    assert.equal(view.accounting.last, null);
    assert.ok(!JSON.stringify(view).includes(MEMORY_TEXT), "no block body is stored");
  });

  test("validate: ok, then stale when the contributor's revision changes", async () => {
    const prepared = await client.prepare(request());
    const body = { model: "gpt-4o-mini", scope: { account_id: "acct-1", roles: ["reader"] }, frame: neutralFrame(prepared) };
    const before = seen.length;
    const ok = await client.validate(prepared.preparation_id, body);
    assert.equal(ok.valid, true);
    assert.equal(ok.preparation_id, prepared.preparation_id);
    assert.ok(seen.slice(before).some((s) => s.type === "revision"), "the revision was re-queried");

    revision = "r2";
    try {
      const error = await client.validate(prepared.preparation_id, body).then(
        () => assert.fail("expected a StaleError"),
        (e: unknown) => e,
      );
      assert.ok(error instanceof StaleError);
      assert.equal(error.status, 409);
      assert.equal(error.code, "CONTEXT_ASSEMBLY_STALE");
      assert.deepEqual(error.reasons, ["revision_changed:memory"]);
    } finally {
      revision = "r1";
    }
  });

  test("refresh once, then refresh again is stale with refresh_used", async () => {
    const prepared = await client.prepare(request());
    const edited = request({ input: [{ role: "user", content: "What units should I use? (metric?)" }] });
    const refreshed = await client.refresh(prepared.preparation_id, edited);
    assert.equal(refreshed.preparation_id, prepared.preparation_id);
    assert.equal(refreshed.attempt, 2);

    await assert.rejects(client.refresh(prepared.preparation_id, edited), (error: unknown) => {
      assert.ok(error instanceof StaleError);
      assert.deepEqual(error.reasons, ["refresh_used"]);
      return true;
    });
    const view = await client.getPreparation(prepared.preparation_id);
    assert.equal(view.refresh_used, true);
  });

  test("repair reuses the frozen frame", async () => {
    const prepared = await client.prepare(request());
    const repaired = await client.repair(prepared.preparation_id, {
      model: "gpt-4o-mini",
      scope: { account_id: "acct-1", roles: ["reader"] },
      instructions: "You are a careful assistant.",
      frame: neutralFrame(prepared),
      answer: "use metric",
      schema: { type: "object", properties: { units: { type: "string" } } },
    });
    assert.equal(repaired.preparation_id, prepared.preparation_id);
    assert.ok(repaired.estimated_input_tokens > 0);
    assert.ok(Array.isArray(repaired.frame.messages));
  });

  test("reportUsage is idempotent per report_id", async () => {
    const prepared = await client.prepare(request());
    const usage = { prompt_tokens: 1200, completion_tokens: 30, prompt_tokens_details: { cached_tokens: 1024 } };
    const first = await client.reportUsage(prepared.preparation_id, { report_id: "rep-1", provider: "openai", call: "main", usage });
    assert.equal(first.accounting.last?.report_id, "rep-1");
    assert.equal(first.accounting.last?.provider_input_tokens, 1200);
    assert.equal(first.accounting.last?.cached_input_tokens, 1024);

    // The same report id again, even with other numbers, changes nothing and answers the same.
    const again = await client.reportUsage(prepared.preparation_id, {
      report_id: "rep-1",
      provider: "openai",
      call: "main",
      usage: { ...usage, prompt_tokens: 9999 },
    });
    assert.deepEqual(again, first);
    const view = await client.getPreparation(prepared.preparation_id);
    assert.deepEqual(view.accounting, first.accounting);
  });

  test("breakdown as text and as HTML", async () => {
    const prepared = await client.prepare(request());
    const text = await client.breakdown(prepared.preparation_id);
    assert.ok(text.includes(`preparation ${prepared.preparation_id}`));
    assert.match(text, /^budget \(the parts add up to the capacity\):$/m);
    assert.ok(!text.includes("<html"));
    const html = await client.breakdown(prepared.preparation_id, { html: true });
    assert.match(html, /<html|<!doctype/i);
  });

  test("timeline lists the turns of the scope, oldest first", async () => {
    const first = await client.prepare(request());
    const second = await client.prepare(request());
    const timeline = await client.timeline(second.preparation_id);
    assert.equal(timeline.preparation_id, second.preparation_id);
    const ids = timeline.turns.map((turn) => turn.preparation_id);
    assert.equal(ids.at(-1), second.preparation_id);
    assert.equal(timeline.turns.at(-1)?.previous_preparation_id, first.preparation_id);
  });

  test("a bad request is an InvalidRequestError naming the field", async () => {
    const error = await client.prepare(request({ model: "" })).then(
      () => assert.fail("expected an InvalidRequestError"),
      (e: unknown) => e,
    );
    assert.ok(error instanceof InvalidRequestError);
    assert.ok(error instanceof ContextAssemblyError);
    assert.equal(error.status, 422);
    assert.equal(error.code, "CONTEXT_ASSEMBLY_INVALID");
    assert.equal(error.problem.status, 422);
    assert.ok(error.errors.some((e) => e.loc === "model"), JSON.stringify(error.problem));

    // A contributor for a source that is not a plugin is refused whole.
    await assert.rejects(
      client.prepare(request({ contributors: [{ source: "nope", endpoint: "mem" }] })),
      InvalidRequestError,
    );
  });

  test("an unknown preparation is a NotFoundError", async () => {
    await assert.rejects(client.getPreparation("prep_does_not_exist"), (error: unknown) => {
      assert.ok(error instanceof NotFoundError);
      assert.equal(error.status, 404);
      assert.equal(error.code, "NOT_FOUND");
      return true;
    });
    await assert.rejects(client.breakdown("prep_does_not_exist"), NotFoundError);
  });

  test("a missing or wrong API key is an AuthenticationError", async () => {
    const anonymous = new ContextAssemblyClient({ baseUrl: service.baseUrl });
    await assert.rejects(anonymous.prepare(request()), AuthenticationError);
    const wrong = new ContextAssemblyClient({ baseUrl: service.baseUrl, apiKey: "wrong" });
    await assert.rejects(wrong.getPreparation("prep_x"), (error: unknown) => {
      assert.ok(error instanceof AuthenticationError);
      assert.equal(error.status, 401);
      return true;
    });
  });

  test("a closed port is an APIConnectionError", async () => {
    const port = await freePort();
    const nowhere = new ContextAssemblyClient({ baseUrl: `http://127.0.0.1:${port}`, maxRetries: 0, timeoutMs: 2_000 });
    await assert.rejects(nowhere.health(), APIConnectionError);
  });
});
