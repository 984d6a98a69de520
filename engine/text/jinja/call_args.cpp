#include "engine/text/jinja/call_args.hpp"

#include <algorithm>

#include "engine/text/jinja/errors.hpp"
#include "engine/text/jinja/python_str.hpp"
#include "engine/text/jinja/values.hpp"

namespace tessera::jinja::detail {

void check_signature(const std::string& what, const call_args& args, const std::vector<std::string>& params,
                     bool keywords_allowed) {
  if (args.positional.size() > params.size())
    fail_render(what + "() takes at most " + std::to_string(params.size()) + " argument(s), " +
                std::to_string(args.positional.size()) + " given");
  for (const auto& [k, unused] : args.keyword) {
    const auto it = std::find(params.begin(), params.end(), k);
    if (!keywords_allowed || it == params.end())
      fail_render(what + "() got an unexpected keyword argument '" + k + "'");
    if (static_cast<size_t>(it - params.begin()) < args.positional.size())
      fail_render(what + "() got multiple values for argument '" + k + "'");
  }
}

const value& need(const value* v, const char* what) {
  if (!v) fail_render(std::string(what) + " argument is missing");
  return *v;
}

const std::string& need_string(const value* v, const char* what) {
  if (!v || v->kind != value_kind::string) fail_render(std::string(what) + " must be a string");
  return v->str();
}

int64_t int_arg(const value* v, int64_t fallback) {
  if (!v || v->kind == value_kind::none) return fallback;
  if (!is_integral(*v)) fail_render("expected an integer argument");
  return as_int(*v);
}

bool flag_arg(const call_args& args, size_t index, std::string_view name) {
  const value* v = args.get(index, name);
  return v && truthy(*v);
}

std::optional<std::u32string> strip_chars_arg(const value* chars) {
  if (!chars || chars->kind == value_kind::none) return std::nullopt;
  if (chars->kind != value_kind::string) fail_render("strip arg must be None or str");
  return decode_utf8(chars->str());
}

}  // namespace tessera::jinja::detail
