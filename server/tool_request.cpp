#include "server/tool_request.hpp"

#include <boost/json.hpp>

#include "server/api_error.hpp"

namespace tessera::server {

namespace {

namespace json = boost::json;

[[noreturn]] void bad(const std::string& field, const std::string& what) {
  throw api_error(400, "'" + field + "' " + what, field);
}

// OpenAI's rule for function names: what the templates and parsers can carry unescaped.
bool valid_function_name(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
          c == '.'))
      return false;
  }
  return true;
}

json::value parse_json(std::string_view text, const std::string& field) {
  boost::system::error_code ec;
  json::value v = json::parse(text, ec);
  if (ec) bad(field, "is not valid JSON");
  return v;
}

}  // namespace

void parse_tools(std::string_view tools_json, tool_request& out) {
  const json::value v = parse_json(tools_json, "tools");
  if (!v.is_array()) bad("tools", "must be an array of {\"type\": \"function\", \"function\": {...}}");
  const json::array& tools = v.get_array();
  if (std::ssize(tools) > k_max_tools) bad("tools", "holds more than " + std::to_string(k_max_tools) + " tools");
  out.functions.clear();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string at = "tools[" + std::to_string(i) + "]";
    if (!tools[i].is_object()) bad(at, "must be an object");
    const json::object& tool = tools[i].get_object();
    const json::value* type = tool.if_contains("type");
    if (!type || !type->is_string() || type->get_string() != "function") bad(at + ".type", "must be \"function\"");
    const json::value* fn = tool.if_contains("function");
    if (!fn || !fn->is_object()) bad(at + ".function", "is required (an object)");
    const json::object& f = fn->get_object();
    const json::value* name = f.if_contains("name");
    if (!name || !name->is_string() || !valid_function_name(name->get_string())) {
      bad(at + ".function.name", "must be 1..64 characters of a-z, A-Z, 0-9, '_', '-' or '.'");
    }
    tool_function tf;
    tf.name = std::string(name->get_string());
    for (const auto& other : out.functions) {
      if (other.name == tf.name) bad(at + ".function.name", "repeats the function name '" + tf.name + "'");
    }
    if (const json::value* d = f.if_contains("description"); d && !d->is_string() && !d->is_null()) {
      bad(at + ".function.description", "must be a string");
    }
    if (const json::value* p = f.if_contains("parameters"); p && !p->is_null()) {
      if (!p->is_object()) bad(at + ".function.parameters", "must be a JSON Schema object");
      tf.parameters = json::serialize(*p);
    }
    if (const json::value* s = f.if_contains("strict"); s && !s->is_bool() && !s->is_null()) {
      bad(at + ".function.strict", "must be a boolean");
    }
    out.functions.push_back(std::move(tf));
  }
  out.tools_json = json::serialize(v);
}

void parse_tool_choice(std::string_view choice_json, tool_request& out) {
  const json::value v = parse_json(choice_json, "tool_choice");
  if (v.is_string()) {
    const std::string_view s = v.get_string();
    if (s == "none")
      out.choice = tool_choice_mode::none;
    else if (s == "auto")
      out.choice = tool_choice_mode::auto_;
    else if (s == "required")
      out.choice = tool_choice_mode::required;
    else
      bad("tool_choice",
          "must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}");
    return;
  }
  const json::object* o = v.if_object();
  const json::value* type = o ? o->if_contains("type") : nullptr;
  const json::value* fn = o ? o->if_contains("function") : nullptr;
  const json::value* name = fn && fn->is_object() ? fn->get_object().if_contains("name") : nullptr;
  if (!type || !type->is_string() || type->get_string() != "function" || !name || !name->is_string()) {
    bad("tool_choice",
        "must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}");
  }
  out.choice = tool_choice_mode::named;
  out.named_function = std::string(name->get_string());
}

void check_tool_request(const tool_request& t, bool tools_given) {
  if (t.choice == tool_choice_mode::named) {
    if (!tools_given)
      bad("tool_choice", "names the function '" + t.named_function + "' but the request has no 'tools'");
    for (const auto& f : t.functions) {
      if (f.name == t.named_function) return;
    }
    bad("tool_choice", "names the function '" + t.named_function + "', which is not in 'tools'");
  }
  if (t.choice == tool_choice_mode::required && t.functions.empty())
    bad("tool_choice", "is \"required\" but the request has no 'tools'");
}

std::string forced_call_schema(const tool_request& t) {
  auto parameters = [](const tool_function& f) {
    return f.parameters.empty() ? json::value(json::object{{"type", "object"}}) : json::parse(f.parameters);
  };
  if (t.choice == tool_choice_mode::named) {
    for (const auto& f : t.functions) {
      if (f.name == t.named_function) return json::serialize(parameters(f));
    }
  }
  json::array any_of;
  for (const auto& f : t.functions) {
    any_of.push_back(json::object{
        {"type", "object"},
        {"properties",
         json::object{{"name", json::object{{"type", "string"}, {"enum", json::array{json::string(f.name)}}}},
                      {"parameters", parameters(f)}}},
        {"required", json::array{"name", "parameters"}},
        {"additionalProperties", false}});
  }
  json::object schema{{"type", "array"}, {"minItems", 1}, {"items", json::object{{"anyOf", std::move(any_of)}}}};
  if (!t.parallel_tool_calls) schema["maxItems"] = 1;
  return json::serialize(schema);
}

}  // namespace tessera::server
