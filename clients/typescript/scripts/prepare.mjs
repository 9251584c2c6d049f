// `npm run prepare`: compile src/ to dist/src/. npm runs it on `npm install` / `npm ci` in this
// folder, before `npm pack`, and when another project installs this folder
// (`npm install <path>/clients/typescript`). In that last case npm does not install this
// package's devDependencies, so the compiler and the types it needs are installed here first,
// once, from package-lock.json (`npm ci --ignore-scripts`; the dependencies of the installing
// project are not touched).

import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(dirname(fileURLToPath(import.meta.url)));
const tsc = join(here, "node_modules", "typescript", "bin", "tsc");

function run(command, args, env = process.env) {
  const result = spawnSync(command, args, { cwd: here, env, stdio: "inherit", shell: process.platform === "win32" });
  if (result.error) throw result.error;
  if (result.status !== 0) process.exit(result.status ?? 1);
}

if (!existsSync(tsc)) {
  // The installing npm describes its own project in npm_config_* variables (local_prefix, omit,
  // global, ...): the nested install must not read them. Where packages come from is kept.
  const keep = new Set(["cache", "userconfig", "globalconfig", "cafile", "registry", "proxy", "https_proxy", "noproxy", "strict_ssl", "prefer_offline", "offline"]);
  const env = Object.fromEntries(
    Object.entries(process.env).filter(([key]) => {
      const lower = key.toLowerCase();
      return !lower.startsWith("npm_config_") || keep.has(lower.slice("npm_config_".length));
    }),
  );
  const npmCli = process.env.npm_execpath;
  const [command, prefix] = npmCli?.endsWith("npm-cli.js") ? [process.execPath, [npmCli]] : ["npm", []];
  run(command, [...prefix, "ci", "--include=dev", "--ignore-scripts", "--no-audit", "--no-fund"], env);
}
run(process.execPath, [tsc, "-p", join(here, "tsconfig.build.json")]);
