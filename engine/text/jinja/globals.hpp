// The global functions every template sees (raise_exception, namespace, range, dict, strftime_now),
// and calls of function values, which also covers loop.cycle and methods taken as values.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/text/jinja/call_args.hpp"
#include "engine/text/jinja/render_budget.hpp"

namespace tessera::jinja::detail {

// The globals as variables, in the outermost scope of a render (the template's variables may shadow them).
std::vector<std::pair<std::string, value>> global_variables();

// fn(args). `self` is the object fn was read from (the `loop` of loop.cycle), or undefined;
// `now_unix_seconds` is the clock of strftime_now.
value call_function(render_budget& budget, const value& fn, const call_args& args, const value& self,
                    int64_t now_unix_seconds);

}  // namespace tessera::jinja::detail
