// What the API docs page (/docs) shows of an OpenAPI 3.1 document (server/openapi.json), apart from
// the DOM so that Node's test runner checks it against the real document: the operations in order,
// and each schema flattened into the rows of a field table ($ref resolved, allOf merged).
// OpenAPI 3.1 schemas are JSON Schema 2020-12 (https://spec.openapis.org/oas/v3.1.0#schema-object).

const METHODS = ['get', 'post', 'put', 'patch', 'delete'];

// '#/components/schemas/Name' -> 'Name'; null for anything else.
export function refName(ref) {
  const m = /^#\/components\/(?:schemas|responses)\/([A-Za-z0-9_.-]+)$/.exec(ref || '');
  return m ? m[1] : null;
}

// The schema a $ref points to (one level; a component that is itself a $ref is followed, bounded).
export function resolve(doc, schema) {
  let s = schema;
  for (let i = 0; i < 8 && s && s.$ref; i++) {
    const name = refName(s.$ref);
    const components = s.$ref.startsWith('#/components/responses/') ? doc.components?.responses : doc.components?.schemas;
    s = name && components ? components[name] : undefined;
  }
  return s || {};
}

// A short type label: 'string', 'integer | null', 'array of string', 'TokenIds' (a component), 'one of: ...'.
export function typeLabel(schema) {
  if (!schema || typeof schema !== 'object') return 'any';
  if (schema.$ref) return refName(schema.$ref) || schema.$ref;
  for (const key of ['oneOf', 'anyOf']) {
    if (Array.isArray(schema[key])) return schema[key].map(typeLabel).join(' | ');
  }
  if (Array.isArray(schema.allOf)) return schema.allOf.map(typeLabel).join(' & ');
  if (Array.isArray(schema.enum)) return schema.enum.map((v) => JSON.stringify(v)).join(' | ');
  if ('const' in schema) return JSON.stringify(schema.const);
  const types = Array.isArray(schema.type) ? schema.type : schema.type ? [schema.type] : [];
  if (!types.length) return schema.properties ? 'object' : 'any';
  return types.map((t) => (t === 'array' && schema.items ? 'array of ' + typeLabel(schema.items) : t)).join(' | ');
}

// The limits a schema states, as short text ('0 ≤ x ≤ 2', 'default 16', '≤ 256 items').
export function constraints(schema) {
  if (!schema || typeof schema !== 'object') return '';
  const out = [];
  const lower = schema.minimum !== undefined ? [schema.minimum, '≤', '≥'] : schema.exclusiveMinimum !== undefined ? [schema.exclusiveMinimum, '<', '>'] : null;
  const upper = schema.maximum !== undefined ? [schema.maximum, '≤'] : schema.exclusiveMaximum !== undefined ? [schema.exclusiveMaximum, '<'] : null;
  if (lower && upper) out.push(`${lower[0]} ${lower[1]} x ${upper[1]} ${upper[0]}`);
  else if (lower) out.push(`x ${lower[2]} ${lower[0]}`);
  else if (upper) out.push(`x ${upper[1]} ${upper[0]}`);
  if (schema.minLength !== undefined) out.push(`≥ ${schema.minLength} chars`);
  if (schema.maxLength !== undefined) out.push(`≤ ${schema.maxLength} chars`);
  if (schema.minItems !== undefined) out.push(`≥ ${schema.minItems} items`);
  if (schema.maxItems !== undefined) out.push(`≤ ${schema.maxItems} items`);
  if (schema.default !== undefined) out.push('default ' + JSON.stringify(schema.default));
  return out.join(', ');
}

// The rows of an object schema's field table: {name, type, required, description, limits}, allOf
// parts merged in order (a later part's field replaces an earlier one of the same name), required first.
export function fieldsOf(doc, schema, depth = 0) {
  const s = resolve(doc, schema);
  const byName = new Map();
  if (depth < 8 && Array.isArray(s.allOf)) {
    for (const part of s.allOf) for (const f of fieldsOf(doc, part, depth + 1)) byName.set(f.name, f);
  }
  const required = new Set(Array.isArray(s.required) ? s.required : []);
  for (const [name, prop] of Object.entries(s.properties || {})) {
    byName.set(name, {
      name,
      type: typeLabel(prop),
      required: required.has(name),
      description: prop.description || resolve(doc, prop).description || '',
      limits: constraints(prop),
    });
  }
  for (const name of required) {
    const f = byName.get(name);
    if (f) f.required = true;
  }
  // Required fields first (what a request cannot do without), each group in the document's order.
  const rows = [...byName.values()];
  return [...rows.filter((f) => f.required), ...rows.filter((f) => !f.required)];
}

// Every operation of the document in its order: {id, method, path, summary, description, parameters,
// body: {schemaName, required, fields} | null, responses: [{status, description, schemaName}]}.
export function operations(doc) {
  const ops = [];
  for (const [path, item] of Object.entries(doc.paths || {})) {
    for (const method of METHODS) {
      const op = item[method];
      if (!op) continue;
      const jsonBody = op.requestBody?.content?.['application/json'];
      const body = jsonBody
        ? {
            schemaName: refName(jsonBody.schema?.$ref),
            required: !!op.requestBody.required,
            fields: fieldsOf(doc, jsonBody.schema),
          }
        : null;
      const responses = Object.entries(op.responses || {}).map(([status, r]) => {
        const resolved = resolve(doc, r);
        const content = resolved.content || {};
        const first = Object.values(content)[0];
        return {
          status,
          description: resolved.description || '',
          schemaName: first?.schema ? typeLabel(first.schema) : null,
          contentType: Object.keys(content)[0] || null,
        };
      });
      const parameters = [...(item.parameters || []), ...(op.parameters || [])].map((p) => ({
        name: p.name,
        in: p.in,
        required: !!p.required,
        type: typeLabel(p.schema),
        description: p.description || '',
      }));
      ops.push({
        id: `${method}-${path}`.replace(/[^A-Za-z0-9_-]+/g, '-'),
        method,
        path,
        summary: op.summary || '',
        description: op.description || '',
        parameters,
        body,
        responses,
      });
    }
  }
  return ops;
}

// A GET without parameters can be tried from the page as it is.
export function canTry(op) {
  return op.method === 'get' && op.parameters.length === 0 && !op.path.includes('{') && !op.path.endsWith('/ws') &&
    !op.path.endsWith('/events');
}
