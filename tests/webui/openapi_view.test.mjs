// The API docs page's reading of the OpenAPI document (webui/js/openapi_view.js), against the real
// server/openapi.json that `tessera serve` answers /openapi.json with (node --test tests/webui).
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { dirname, resolve as resolvePath } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { canTry, constraints, fieldsOf, operations, refName, resolve, typeLabel } from '../../webui/js/openapi_view.js';

const root = resolvePath(dirname(fileURLToPath(import.meta.url)), '../..');
const doc = JSON.parse(readFileSync(resolvePath(root, 'server/openapi.json'), 'utf8'));

test('every operation of the document is listed once, in its order', () => {
  const expected = [];
  for (const [path, item] of Object.entries(doc.paths)) {
    for (const m of Object.keys(item)) if (['get', 'post', 'put', 'patch', 'delete'].includes(m)) expected.push(`${m} ${path}`);
  }
  const ops = operations(doc);
  assert.deepEqual(ops.map((o) => `${o.method} ${o.path}`), expected);
  assert.ok(ops.length >= 13, `${ops.length} operations`);
  assert.equal(new Set(ops.map((o) => o.id)).size, ops.length, 'ids are unique (they are anchors)');
  for (const o of ops) assert.match(o.id, /^[A-Za-z0-9_-]+$/);
});

test('a request body merges its allOf parts: the sampling fields and the completion fields', () => {
  const completions = operations(doc).find((o) => o.method === 'post' && o.path === '/v1/completions');
  assert.equal(completions.body.schemaName, 'CompletionRequest');
  const byName = Object.fromEntries(completions.body.fields.map((f) => [f.name, f]));
  assert.ok(byName.prompt.required, 'prompt is required');
  assert.equal(byName.prompt.type, 'string | array of string | TokenIds | array of TokenIds');
  for (const sampling of Object.keys(resolve(doc, { $ref: '#/components/schemas/Sampling' }).properties)) {
    assert.ok(byName[sampling], `Sampling's ${sampling} is listed`);
  }
  assert.equal(byName.logprobs.type, 'integer | null');
  assert.equal(byName.logprobs.limits, '0 ≤ x ≤ 5');
  // No field is left as an unresolved reference or an empty type.
  for (const o of operations(doc)) {
    for (const f of o.body ? o.body.fields : []) {
      assert.ok(f.type && !f.type.includes('#/'), `${o.path} ${f.name}: ${f.type}`);
    }
  }
});

test('responses resolve their $ref to the shared error response', () => {
  const models = operations(doc).find((o) => o.path === '/v1/models/{model}');
  const statuses = Object.fromEntries(models.responses.map((r) => [r.status, r]));
  assert.equal(statuses['200'].schemaName, 'Model');
  assert.ok(statuses['404'].description.length > 0, 'the Error response has its description');
  assert.deepEqual(models.parameters.map((p) => [p.name, p.in, p.required]), [['model', 'path', true]]);
  assert.equal(canTry(models), false, 'a route with a path parameter is not tried as it is');
  const tried = operations(doc).filter(canTry).map((o) => o.path);
  assert.ok(tried.includes('/v1/models') && tried.includes('/health') && tried.includes('/metrics'), tried.join());
  assert.ok(!tried.includes('/v1/ws') && !tried.some((p) => p.startsWith('/v1/chat')), tried.join());
});

test('type labels and limits of the schema forms the document uses', () => {
  assert.equal(refName('#/components/schemas/Sampling'), 'Sampling');
  assert.equal(refName('http://elsewhere/x'), null);
  assert.equal(typeLabel({ type: 'array', items: { type: 'integer' } }), 'array of integer');
  assert.equal(typeLabel({ enum: ['float', 'base64'] }), '"float" | "base64"');
  assert.equal(typeLabel({ type: ['number', 'null'] }), 'number | null');
  assert.equal(typeLabel({}), 'any');
  assert.equal(typeLabel({ properties: { a: {} } }), 'object');
  assert.equal(constraints({ minimum: 0, maximum: 2 }), '0 ≤ x ≤ 2');
  assert.equal(constraints({ exclusiveMinimum: 0 }), 'x > 0');
  assert.equal(constraints({ maximum: 10, default: 3 }), 'x ≤ 10, default 3');
  assert.equal(constraints({ minItems: 1, maxItems: 256 }), '≥ 1 items, ≤ 256 items');
  // A reference cycle ends instead of recursing forever.
  const cyclic = { components: { schemas: { A: { $ref: '#/components/schemas/A' } } } };
  assert.deepEqual(resolve(cyclic, { $ref: '#/components/schemas/A' }), { $ref: '#/components/schemas/A' });
  assert.deepEqual(fieldsOf(cyclic, { $ref: '#/components/schemas/A' }), []);
});
