// Filters (`x|trim`) and tests (`x is defined`): the names this interpreter knows and what they do.
#pragma once
#include <string>

#include "engine/text/jinja/call_args.hpp"
#include "engine/text/jinja/render_budget.hpp"

namespace tessera::jinja::detail {

// Filters and tests are resolved when the template is compiled, as Jinja does: an unknown name is a
// syntax error, a standard Jinja one that this interpreter lacks is "unsupported".
bool is_known_filter(const std::string& name);
bool is_standard_jinja_filter(const std::string& name);
bool is_known_test(const std::string& name);
bool is_standard_jinja_test(const std::string& name);

value apply_filter(render_budget& budget, const std::string& name, const value& v, const call_args& args);
bool apply_test(render_budget& budget, const std::string& name, const value& v, const call_args& args);

}  // namespace tessera::jinja::detail
