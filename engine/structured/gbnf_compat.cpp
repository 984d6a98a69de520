#include "engine/structured/gbnf_compat.hpp"

#include <cctype>

namespace tessera::structured {
namespace {

bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; }

// The end of a quoted string or character class starting at `i` (its opening `close`-less
// delimiter), honouring backslash escapes; text.size() when unterminated.
size_t skip_delimited(std::string_view text, size_t i, char close) {
  for (++i; i < text.size(); ++i) {
    if (text[i] == '\\') {
      ++i;
    } else if (text[i] == close) {
      return i + 1;
    }
  }
  return text.size();
}

// True when a rule definition (`name ::=`) starts at `i`.
bool rule_starts_at(std::string_view text, size_t i) {
  size_t j = i;
  while (j < text.size() && is_name_char(text[j])) ++j;
  if (j == i) return false;
  while (j < text.size() && std::isspace(static_cast<unsigned char>(text[j]))) ++j;
  return text.substr(j, 3) == "::=";
}

}  // namespace

std::string fill_empty_alternatives(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 16);
  bool expect_element = false;  // just after `::=`, `|` or `(`: an alternative begins here
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (std::isspace(static_cast<unsigned char>(c))) {
      out += c;
      ++i;
      continue;
    }
    if (c == '#') {  // a comment, to the end of its line
      const size_t end = text.find('\n', i);
      const size_t stop = end == std::string_view::npos ? text.size() : end;
      out.append(text.substr(i, stop - i));
      i = stop;
      continue;
    }
    if (expect_element && (c == '|' || c == ')' || rule_starts_at(text, i))) out += "\"\" ";
    if (text.substr(i, 3) == "::=") {
      out += "::=";
      i += 3;
      expect_element = true;
      continue;
    }
    if (c == '|' || c == '(') {
      out += c;
      ++i;
      expect_element = true;
      continue;
    }
    expect_element = false;
    size_t next = i + 1;
    if (c == '"') {
      next = skip_delimited(text, i, '"');
    } else if (c == '[') {
      next = skip_delimited(text, i, ']');
    } else if (is_name_char(c)) {
      while (next < text.size() && is_name_char(text[next])) ++next;
    }
    out.append(text.substr(i, next - i));
    i = next;
  }
  if (expect_element) out += "\"\"";
  return out;
}

}  // namespace tessera::structured
