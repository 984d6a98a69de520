// The request fields that ask for structured output, in each dialect clients speak, parsed into the
// engine's one structured_output_spec (docs/structured_output.md):
//
//   OpenAI        response_format: {"type": "text" | "json_object" | "json_schema", "json_schema":
//                 {"name", "schema", "strict"}} (and vLLM's {"type": "structural_tag", ...})
//   vLLM          structured_outputs: {"json" | "regex" | "choice" | "grammar" | "json_object" |
//                 "structural_tag": ...}; the older guided_json, guided_regex, guided_choice,
//                 guided_grammar (guided_decoding_backend is accepted and ignored)
//   llama-server  json_schema (a schema), grammar (GBNF)
//
// At most one constraint per request; {"type": "text"} and null mean none. Only the shape is checked
// here: schemas, regexes and grammars are compiled (and their errors reported as 400s naming the
// field) by the grammar engine, off the I/O threads.
#pragma once
#include <simdjson.h>

#include <optional>
#include <string>
#include <string_view>

#include "engine/structured_output.hpp"

namespace tessera::server {

struct structured_output_fields {
  std::optional<structured_output_spec> spec;
  std::string field;  // the field spec came from
};

bool is_structured_output_field(std::string_view key);

// Parses one of the fields is_structured_output_field() names into `out`; throws api_error (400)
// naming the field for a bad shape, an unsupported value, or a second constraint.
void parse_structured_output_field(std::string_view key, simdjson::dom::element value, structured_output_fields& out);

}  // namespace tessera::server
