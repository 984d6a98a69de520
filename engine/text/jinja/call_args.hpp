// The arguments of a call to a filter, test, method or global function, and the checks Python
// makes of them. Jinja's filters are Python functions, so a wrong call fails as it would there.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/text/jinja/jinja_template.hpp"

namespace tessera::jinja::detail {

struct call_args {
  std::vector<value> positional;
  std::vector<std::pair<std::string, value>> keyword;

  // The argument at `index` (after the subject) or named `name`, or null.
  const value* get(size_t index, std::string_view name) const {
    if (index < positional.size()) return &positional[index];
    for (const auto& [k, v] : keyword)
      if (k == name) return &v;
    return nullptr;
  }
};

// Python's argument checks: too many positional arguments, unknown or repeated keywords.
void check_signature(const std::string& what, const call_args& args, const std::vector<std::string>& params,
                     bool keywords_allowed);

// Readers of one argument (null when it was not passed); each fails with a render error naming `what`.
const value& need(const value* v, const char* what);                        // must be present
const std::string& need_string(const value* v, const char* what);           // must be a string
int64_t int_arg(const value* v, int64_t fallback);                          // an int, or none/absent for `fallback`
bool flag_arg(const call_args& args, size_t index, std::string_view name);  // present and truthy
// The `chars` argument of strip(): the code points to strip, or nullopt (absent or none) for whitespace.
std::optional<std::u32string> strip_chars_arg(const value* chars);

}  // namespace tessera::jinja::detail
