#include "server/structured_output_request.hpp"

#include <string>
#include <utility>
#include <vector>

#include "server/api_error.hpp"

namespace tessera::server {
namespace {

namespace sj = simdjson;
using element = sj::dom::element;
using kind = structured_output_spec::kind;

[[noreturn]] void bad(std::string_view field, std::string_view what) {
  throw api_error(400, "'" + std::string(field) + "' " + std::string(what), std::string(field));
}

std::string get_text(element v, std::string_view field) {
  if (!v.is_string()) bad(field, "must be a string");
  std::string s{std::string_view(v)};
  if (s.empty()) bad(field, "must not be empty");
  return s;
}

// A schema given as a JSON object (or boolean), or as a string holding one (guided_json's old form).
// Its text is kept as sent (minified): property order decides the order in which they are generated.
std::string get_schema(element v, std::string_view field) {
  if (v.is_string()) return get_text(v, field);
  if (!v.is_object() && !v.is_bool()) bad(field, "must be a JSON schema (an object)");
  return sj::minify(v);
}

std::vector<std::string> get_choices(element v, std::string_view field) {
  if (!v.is_array()) bad(field, "must be an array of strings");
  std::vector<std::string> out;
  for (element c : sj::dom::array(v)) {
    if (!c.is_string()) bad(field, "must be an array of strings");
    out.emplace_back(std::string_view(c));
  }
  if (out.empty()) bad(field, "must not be empty");
  return out;
}

void set(structured_output_fields& out, std::string_view field, structured_output_spec spec) {
  if (out.spec) {
    bad(field, "cannot be combined with '" + out.field + "': give one structured output constraint per request");
  }
  spec.field = std::string(field);
  out.field = spec.field;
  out.spec = std::move(spec);
}

structured_output_spec make(kind k, std::string source = {}) {
  structured_output_spec s;
  s.type = k;
  s.source = std::move(source);
  return s;
}

void parse_response_format(element v, structured_output_fields& out) {
  constexpr std::string_view field = "response_format";
  if (!v.is_object()) bad(field, "must be an object with a 'type'");
  element type;
  if (v["type"].get(type) || !type.is_string()) bad(field, "must have a 'type': text, json_object or json_schema");
  const std::string_view t(type);
  if (t == "text") {
    for (auto [key, value] : sj::dom::object(v)) {
      if (key != "type") bad("response_format." + std::string(key), "is not a field of the text format");
    }
    return;
  }
  if (t == "json_object") {
    for (auto [key, value] : sj::dom::object(v)) {
      if (key != "type") bad("response_format." + std::string(key), "is not a field of the json_object format");
    }
    return set(out, field, make(kind::json_object));
  }
  if (t == "structural_tag") {
    // xgrammar's structural tag format, passed on whole: {"type": "structural_tag", "format": {...}}
    // (or the older {"structures": [...], "triggers": [...]}).
    return set(out, field, make(kind::structural_tag, sj::minify(v)));
  }
  if (t != "json_schema") bad("response_format.type", "must be text, json_object, json_schema or structural_tag");
  structured_output_spec spec = make(kind::json_schema);
  bool have_schema = false;
  for (auto [key, value] : sj::dom::object(v)) {
    if (key == "type") continue;
    if (key != "json_schema") bad("response_format." + std::string(key), "is not a field of the json_schema format");
    if (!value.is_object()) bad("response_format.json_schema", "must be an object with 'name' and 'schema'");
    for (auto [k, x] : sj::dom::object(value)) {
      const std::string name = "response_format.json_schema." + std::string(k);
      if (k == "schema") {
        spec.source = get_schema(x, name);
        have_schema = true;
      } else if (k == "strict") {
        if (!x.is_null() && !x.is_bool()) bad(name, "must be a boolean");
        spec.strict = x.is_bool() && bool(x);
      } else if (k == "name" || k == "description") {
        if (!x.is_string()) bad(name, "must be a string");
      } else {
        bad(name, "is not a field of json_schema (name, description, schema, strict)");
      }
    }
  }
  if (!have_schema) bad("response_format.json_schema.schema", "is required");
  set(out, field, std::move(spec));
}

// vLLM's StructuredOutputsParams (formerly GuidedDecodingParams).
void parse_structured_outputs(element v, structured_output_fields& out) {
  constexpr std::string_view field = "structured_outputs";
  if (!v.is_object()) bad(field, "must be an object (json, regex, choice, grammar, json_object or structural_tag)");
  std::optional<structured_output_spec> spec;
  const auto one = [&](std::string_view key, structured_output_spec s) {
    if (spec) bad(field, "must hold exactly one of json, regex, choice, grammar, json_object, structural_tag");
    spec = std::move(s);
    (void)key;
  };
  for (auto [key, value] : sj::dom::object(v)) {
    const std::string name = "structured_outputs." + std::string(key);
    if (value.is_null()) continue;
    if (key == "json") {
      one(key, make(kind::json_schema, get_schema(value, name)));
    } else if (key == "regex") {
      one(key, make(kind::regex, get_text(value, name)));
    } else if (key == "choice") {
      structured_output_spec s = make(kind::choice);
      s.choices = get_choices(value, name);
      one(key, std::move(s));
    } else if (key == "grammar") {
      one(key, make(kind::grammar, get_text(value, name)));
    } else if (key == "json_object") {
      if (!value.is_bool()) bad(name, "must be a boolean");
      if (bool(value)) one(key, make(kind::json_object));
    } else if (key == "structural_tag") {
      one(key, make(kind::structural_tag, value.is_string() ? get_text(value, name) : sj::minify(value)));
    } else if (key == "disable_any_whitespace" || key == "disable_fallback" || key == "disable_additional_properties") {
      if (!value.is_bool()) bad(name, "must be a boolean");
    } else if (key == "backend") {
      if (!value.is_string()) bad(name, "must be a string");  // one engine here: xgrammar
    } else if (key == "whitespace_pattern") {
      bad(name, "is not supported (whitespace is compact: ', ' and ': ')");
    } else {
      bad(name, "is not a field of structured_outputs");
    }
  }
  if (!spec) bad(field, "must hold one of json, regex, choice, grammar, json_object, structural_tag");
  set(out, field, std::move(*spec));
}

}  // namespace

bool is_structured_output_field(std::string_view key) {
  return key == "response_format" || key == "structured_outputs" || key == "guided_json" || key == "guided_regex" ||
         key == "guided_choice" || key == "guided_grammar" || key == "guided_decoding_backend" ||
         key == "guided_whitespace_pattern" || key == "json_schema" || key == "grammar";
}

void parse_structured_output_field(std::string_view key, element value, structured_output_fields& out) {
  if (key == "response_format") return parse_response_format(value, out);
  if (key == "structured_outputs") return parse_structured_outputs(value, out);
  if (key == "guided_json" || key == "json_schema")
    return set(out, key, make(kind::json_schema, get_schema(value, key)));
  if (key == "guided_regex") return set(out, key, make(kind::regex, get_text(value, key)));
  if (key == "guided_grammar" || key == "grammar") return set(out, key, make(kind::grammar, get_text(value, key)));
  if (key == "guided_choice") {
    structured_output_spec s = make(kind::choice);
    s.choices = get_choices(value, key);
    return set(out, key, std::move(s));
  }
  if (key == "guided_decoding_backend") {
    if (!value.is_string()) bad(key, "must be a string");
    return;  // one grammar engine here (xgrammar), whatever is asked for
  }
  if (key == "guided_whitespace_pattern") bad(key, "is not supported (whitespace is compact: ', ' and ': ')");
  bad(key, "is not a structured output field");
}

}  // namespace tessera::server
