// Checks a JSON Schema before it is compiled: well-formed JSON, an object (or true), nesting within a
// bound, and in strict mode only the keywords of the supported subset (OpenAI's structured outputs
// subset plus the string, number, array and object bounds xgrammar enforces). The grammar engine
// silently ignores keywords it does not implement; strict mode turns that into an error naming the
// keyword and where it is, so a client never gets output that only seems to follow its schema.
#pragma once
#include <cstdint>
#include <string_view>

namespace tessera::structured {

struct schema_check_options {
  bool strict = false;
  int32_t max_depth = 32;  // nested subschemas (properties, items, anyOf, $defs, ...)
};

// Throws invalid_request("the JSON schema ...") naming the problem and its JSON pointer.
void check_json_schema(std::string_view schema, const schema_check_options& options);

}  // namespace tessera::structured
