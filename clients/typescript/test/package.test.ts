// The package as a user installs it, from a copy of its sources without node_modules or dist (a
// fresh clone): `npm install <folder>` builds and links it; `npm pack` writes a tarball that
// installs into an empty project, where `tsc --strict` compiles a consumer of both entry points
// (the main one without `ai` installed: it is an optional peer) and every TypeScript example of
// README.md; the first README example then runs against a real service on its default
// configuration. Packages come from npm's cache when it has them (`--prefer-offline`), in the
// versions this package's lockfile installed.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { cpSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { after, before, describe, test } from "node:test";
import { promisify } from "node:util";

import { PACKAGE_DIR, startService, type RunningService } from "./support.js";

const run = promisify(execFile);
/** npm and tsc get this long per command before the test fails (not a timing assertion: a hang guard). */
const COMMAND_TIMEOUT_MS = 180_000;
const NPM_FLAGS = ["--prefer-offline", "--no-audit", "--no-fund", "--loglevel=error"];

function installedVersion(name: string): string {
  const manifest = JSON.parse(readFileSync(join(PACKAGE_DIR, "node_modules", name, "package.json"), "utf8")) as { version: string };
  return `${name}@${manifest.version}`;
}

async function npm(cwd: string, ...args: string[]): Promise<string> {
  // Only this test's own variables: an npm_config_* of the `npm test` that started us would
  // describe this package's project, not the temporary one.
  const env = Object.fromEntries(Object.entries(process.env).filter(([key]) => !key.toLowerCase().startsWith("npm_config_")));
  const { stdout } = await run("npm", args, { cwd, env, timeout: COMMAND_TIMEOUT_MS, maxBuffer: 16 * 1024 * 1024 });
  return stdout;
}

async function tsc(cwd: string, ...args: string[]): Promise<void> {
  const strict = ["--strict", "--module", "nodenext", "--moduleResolution", "nodenext", "--target", "es2022", "--types", "node"];
  try {
    await run(process.execPath, [join(cwd, "node_modules", "typescript", "bin", "tsc"), ...strict, ...args], { cwd, timeout: COMMAND_TIMEOUT_MS });
  } catch (error) {
    const { stdout } = error as { stdout?: string };
    assert.fail(`tsc --strict ${args.join(" ")} failed:\n${stdout ?? String(error)}`);
  }
}

/** The ```ts blocks of a Markdown file; `ts compile-only` blocks are compiled but not run. */
function typescriptBlocks(markdown: string): { code: string; run: boolean }[] {
  return [...markdown.matchAll(/^```ts( compile-only)?\n([\s\S]*?)^```$/gm)].map((match) => ({ code: match[2] ?? "", run: match[1] === undefined }));
}

let work: string;
let service: RunningService;

before(async () => {
  work = mkdtempSync(join(tmpdir(), "ca-ts-package-"));
  service = await startService(); // the default configuration: no keys, no contributors
});

after(async () => {
  await service?.stop();
  if (work !== undefined) rmSync(work, { recursive: true, force: true });
});

describe("the package as a user installs it", () => {
  let source: string;
  let tarball: string;

  test("npm install <folder> builds a fresh copy of the sources and links it", async () => {
    source = join(work, "source");
    const built = new Set(["node_modules", "dist"]); // what a fresh clone does not have
    cpSync(PACKAGE_DIR, source, { recursive: true, filter: (path) => !built.has(relative(PACKAGE_DIR, path)) });
    const consumer = join(work, "linked");
    mkdirSync(consumer);
    writeFileSync(join(consumer, "package.json"), JSON.stringify({ name: "linked-consumer", private: true, type: "module" }));
    await npm(consumer, "install", ...NPM_FLAGS, source);
    const { stdout } = await run(
      process.execPath,
      ["--input-type=module", "-e", 'const m = await import("context-assembly-client"); console.log(typeof m.ContextAssemblyClient, m.VERSION)'],
      { cwd: consumer },
    );
    assert.equal(stdout.trim(), "function 0.1.0");
  });

  test("npm pack writes a tarball with the compiled entry points and no tests", async () => {
    assert.ok(source !== undefined, "the copy of the sources exists");
    await npm(source, "pack", ...NPM_FLAGS, "--pack-destination", work);
    const name = readdirSync(work).find((file) => file.endsWith(".tgz"));
    assert.ok(name !== undefined, `a tarball in ${readdirSync(work).join(", ")}`);
    tarball = join(work, name);
    const listing = await run("tar", ["-tzf", tarball]);
    const files = listing.stdout.split("\n").filter(Boolean);
    for (const file of ["package/dist/src/index.js", "package/dist/src/index.d.ts", "package/dist/src/ai-sdk.js", "package/dist/src/ai-sdk.d.ts", "package/README.md"]) {
      assert.ok(files.includes(file), `${file} is packed`);
    }
    assert.ok(!files.some((file) => file.includes("/test/") || file.includes("node_modules")), "no tests, no dependencies");
  });

  test("the tarball installs into an empty project and type-checks under tsc --strict, with and without ai", async () => {
    assert.ok(tarball !== undefined, "the tarball exists");
    const consumer = join(work, "consumer");
    mkdirSync(consumer);
    writeFileSync(join(consumer, "package.json"), JSON.stringify({ name: "consumer", private: true, type: "module" }));
    await npm(consumer, "install", ...NPM_FLAGS, tarball, installedVersion("typescript"), installedVersion("@types/node"));

    writeFileSync(
      join(consumer, "main.ts"),
      [
        'import { ContextAssemblyClient, InvalidRequestError, type PrepareRequest } from "context-assembly-client";',
        'const client = new ContextAssemblyClient({ baseUrl: "http://127.0.0.1:8080" });',
        'const request: PrepareRequest = { model: "gpt-4o-mini", input: [{ role: "user", content: "hi" }] };',
        "export const id: Promise<string> = client.prepare(request).then((answer) => answer.preparation_id);",
        "export const isInvalid = (error: unknown): boolean => error instanceof InvalidRequestError;",
        "// @ts-expect-error: a token budget is a number",
        'export const wrong: PrepareRequest = { model: "m", max_context_tokens: "lots" };',
        "",
      ].join("\n"),
    );
    await tsc(consumer, "--noEmit", "main.ts");

    // With skipLibCheck off, as here, the AI SDK's own declarations need @types/json-schema.
    await npm(consumer, "install", ...NPM_FLAGS, installedVersion("ai"), installedVersion("zod"), installedVersion("@types/json-schema"), installedVersion("openai"));
    writeFileSync(
      join(consumer, "middleware.ts"),
      [
        'import { generateText, wrapLanguageModel } from "ai";',
        'import { MockLanguageModelV3 } from "ai/test";',
        'import { ContextAssemblyClient } from "context-assembly-client";',
        'import { contextAssemblyMiddleware, type ContextAssemblyMiddleware } from "context-assembly-client/ai-sdk";',
        "const middleware: ContextAssemblyMiddleware = contextAssemblyMiddleware({",
        '  client: new ContextAssemblyClient({ baseUrl: "http://127.0.0.1:8080" }),',
        '  template: { model: "gpt-4o-mini", scope: { account_id: "acct-1" }, plugins: [{ name: "notes" }] },',
        '  contributions: async () => [{ source: "notes", revision: 1, blocks: [{ id: "a", text: "b" }] }],',
        "  onError: (error, info) => console.warn(info.phase, error),",
        "});",
        "const model = wrapLanguageModel({ model: new MockLanguageModelV3(), middleware });",
        'export const answer: Promise<string> = generateText({ model, prompt: "hi" }).then((result) => result.text);',
        "export const failures: number = middleware.stats.usageReportFailures;",
        "// @ts-expect-error: the call supplies the input, a template cannot",
        'contextAssemblyMiddleware({ baseUrl: "http://127.0.0.1:8080", template: { input: [] } });',
        "",
      ].join("\n"),
    );
    await tsc(consumer, "--noEmit", "main.ts", "middleware.ts");
  });

  test("README.md's TypeScript examples compile under tsc --strict, and the first one runs on the default configuration", async () => {
    const consumer = join(work, "consumer");
    const blocks = typescriptBlocks(readFileSync(join(PACKAGE_DIR, "README.md"), "utf8"));
    assert.ok(blocks.length >= 2, `README.md has its examples (${blocks.length} found)`);
    const files = blocks.map((block, index) => {
      const file = `readme-${index + 1}.ts`;
      writeFileSync(join(consumer, file), block.code);
      return file;
    });
    await tsc(consumer, "--outDir", "out", ...files);

    const runnable = blocks.map((block, index) => (block.run ? index : -1)).filter((index) => index >= 0);
    assert.deepEqual(runnable, [0], "the first example is the one to run");
    const env: NodeJS.ProcessEnv = { ...process.env, CONTEXT_ASSEMBLY_URL: service.baseUrl };
    delete env.CONTEXT_ASSEMBLY_KEY; // the default configuration has no keys
    const { stdout } = await run(process.execPath, [join("out", "readme-1.js")], { cwd: consumer, env, timeout: COMMAND_TIMEOUT_MS });
    assert.match(stdout, /^memory units selected protected \d+$/m);
    assert.match(stdout, /^memory notes (selected|projected|omitted) /m);
    assert.match(stdout, /preparation prep_/);
    assert.ok(!stdout.includes("The user prefers metric units."), "the example prints no block text");
  });
});
