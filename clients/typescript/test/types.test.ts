// The drift check of src/types.ts against the committed OpenAPI document, and the generator.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { test } from "node:test";
import { pathToFileURL } from "node:url";

import { PACKAGE_DIR } from "./support.js";

const SCRIPT = resolve(PACKAGE_DIR, "scripts/gen-types.mjs");
const OPENAPI = resolve(PACKAGE_DIR, "../../openapi/openapi.json");
const TYPES = resolve(PACKAGE_DIR, "src/types.ts");

type Generate = (document: unknown) => string;

async function generator(): Promise<Generate> {
  const module = (await import(pathToFileURL(SCRIPT).href)) as { generateTypes: Generate };
  return module.generateTypes;
}

function check(...args: string[]): { status: number | null; output: string } {
  const run = spawnSync(process.execPath, [SCRIPT, "--check", ...args], { encoding: "utf8" });
  return { status: run.status, output: run.stdout + run.stderr };
}

test("src/types.ts is what the generator makes from openapi/openapi.json", async () => {
  const generate = await generator();
  const expected = generate(JSON.parse(readFileSync(OPENAPI, "utf8")));
  assert.equal(readFileSync(TYPES, "utf8"), expected, "run `npm run gen-types` and commit src/types.ts");
  assert.equal(check().status, 0);
});

test("the check fails when the OpenAPI document drifts from src/types.ts", () => {
  const folder = mkdtempSync(join(tmpdir(), "ca-ts-drift-"));
  try {
    const document = JSON.parse(readFileSync(OPENAPI, "utf8"));
    document.components.schemas.Scope.properties.tenant_hint = { type: "string" };
    const drifted = join(folder, "openapi.json");
    writeFileSync(drifted, JSON.stringify(document));
    const result = check("--openapi", drifted);
    assert.equal(result.status, 1, result.output);
    assert.match(result.output, /out of date/);
    assert.match(result.output, /tenant_hint/);
  } finally {
    rmSync(folder, { recursive: true, force: true });
  }
});

test("the generator covers refs, nullable unions, enums, consts, arrays and maps", async () => {
  const generate = await generator();
  const text = generate({
    info: { title: "t" },
    components: {
      schemas: {
        Thing: {
          type: "object",
          description: "A ``thing``.",
          additionalProperties: false,
          required: ["id", "kind"],
          properties: {
            id: { type: "string", minLength: 1 },
            kind: { enum: ["a", "b"] },
            fixed: { const: 3 },
            parent: { anyOf: [{ $ref: "#/components/schemas/Thing" }, { type: "null" }] },
            tags: { type: "array", items: { oneOf: [{ type: "string" }, { type: "integer" }] } },
            counts: { type: "object", additionalProperties: { type: "integer" } },
            extra: { type: "object", additionalProperties: true },
            both: { type: ["string", "null"] },
            "odd-name": { type: "boolean", default: false },
            anything: {},
          },
        },
        Open: { type: "object", additionalProperties: true, properties: { a: { type: "number" } }, required: ["a"] },
        Mode: { type: "string", enum: ["x", "y"] },
        Combined: { allOf: [{ $ref: "#/components/schemas/Open" }, { $ref: "#/components/schemas/Mode" }] },
      },
    },
  });
  for (const line of [
    "export type Combined = Open & Mode;",
    'export type Mode = "x" | "y";',
    "export interface Open {\n  a: number;\n  [key: string]: unknown;\n}",
    "/** A `thing`. */\nexport interface Thing {",
    "  id: string;",
    '  kind: "a" | "b";',
    "  fixed?: 3;",
    "  parent?: Thing | null;",
    "  tags?: (string | number)[];",
    "  counts?: Record<string, number>;",
    "  extra?: Record<string, unknown>;",
    "  both?: string | null;",
    '  "odd-name"?: boolean;',
    "  anything?: unknown;",
  ]) {
    assert.ok(text.includes(line), `missing:\n${line}\nin:\n${text}`);
  }
  assert.ok(!/interface Thing \{[^}]*\[key: string\]/.test(text), "a closed object has no index signature");
  assert.throws(() => generate({ components: { schemas: { A: { $ref: "#/components/schemas/Missing" } } } }), /missing schema/);
});
