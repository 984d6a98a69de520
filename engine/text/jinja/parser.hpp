// The parser: tokens -> syntax tree, with Jinja's compile-time checks (filter and test names,
// break/continue outside a loop, the constructs this interpreter refuses).
#pragma once
#include <vector>

#include "engine/text/jinja/ast.hpp"
#include "engine/text/jinja/lexer.hpp"

namespace tessera::jinja::detail {

// Throws chat_template_error (syntax or unsupported) naming the line.
node_ptr parse_template(std::vector<token> tokens);

}  // namespace tessera::jinja::detail
