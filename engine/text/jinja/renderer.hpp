// The renderer: runs a syntax tree against a context, under the limits of one render. It holds the
// scopes (one per loop iteration and block set, as in Jinja) and the output; everything it calls
// (values, filters, methods, globals) works on values and charges the same budget.
#pragma once
#include <cstdint>
#include <string>

#include "engine/text/jinja/ast.hpp"

namespace tessera::jinja::detail {

// Throws chat_template_error (render, raised or limit).
std::string render(const template_node& root, const context& variables, const limits& bounds, int64_t now_unix_seconds);

}  // namespace tessera::jinja::detail
