#include "engine/structured/schema_check.hpp"

#include <simdjson.h>

#include <string>
#include <unordered_set>

#include "engine/base/error.hpp"

namespace tessera::structured {
namespace {

namespace sj = simdjson;
using element = sj::dom::element;

[[noreturn]] void fail(const std::string& pointer, const std::string& what) {
  throw invalid_request("the JSON schema " + what + (pointer.empty() ? std::string() : " (at " + pointer + ")"));
}

// JSON Pointer escaping (RFC 6901).
std::string escape(std::string_view key) {
  std::string out;
  for (char c : key) {
    if (c == '~')
      out += "~0";
    else if (c == '/')
      out += "~1";
    else
      out += c;
  }
  return out;
}

// Keywords that hold data, or annotate: accepted anywhere, never descended into.
const std::unordered_set<std::string_view>& annotation_keywords() {
  static const std::unordered_set<std::string_view> k = {"title",      "description", "default",   "examples",
                                                         "deprecated", "readOnly",    "writeOnly", "$comment",
                                                         "$schema",    "$id",         "enum",      "const"};
  return k;
}

// Keywords whose value is one subschema.
const std::unordered_set<std::string_view>& schema_keywords() {
  static const std::unordered_set<std::string_view> k = {"items", "additionalProperties", "propertyNames",
                                                         "unevaluatedProperties", "unevaluatedItems"};
  return k;
}

// Keywords whose value is a map from names to subschemas.
const std::unordered_set<std::string_view>& schema_map_keywords() {
  static const std::unordered_set<std::string_view> k = {"properties", "$defs", "definitions", "patternProperties"};
  return k;
}

// Keywords whose value is an array of subschemas.
const std::unordered_set<std::string_view>& schema_list_keywords() {
  static const std::unordered_set<std::string_view> k = {"anyOf", "oneOf", "allOf", "prefixItems"};
  return k;
}

// Keywords with plain values that the grammar enforces.
const std::unordered_set<std::string_view>& value_keywords() {
  static const std::unordered_set<std::string_view> k = {
      "type",      "required", "$ref",          "pattern",          "format",           "minLength",
      "maxLength", "minimum",  "maximum",       "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
      "minItems",  "maxItems", "minProperties", "maxProperties"};
  return k;
}

// The string formats the grammar engine generates (xgrammar's built-in regexes); others are ignored.
const std::unordered_set<std::string_view>& known_formats() {
  static const std::unordered_set<std::string_view> k = {"date",
                                                         "date-time",
                                                         "time",
                                                         "duration",
                                                         "email",
                                                         "hostname",
                                                         "ipv4",
                                                         "ipv6",
                                                         "uri",
                                                         "uuid",
                                                         "json-pointer",
                                                         "uri-reference",
                                                         "relative-json-pointer",
                                                         "uri-template"};
  return k;
}

const std::unordered_set<std::string_view>& known_types() {
  static const std::unordered_set<std::string_view> k = {"string", "number", "integer", "boolean",
                                                         "object", "array",  "null"};
  return k;
}

class checker {
 public:
  explicit checker(const schema_check_options& o) : o_(o) {}

  void schema(element v, const std::string& pointer, int32_t depth) {
    if (v.is_bool()) return;  // true / false schemas
    if (!v.is_object()) fail(pointer, "must be an object or a boolean");
    if (depth > o_.max_depth) fail(pointer, "nests more than " + std::to_string(o_.max_depth) + " subschemas deep");
    const sj::dom::object obj(v);
    // Combinations the grammar engine accepts but would not enforce. allOf of several subschemas it
    // compiles as "any JSON value": refused in every mode, as output that ignores the whole schema is
    // never what a client asked for. A pattern or format takes over a string's grammar, dropping
    // minLength / maxLength: refused in strict mode, ignored (like other unenforced keywords) otherwise.
    element all_of;
    if (!obj["allOf"].get(all_of) && all_of.is_array() && sj::dom::array(all_of).size() > 1) {
      fail(pointer + "/allOf",
           "combines several subschemas with 'allOf', which the grammar engine does not enforce "
           "(merge them into one schema)");
    }
    if (o_.strict) {
      element unused;
      const bool shaped = !obj["pattern"].get(unused) || !obj["format"].get(unused);
      const bool bounded = !obj["minLength"].get(unused) || !obj["maxLength"].get(unused);
      if (shaped && bounded) {
        fail(pointer,
             "combines 'pattern' or 'format' with 'minLength' / 'maxLength', which strict mode does not "
             "support (the length bounds would not be enforced; put them in the pattern)");
      }
      element format;
      if (!obj["format"].get(format) && format.is_string() && !known_formats().count(std::string_view(format))) {
        fail(pointer + "/format", "uses the format '" + std::string(std::string_view(format)) +
                                      "', which strict mode does not support (supported: date, date-time, time, "
                                      "duration, email, hostname, ipv4, ipv6, uri, uri-reference, uri-template, "
                                      "uuid, json-pointer, relative-json-pointer)");
      }
    }
    for (auto [key_view, value] : obj) {
      const std::string key(key_view);
      const std::string at = pointer + "/" + escape(key);
      if (annotation_keywords().count(key)) continue;
      if (schema_keywords().count(key)) {
        schema(value, at, depth + 1);
      } else if (schema_map_keywords().count(key)) {
        if (!value.is_object()) fail(at, "'" + key + "' must be an object of subschemas");
        for (auto [name, sub] : sj::dom::object(value)) schema(sub, at + "/" + escape(name), depth + 1);
      } else if (schema_list_keywords().count(key)) {
        if (!value.is_array()) fail(at, "'" + key + "' must be an array of subschemas");
        size_t i = 0;
        for (element sub : sj::dom::array(value)) schema(sub, at + "/" + std::to_string(i++), depth + 1);
      } else if (value_keywords().count(key)) {
        check_value(key, value, at);
      } else if (o_.strict) {
        fail(at, "uses the keyword '" + key + "', which strict mode does not support");
      }
    }
  }

 private:
  void check_value(const std::string& key, element value, const std::string& at) {
    if (key == "type") {
      const auto check_type = [&](element t) {
        if (!t.is_string() || !known_types().count(std::string_view(t))) {
          fail(at, "has an unknown 'type' (string, number, integer, boolean, object, array or null)");
        }
      };
      if (value.is_array()) {
        for (element t : sj::dom::array(value)) check_type(t);
      } else {
        check_type(value);
      }
    } else if (key == "required") {
      if (!value.is_array()) fail(at, "'required' must be an array of property names");
      for (element name : sj::dom::array(value)) {
        if (!name.is_string()) fail(at, "'required' must be an array of property names");
      }
    } else if (key == "$ref" || key == "pattern" || key == "format") {
      if (!value.is_string()) fail(at, "'" + key + "' must be a string");
    } else if (!value.is_number()) {
      fail(at, "'" + key + "' must be a number");
    }
  }

  schema_check_options o_;
};

}  // namespace

void check_json_schema(std::string_view text, const schema_check_options& options) {
  sj::dom::parser parser;
  const sj::padded_string padded(text);
  element doc;
  if (auto err = parser.parse(padded).get(doc)) fail("", std::string("is not valid JSON: ") + sj::error_message(err));
  checker(options).schema(doc, "", 0);
}

}  // namespace tessera::structured
