#!/usr/bin/env node
// Generate src/types.ts from the service's committed OpenAPI document (no third-party generator).
//
//   node scripts/gen-types.mjs            write src/types.ts
//   node scripts/gen-types.mjs --check    exit 1 when src/types.ts differs from what would be written
//   options: --openapi PATH (default ../../openapi/openapi.json), --out PATH (default src/types.ts)
//
// Walks `components.schemas` and emits one exported interface (object schemas with properties)
// or type alias (everything else) per schema, sorted by name. Handled: $ref, anyOf/oneOf (a
// `{type: "null"}` member becomes `null`), allOf, enum and const (literal unions), `type` as a
// string or an array, arrays, objects with properties (required vs optional members) and
// additionalProperties (true -> an `unknown` index signature, or Record<string, unknown> without
// members; a schema -> Record<string, T>; false, or absent beside declared members -> closed). Descriptions, defaults and numeric
// or length bounds become JSDoc. The output is deterministic: the same document gives the same
// bytes, which is what the drift check (`npm run check-types`) compares.

import { readFileSync, writeFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const PACKAGE_DIR = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const REF_PREFIX = "#/components/schemas/";
const IDENTIFIER = /^[A-Za-z_$][A-Za-z0-9_$]*$/;

function parseArgs(argv) {
  const args = {
    check: false,
    openapi: resolve(PACKAGE_DIR, "../../openapi/openapi.json"),
    out: resolve(PACKAGE_DIR, "src/types.ts"),
  };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === "--check") args.check = true;
    else if (arg === "--openapi" && i + 1 < argv.length) args.openapi = resolve(argv[++i]);
    else if (arg === "--out" && i + 1 < argv.length) args.out = resolve(argv[++i]);
    else throw new Error(`unknown argument: ${arg}`);
  }
  return args;
}

function literal(value) {
  return JSON.stringify(value);
}

function propertyKey(name) {
  return IDENTIFIER.test(name) ? name : JSON.stringify(name);
}

function union(members) {
  const unique = [];
  for (const member of members) if (!unique.includes(member)) unique.push(member);
  if (unique.includes("unknown")) return "unknown";
  // `null` last reads naturally: `string | null`.
  const ordered = [...unique.filter((m) => m !== "null"), ...unique.filter((m) => m === "null")];
  return ordered.length === 0 ? "never" : ordered.join(" | ");
}

function needsParens(type) {
  return type.includes("|") || type.includes("&");
}

function docLines(schema) {
  const lines = [];
  if (typeof schema.description === "string" && schema.description.trim() !== "") {
    // RST-style ``code`` reads better as Markdown `code` in editors.
    const text = schema.description.replace(/``([^`]+)``/g, "`$1`").replaceAll("*/", "*\\/");
    lines.push(...text.trim().split("\n").map((l) => l.trimEnd()));
  }
  const bounds = [];
  for (const key of ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "minItems", "maxItems"]) {
    if (typeof schema[key] === "number") bounds.push(`${key} ${schema[key]}`);
  }
  if (bounds.length > 0) lines.push(bounds.join(", "));
  if (schema.default !== undefined) lines.push(`@default ${JSON.stringify(schema.default)}`);
  return lines;
}

function emitDoc(lines, indent) {
  if (lines.length === 0) return [];
  if (lines.length === 1) return [`${indent}/** ${lines[0]} */`];
  return [`${indent}/**`, ...lines.map((l) => (l === "" ? `${indent} *` : `${indent} * ${l}`)), `${indent} */`];
}

class Generator {
  constructor(document) {
    this.schemas = document?.components?.schemas;
    if (this.schemas === null || typeof this.schemas !== "object") {
      throw new Error("the OpenAPI document has no components.schemas");
    }
  }

  refName(ref) {
    if (typeof ref !== "string" || !ref.startsWith(REF_PREFIX)) {
      throw new Error(`unsupported $ref: ${ref}`);
    }
    const name = ref.slice(REF_PREFIX.length);
    if (!(name in this.schemas)) throw new Error(`$ref to a missing schema: ${ref}`);
    if (!IDENTIFIER.test(name)) throw new Error(`schema name is not a TypeScript identifier: ${name}`);
    return name;
  }

  /** The TypeScript type expression of `schema`, nested objects indented by `indent`. */
  type(schema, indent) {
    if (schema === true || schema === undefined) return "unknown";
    if (schema === false) return "never";
    if (typeof schema !== "object" || schema === null) throw new Error(`not a schema: ${literal(schema)}`);
    if (schema.$ref !== undefined) return this.refName(schema.$ref);
    if (schema.const !== undefined) return literal(schema.const);
    if (Array.isArray(schema.enum)) return union(schema.enum.map(literal));
    const alternatives = schema.anyOf ?? schema.oneOf;
    if (Array.isArray(alternatives)) return union(alternatives.map((s) => this.type(s, indent)));
    if (Array.isArray(schema.allOf)) {
      const parts = schema.allOf.map((s) => this.type(s, indent));
      return parts.length === 1 ? parts[0] : parts.map((p) => (needsParens(p) ? `(${p})` : p)).join(" & ");
    }
    if (Array.isArray(schema.type)) {
      return union(schema.type.map((t) => this.type({ ...schema, type: t }, indent)));
    }
    switch (schema.type) {
      case "null":
        return "null";
      case "string":
        return "string";
      case "integer":
      case "number":
        return "number";
      case "boolean":
        return "boolean";
      case "array": {
        const item = this.type(schema.items, indent);
        return needsParens(item) ? `(${item})[]` : `${item}[]`;
      }
      case "object":
        return this.objectType(schema, indent);
      case undefined:
        return schema.properties !== undefined ? this.objectType(schema, indent) : "unknown";
      default:
        throw new Error(`unsupported type: ${literal(schema.type)}`);
    }
  }

  hasMembers(schema) {
    return schema.properties !== undefined && Object.keys(schema.properties).length > 0;
  }

  /** `[key: string]: T` for an open object, or null for a closed one. */
  indexType(schema, indent) {
    const extra = schema.additionalProperties;
    if (extra === false) return null;
    // Like openapi-typescript: an object with declared members is open only when it says so
    // (`additionalProperties: true` or a schema), so typos in member names stay compile errors.
    if (extra === undefined) return this.hasMembers(schema) ? null : "unknown";
    if (extra === true) return "unknown";
    // Declared members must be assignable to the index type; keep it honest and simple.
    return this.hasMembers(schema) ? "unknown" : this.type(extra, indent);
  }

  members(schema, indent) {
    const required = new Set(Array.isArray(schema.required) ? schema.required : []);
    const lines = [];
    for (const [name, property] of Object.entries(schema.properties ?? {})) {
      lines.push(...emitDoc(docLines(property), indent));
      const optional = required.has(name) ? "" : "?";
      lines.push(`${indent}${propertyKey(name)}${optional}: ${this.type(property, indent)};`);
    }
    const index = this.indexType(schema, indent);
    if (index !== null) lines.push(`${indent}[key: string]: ${index};`);
    return lines;
  }

  objectType(schema, indent) {
    if (!this.hasMembers(schema)) {
      const index = this.indexType(schema, indent);
      return index === null ? "Record<string, never>" : `Record<string, ${index}>`;
    }
    const inner = `${indent}  `;
    return ["{", ...this.members(schema, inner), `${indent}}`].join("\n");
  }

  declaration(name, schema) {
    const lines = emitDoc(docLines(schema), "");
    const isInterface =
      typeof schema === "object" &&
      schema !== null &&
      (schema.type === "object" || schema.type === undefined) &&
      schema.$ref === undefined &&
      schema.anyOf === undefined &&
      schema.oneOf === undefined &&
      schema.allOf === undefined &&
      schema.enum === undefined &&
      schema.const === undefined &&
      this.hasMembers(schema);
    if (isInterface) {
      lines.push(`export interface ${name} {`, ...this.members(schema, "  "), "}");
    } else {
      lines.push(`export type ${name} = ${this.type(schema, "")};`);
    }
    return lines.join("\n");
  }

  generate(document) {
    const names = Object.keys(this.schemas).sort();
    const title = typeof document?.info?.title === "string" ? ` (${document.info.title})` : "";
    const header = [
      "// Generated by scripts/gen-types.mjs from openapi/openapi.json" + title + ".",
      "// Do not edit by hand: run `npm run gen-types` after the OpenAPI document changes;",
      "// `npm run check-types` (part of `npm test`) fails while this file is out of date.",
    ];
    const body = names.map((name) => {
      if (!IDENTIFIER.test(name)) throw new Error(`schema name is not a TypeScript identifier: ${name}`);
      return this.declaration(name, this.schemas[name]);
    });
    return [...header, "", body.join("\n\n"), ""].join("\n");
  }
}

/** The text of src/types.ts for the OpenAPI document `document`. */
export function generateTypes(document) {
  return new Generator(document).generate(document);
}

function firstDifference(a, b) {
  const left = a.split("\n");
  const right = b.split("\n");
  for (let i = 0; i < Math.max(left.length, right.length); i++) {
    if (left[i] !== right[i]) {
      return `line ${i + 1}:\n  committed: ${literal(left[i] ?? "<end of file>")}\n  generated: ${literal(right[i] ?? "<end of file>")}`;
    }
  }
  return "no line differs";
}

function main() {
  const args = parseArgs(process.argv.slice(2));
  const document = JSON.parse(readFileSync(args.openapi, "utf8"));
  const generated = generateTypes(document);
  if (!args.check) {
    writeFileSync(args.out, generated);
    console.log(`wrote ${args.out}`);
    return;
  }
  let committed;
  try {
    committed = readFileSync(args.out, "utf8");
  } catch {
    committed = "";
  }
  if (committed !== generated) {
    console.error(
      `${args.out} is out of date with ${args.openapi} (first difference at ${firstDifference(committed, generated)})\n` +
        "Run `npm run gen-types` in clients/typescript and commit the result.",
    );
    process.exitCode = 1;
    return;
  }
  console.log(`types up to date: ${args.out} matches ${args.openapi}`);
}

if (process.argv[1] !== undefined && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  main();
}
