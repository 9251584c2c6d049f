export * from "./client.js";
export * from "./contributor.js";
export * from "./errors.js";
export type * from "./types.js";
