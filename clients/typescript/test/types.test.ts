// The generated src/openapi.ts against the committed OpenAPI document, and the public names of
// src/types.ts.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { test } from "node:test";

import { PACKAGE_DIR } from "./support.js";

const OPENAPI = resolve(PACKAGE_DIR, "../../openapi/openapi.json");

interface OpenApiDocument {
  components: { schemas: Record<string, { properties?: Record<string, unknown> }> };
}

function readDocument(): OpenApiDocument {
  return JSON.parse(readFileSync(OPENAPI, "utf8")) as OpenApiDocument;
}

/**
 * A copy of the repository's layout as `npm run check-types` sees it (the OpenAPI document two
 * folders up, the package's manifest, the generated file and its installed dev dependencies), so
 * the document can be changed without touching the checkout.
 */
function copyLayout(root: string): { document: string; packageDir: string } {
  const packageDir = join(root, "clients", "typescript");
  mkdirSync(join(packageDir, "src"), { recursive: true });
  mkdirSync(join(root, "openapi"));
  copyFileSync(join(PACKAGE_DIR, "package.json"), join(packageDir, "package.json"));
  copyFileSync(join(PACKAGE_DIR, "src", "openapi.ts"), join(packageDir, "src", "openapi.ts"));
  symlinkSync(join(PACKAGE_DIR, "node_modules"), join(packageDir, "node_modules"), "dir");
  const document = join(root, "openapi", "openapi.json");
  copyFileSync(OPENAPI, document);
  return { document, packageDir };
}

/** `npm run check-types` in `cwd`, without the npm_config_* variables of an `npm test` that started us. */
function checkTypes(cwd: string): { status: number | null; output: string } {
  const env = Object.fromEntries(Object.entries(process.env).filter(([key]) => !key.toLowerCase().startsWith("npm_config_")));
  const run = spawnSync("npm", ["run", "--silent", "check-types"], { cwd, env, encoding: "utf8", shell: process.platform === "win32" });
  return { status: run.status, output: `${run.stdout}${run.stderr}` };
}

test("npm run check-types passes on the committed files and fails, naming npm run gen-types, once the document gains a field", () => {
  const root = mkdtempSync(join(tmpdir(), "ca-ts-drift-"));
  try {
    const { document, packageDir } = copyLayout(root);
    const clean = checkTypes(packageDir);
    assert.equal(clean.status, 0, clean.output);

    const drifted = readDocument();
    const scope = drifted.components.schemas.Scope;
    assert.ok(scope?.properties !== undefined, "Scope has properties");
    scope.properties.tenant_hint = { type: "string" };
    writeFileSync(document, JSON.stringify(drifted));
    const result = checkTypes(packageDir);
    assert.equal(result.status, 1, result.output);
    assert.match(result.output, /run npm run gen-types/);
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
});

test("src/types.ts exports every schema of the OpenAPI document under the schema's name", () => {
  const source = readFileSync(resolve(PACKAGE_DIR, "src/types.ts"), "utf8");
  const exported = new Set([...source.matchAll(/^ {2}(\w+),$/gm)].map((match) => match[1]));
  const missing = Object.keys(readDocument().components.schemas).filter((name) => !exported.has(name));
  assert.deepEqual(missing, [], "add these names to src/types.ts");
});
