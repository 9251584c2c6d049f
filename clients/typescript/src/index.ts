export * from "./client.js";
export * from "./contributor.js";
export * from "./errors.js";
export type * from "./types.js";
// The contributor handler's packet: the document's, with the revision check's stand-in in it.
export type { ContributePacket } from "./contributor.js";
