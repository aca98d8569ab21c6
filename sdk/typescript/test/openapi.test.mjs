// docs/openapi.json is the contract: every operation and every error kind
// it documents must be covered by the SDK.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import * as sdk from "../dist/index.js";
import { repoDir } from "./helpers.mjs";

const doc = JSON.parse(readFileSync(join(repoDir, "docs/openapi.json"), "utf8"));

function operations() {
  const ids = [];
  for (const ops of Object.values(doc.paths)) {
    for (const op of Object.values(ops)) if (op && typeof op === "object" && op.operationId) ids.push(op.operationId);
  }
  return ids;
}

// The error kinds the document names: the error body's kind (its enum, and
// the lists of its description) and every "kind K" of an error answer's
// description.
function errorKinds() {
  const kinds = new Set();
  const kind = doc.components.schemas.ErrorBody.properties.error.properties.kind;
  for (const k of kind.enum ?? []) kinds.add(k);
  const desc = kind.description ?? "";
  for (const list of [desc.match(/\(([^)]*)\)/)?.[1], desc.match(/otherwise ([^.]*)/)?.[1]]) {
    for (const k of (list ?? "").split(/,\s*|\s+or\s+/)) if (/^[a-z][A-Za-z]+$/.test(k.trim())) kinds.add(k.trim());
  }
  for (const ops of Object.values(doc.paths)) {
    for (const op of Object.values(ops)) {
      for (const [status, r] of Object.entries(op?.responses ?? {})) {
        if (Number(status) < 400) continue;
        for (const m of (r.description ?? "").matchAll(/\bkind ([a-z][A-Za-z]+)/g)) kinds.add(m[1]);
      }
    }
  }
  return kinds;
}

test("every operation of docs/openapi.json has a method", () => {
  const ids = operations();
  assert.ok(ids.length > 40, `only ${ids.length} operations: the document was not read`);
  const missing = ids.filter((id) => !(id in sdk.OPERATIONS) && !(id in sdk.NOT_COVERED));
  for (const id of Object.keys(sdk.NOT_COVERED)) assert.ok(ids.includes(id), `NOT_COVERED names ${id}, which the document does not have`);
  assert.deepEqual(missing, [], "operations the SDK does not cover: add a method and name it in OPERATIONS");
  for (const [id, where] of Object.entries(sdk.OPERATIONS)) {
    assert.ok(ids.includes(id), `OPERATIONS names ${id}, which the document does not have`);
    const [cls, method] = where.split(".");
    assert.equal(typeof sdk[cls]?.prototype?.[method], "function", `${id}: ${where} is not a method`);
  }
});

test("every error kind of docs/openapi.json has its error class", () => {
  const kinds = errorKinds();
  for (const k of ["prepare", "timeout", "forbidden", "busy", "noSpace"]) assert.ok(kinds.has(k), `the document's kinds were not read: ${[...kinds]}`);
  const missing = [...kinds].filter((k) => !(k in sdk.ERROR_KINDS));
  assert.deepEqual(missing, [], "error kinds the SDK does not cover: add a class and name it in ERROR_KINDS");
  for (const [k, cls] of Object.entries(sdk.ERROR_KINDS)) {
    const e = sdk.errorFor(k, "m", { status: 400 });
    assert.ok(e instanceof cls && e instanceof sdk.CorralError, k);
    assert.equal(e.kind, k);
  }
  // Every 429 is a rate limit, with its Retry-After.
  const e = sdk.errorFor("prepare", "budget", { status: 429, retryAfter: 2 });
  assert.ok(e instanceof sdk.RateLimitedError);
  assert.equal(e.retryAfter, 2);
});
