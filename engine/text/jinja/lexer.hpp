// The lexer: template source -> tokens. Whitespace control (-, +, trim_blocks, lstrip_blocks) is
// applied here, so the parser sees text exactly as it will be printed.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::jinja::detail {

enum class tok { text, var_begin, var_end, block_begin, block_end, name, string, integer, floating, op, eof };

struct token {
  tok type = tok::eof;
  std::string text;  // text, name, string value, operator
  int64_t i = 0;
  double f = 0.0;
  int line = 1;
};

// Throws chat_template_error (syntax) naming the line. The last token is always tok::eof.
std::vector<token> tokenize(std::string_view source);

}  // namespace tessera::jinja::detail
