// Jinja2 subset interpreter for chat templates: lexer -> parser -> evaluator. See jinja_template.hpp.
#include "engine/text/jinja/jinja_template.hpp"
#include "engine/base/utf8.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <ctime>
#include <limits>
#include <map>

namespace tessera::jinja {

namespace {

[[noreturn]] void fail(chat_template_error_kind kind, const std::string& message) {
  throw chat_template_error(kind, message);
}
[[noreturn]] void fail_render(const std::string& message) {
  fail(chat_template_error_kind::render, "chat template render error: " + message);
}

// ---- UTF-8 ---------------------------------------------------------------------------------------
// Python strings are sequences of code points; lengths, indices and slices count code points.
// Bytes that are not valid UTF-8 decode to U+DC80..U+DCFF (Python's "surrogateescape") and encode
// back to the same byte, so no input is ever altered or rejected.

std::u32string decode_utf8(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int len = 0;
    char32_t cp = 0;
    if (c < 0x80) { out.push_back(c); ++i; continue; }
    if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; }
    bool ok = len > 0 && i + static_cast<size_t>(len) <= s.size();
    for (int k = 1; ok && k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
      if ((cc & 0xC0) != 0x80) ok = false;
      else cp = (cp << 6) | (cc & 0x3F);
    }
    if (ok) {
      const bool overlong = (len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000);
      if (overlong || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) ok = false;
    }
    if (!ok) { out.push_back(0xDC00 + c); ++i; continue; }
    out.push_back(cp);
    i += static_cast<size_t>(len);
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp >= 0xDC80 && cp <= 0xDCFF) { out.push_back(static_cast<char>(cp - 0xDC00)); return; }
  tessera::append_utf8(static_cast<uint32_t>(cp), out);
}

std::string encode_utf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

bool is_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

size_t count_code_points(std::string_view s) { return is_ascii(s) ? s.size() : decode_utf8(s).size(); }

// Python's str.isspace() set.
bool is_py_space(char32_t c) {
  return (c >= 9 && c <= 13) || (c >= 28 && c <= 32) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// Case mapping covers ASCII, Latin-1, Greek and Cyrillic (full Unicode tables are out of scope).
char32_t to_upper_cp(char32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 32;
  if (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) return c - 32;
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  return c;
}
char32_t to_lower_cp(char32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if ((c >= 0xC0 && c <= 0xDE && c != 0xD7)) return c + 32;
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  return c;
}
bool is_cased(char32_t c) { return to_upper_cp(c) != c || to_lower_cp(c) != c; }

// ---- number formatting ---------------------------------------------------------------------------

// Python's repr(float): shortest round-trip digits, fixed notation for 1e-4 <= |x| < 1e16.
std::string python_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const size_t epos = sci.find('e');
  std::string mant = sci.substr(0, epos);
  const int exp10 = std::stoi(sci.substr(epos + 1));
  bool neg = false;
  if (!mant.empty() && mant[0] == '-') { neg = true; mant.erase(0, 1); }
  std::string digits;
  for (char c : mant) if (c != '.') digits.push_back(c);
  std::string out = neg ? "-" : "";
  if (exp10 >= -4 && exp10 < 16) {
    const int point = exp10 + 1;  // digits before the decimal point
    if (point <= 0) {
      out += "0." + std::string(static_cast<size_t>(-point), '0') + digits;
    } else if (static_cast<size_t>(point) >= digits.size()) {
      out += digits + std::string(static_cast<size_t>(point) - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(point)) + "." + digits.substr(static_cast<size_t>(point));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char ebuf[16];
  std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
  return out + ebuf;
}

// ---- lexer ---------------------------------------------------------------------------------------

enum class tok { text, var_begin, var_end, block_begin, block_end, name, string, integer, floating, op, eof };

struct token {
  tok type = tok::eof;
  std::string text;  // text, name, string value, operator
  int64_t i = 0;
  double f = 0.0;
  int line = 1;
};

[[noreturn]] void syntax_error(int line, const std::string& message) {
  fail(chat_template_error_kind::syntax, "chat template syntax error (line " + std::to_string(line) + "): " + message);
}

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

class lexer {
 public:
  explicit lexer(std::string_view source) {
    // Jinja normalises \r\n and \r to \n and drops one trailing newline (keep_trailing_newline=False).
    src_.reserve(source.size());
    for (size_t k = 0; k < source.size(); ++k) {
      if (source[k] == '\r') {
        src_.push_back('\n');
        if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
      } else {
        src_.push_back(source[k]);
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<token> run() {
    while (pos_ < src_.size()) {
      size_t start = find_tag(pos_);
      if (start == std::string::npos) {
        emit_text(src_.substr(pos_));
        pos_ = src_.size();
        break;
      }
      std::string text = src_.substr(pos_, start - pos_);
      const char kind = src_[start + 1];
      const char modifier = start + 2 < src_.size() ? src_[start + 2] : '\0';
      if (modifier == '-') {
        while (!text.empty() && is_ws(text.back())) text.pop_back();
      } else if (modifier != '+' && (kind == '%' || kind == '#')) {
        // lstrip_blocks: drop spaces/tabs between the line start and a block or comment tag.
        const size_t line_start = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        const bool line_starting = pos_ == 0 || src_[pos_ - 1] == '\n';
        if (line_start > 0 || line_starting) {
          const bool only_ws = line_start < text.size() &&
                               std::all_of(text.begin() + static_cast<std::ptrdiff_t>(line_start), text.end(),
                                           [](char c) { return is_ws(c); });
          if (only_ws) text.resize(line_start);
        }
      }
      emit_text(std::move(text));
      count_lines(pos_, start);
      pos_ = start + 2 + ((modifier == '-' || modifier == '+') ? 1 : 0);
      if (kind == '#') {
        lex_comment();
      } else {
        lex_tag(kind == '{');
      }
    }
    token eof;
    eof.type = tok::eof;
    eof.line = line_;
    tokens_.push_back(eof);
    return std::move(tokens_);
  }

 private:
  size_t find_tag(size_t from) const {
    for (size_t k = src_.find('{', from); k != std::string::npos; k = src_.find('{', k + 1)) {
      if (k + 1 < src_.size() && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#')) return k;
    }
    return std::string::npos;
  }
  void count_lines(size_t from, size_t to) {
    line_ += static_cast<int>(std::count(src_.begin() + static_cast<std::ptrdiff_t>(from),
                                         src_.begin() + static_cast<std::ptrdiff_t>(to), '\n'));
  }
  void emit_text(std::string text) {
    if (text.empty()) return;
    token t;
    t.type = tok::text;
    t.text = std::move(text);
    t.line = line_;
    tokens_.push_back(std::move(t));
  }
  void push(tok type, std::string text) {
    token t;
    t.type = type;
    t.text = std::move(text);
    t.line = line_;
    tokens_.push_back(std::move(t));
  }
  // After a closing tag: "-" strips all following whitespace; a plain block/comment end eats one
  // newline (trim_blocks); "+" keeps everything.
  void after_close(char modifier, bool is_block_or_comment) {
    if (modifier == '-') {
      size_t k = pos_;
      while (k < src_.size() && is_ws(src_[k])) ++k;
      count_lines(pos_, k);
      pos_ = k;
    } else if (modifier != '+' && is_block_or_comment && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
      ++line_;
    }
  }
  void lex_comment() {
    const size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) syntax_error(line_, "missing end of comment tag");
    const char modifier = end > pos_ ? src_[end - 1] : '\0';
    count_lines(pos_, end);
    pos_ = end + 2;
    after_close(modifier == '-' || modifier == '+' ? modifier : '\0', true);
  }
  void lex_tag(bool is_variable) {
    push(is_variable ? tok::var_begin : tok::block_begin, "");
    const std::string close = is_variable ? "}}" : "%}";
    std::vector<char> brackets;
    while (true) {
      while (pos_ < src_.size() && is_ws(src_[pos_])) {
        if (src_[pos_] == '\n') ++line_;
        ++pos_;
      }
      if (pos_ >= src_.size()) syntax_error(line_, std::string("unexpected end of template, expected '") + close + "'");
      if (brackets.empty()) {
        for (char modifier : {'-', '+', '\0'}) {
          if (modifier == '+' && is_variable) continue;
          const std::string marker = (modifier ? std::string(1, modifier) : std::string()) + close;
          if (src_.compare(pos_, marker.size(), marker) == 0) {
            pos_ += marker.size();
            push(is_variable ? tok::var_end : tok::block_end, "");
            after_close(modifier, !is_variable);
            return;
          }
        }
      }
      const char c = src_[pos_];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t k = pos_;
        while (k < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[k])) || src_[k] == '_')) ++k;
        push(tok::name, src_.substr(pos_, k - pos_));
        pos_ = k;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        lex_number();
      } else if (c == '\'' || c == '"') {
        lex_string(c);
      } else {
        static const char* const ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "/", "*", "%", "~", "[", "]",
                                          "(", ")", "{", "}", "<", ">", "=", ".", ":", "|", ",", ";"};
        std::string op;
        for (const char* o : ops) {
          if (src_.compare(pos_, std::strlen(o), o) == 0) { op = o; break; }
        }
        if (op.empty()) syntax_error(line_, std::string("unexpected character '") + c + "'");
        if (op == "(" || op == "[" || op == "{") brackets.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
        if (op == ")" || op == "]" || op == "}") {
          if (brackets.empty() || brackets.back() != op[0]) syntax_error(line_, "unexpected '" + op + "'");
          brackets.pop_back();
        }
        push(tok::op, op);
        pos_ += op.size();
      }
    }
  }
  void lex_number() {
    size_t k = pos_;
    auto digits = [&] {
      while (k < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[k])) ||
                                 (src_[k] == '_' && k + 1 < src_.size() && std::isdigit(static_cast<unsigned char>(src_[k + 1])))))
        ++k;
    };
    digits();
    bool is_float = false;
    if (k + 1 < src_.size() && src_[k] == '.' && std::isdigit(static_cast<unsigned char>(src_[k + 1]))) {
      is_float = true;
      ++k;
      digits();
    }
    if (k < src_.size() && (src_[k] == 'e' || src_[k] == 'E')) {
      size_t e = k + 1;
      if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
      if (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) {
        is_float = true;
        k = e;
        digits();
      }
    }
    if (!is_float) k = integer_end();
    std::string lit;
    for (size_t m = pos_; m < k; ++m) if (src_[m] != '_') lit.push_back(src_[m]);
    token t;
    t.line = line_;
    t.text = lit;
    if (is_float) {
      t.type = tok::floating;
      t.f = std::strtod(lit.c_str(), nullptr);
    } else {
      t.type = tok::integer;
      int base = 10;
      std::string_view digits_only = lit;
      if (lit.size() > 2 && lit[0] == '0' && std::isalpha(static_cast<unsigned char>(lit[1]))) {
        const char p = static_cast<char>(std::tolower(static_cast<unsigned char>(lit[1])));
        base = p == 'x' ? 16 : p == 'o' ? 8 : 2;
        digits_only.remove_prefix(2);
      }
      auto r = std::from_chars(digits_only.data(), digits_only.data() + digits_only.size(), t.i, base);
      if (r.ec != std::errc()) syntax_error(line_, "integer literal out of range: " + lit);
    }
    tokens_.push_back(std::move(t));
    pos_ = k;
  }
  // End of an integer literal at pos_, per Jinja's integer_re: 0b/0o/0x with digits (underscores
  // between them allowed), [1-9](_?\d)*, or 0(_?0)* (no leading zeros: "01" is two tokens).
  size_t integer_end() const {
    auto digit_in = [](char c, int base) {
      if (base == 16) return std::isxdigit(static_cast<unsigned char>(c)) != 0;
      return c >= '0' && c < static_cast<char>('0' + base);
    };
    auto run = [&](size_t k, int base) {  // (_?digit)*
      while (true) {
        if (k < src_.size() && digit_in(src_[k], base)) { ++k; continue; }
        if (k + 1 < src_.size() && src_[k] == '_' && digit_in(src_[k + 1], base)) { k += 2; continue; }
        return k;
      }
    };
    if (src_[pos_] == '0' && pos_ + 1 < src_.size()) {
      const char p = static_cast<char>(std::tolower(static_cast<unsigned char>(src_[pos_ + 1])));
      const int base = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
      if (base != 0) {
        const size_t end = run(pos_ + 2, base);
        if (end > pos_ + 2) return end;  // at least one digit after the prefix
      }
    }
    if (src_[pos_] != '0') return run(pos_ + 1, 10);
    size_t k = pos_ + 1;  // 0(_?0)*
    while (true) {
      if (k < src_.size() && src_[k] == '0') { ++k; continue; }
      if (k + 1 < src_.size() && src_[k] == '_' && src_[k + 1] == '0') { k += 2; continue; }
      return k;
    }
  }
  static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  // Python "unicode-escape" decoding, which is what Jinja applies to string literals.
  void lex_string(char quote) {
    const int start_line = line_;
    std::string out;
    size_t k = pos_ + 1;
    while (true) {
      if (k >= src_.size()) syntax_error(start_line, "unterminated string literal");
      const char c = src_[k];
      if (c == quote) { ++k; break; }
      if (c == '\n') ++line_;
      if (c != '\\') { out.push_back(c); ++k; continue; }
      if (k + 1 >= src_.size()) syntax_error(start_line, "unterminated string literal");
      const char e = src_[k + 1];
      k += 2;
      switch (e) {
        case '\n': ++line_; break;  // line continuation
        case '\\': out.push_back('\\'); break;
        case '\'': out.push_back('\''); break;
        case '"': out.push_back('"'); break;
        case 'a': out.push_back('\a'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'v': out.push_back('\v'); break;
        case 'x': case 'u': case 'U': {
          const int width = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          char32_t cp = 0;
          for (int d = 0; d < width; ++d) {
            const int h = k < src_.size() ? hex_value(src_[k]) : -1;
            if (h < 0) syntax_error(start_line, std::string("truncated \\") + e + " escape in string literal");
            cp = cp * 16 + static_cast<char32_t>(h);
            ++k;
          }
          if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) syntax_error(start_line, "invalid code point escape in string literal");
          append_utf8(out, cp);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            char32_t cp = static_cast<char32_t>(e - '0');
            for (int d = 0; d < 2 && k < src_.size() && src_[k] >= '0' && src_[k] <= '7'; ++d, ++k)
              cp = cp * 8 + static_cast<char32_t>(src_[k] - '0');
            append_utf8(out, cp);
          } else if (e == 'N') {
            syntax_error(start_line, "\\N{...} escapes are not supported");
          } else {
            out.push_back('\\');
            out.push_back(e);
            if (e == '\n') ++line_;
          }
      }
    }
    token t;
    t.type = tok::string;
    t.text = std::move(out);
    t.line = start_line;
    tokens_.push_back(std::move(t));
    pos_ = k;
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<token> tokens_;
};

}  // namespace

// ---- AST -----------------------------------------------------------------------------------------

enum class expr_kind {
  literal, name, list, tuple, dict, getattr, getitem, slice, call, filter, test, not_op, neg, pos, binary,
  compare, and_op, or_op, cond, concat,
};

struct expr {
  expr_kind kind = expr_kind::literal;
  int line = 1;
  value literal;
  std::string name;                          // variable, attribute, filter, test, binary operator
  std::vector<std::unique_ptr<expr>> kids;   // operands; for calls/filters/tests: [callee/subject, args...]
  std::vector<std::string> keywords;         // call/filter/test: keyword name per argument ("" = positional)
  std::vector<std::string> compare_ops;      // compare: one operator between each pair of operands
  bool negated = false;                      // test: "is not"
  size_t depth = 1;                          // height of this subtree (bounded by the parser)
};
using expr_ptr = std::unique_ptr<expr>;

enum class node_kind { sequence, text, output, if_chain, for_loop, set_value, set_block, break_loop, continue_loop };

struct template_node {
  node_kind kind = node_kind::sequence;
  int line = 1;
  std::string text;
  std::vector<std::string> targets;   // for/set: variable names
  std::string attribute;              // set ns.attribute = ...
  std::vector<expr_ptr> exprs;        // if: conditions; for: [iterable, filter or null]; set: [value]
  std::vector<std::vector<std::unique_ptr<template_node>>> bodies;
  bool uses_loop = false;             // for: the body mentions `loop`
};
using node_ptr = std::unique_ptr<template_node>;
using node_list = std::vector<node_ptr>;

namespace {

// ---- parser --------------------------------------------------------------------------------------

constexpr size_t max_parse_depth = 256;

// Filters and tests are resolved when the template is compiled, as Jinja does: an unknown name is a
// syntax error, a standard Jinja one that this interpreter lacks is "unsupported".
bool is_known_filter(const std::string& n) {
  static const char* const names[] = {
      "trim", "length", "count", "upper", "lower", "capitalize", "title", "string", "safe", "tojson", "default", "d",
      "join", "replace", "first", "last", "int", "float", "list", "abs", "items", "reverse", "unique", "sort", "sum",
      "min", "max", "map", "select", "reject", "selectattr", "rejectattr", "indent", "escape", "e"};
  return std::find(std::begin(names), std::end(names), n) != std::end(names);
}
bool is_standard_jinja_filter(const std::string& n) {
  static const char* const names[] = {
      "attr", "batch", "center", "dictsort", "filesizeformat", "forceescape", "format", "groupby", "pprint",
      "random", "round", "slice", "striptags", "truncate", "urlencode", "urlize", "wordcount", "wordwrap", "xmlattr"};
  return std::find(std::begin(names), std::end(names), n) != std::end(names);
}
bool is_standard_jinja_test(const std::string& n) { return n == "escaped" || n == "filter" || n == "test"; }
bool is_known_test(const std::string& n) {
  static const char* const names[] = {
      "defined", "undefined", "none", "string", "number", "integer", "float", "boolean", "true", "false", "mapping",
      "sequence", "iterable", "callable", "lower", "upper", "even", "odd", "divisibleby", "eq", "equalto", "==", "ne",
      "!=", "lt", "lessthan", "<", "le", "<=", "gt", "greaterthan", ">", "ge", ">=", "in", "sameas"};
  return std::find(std::begin(names), std::end(names), n) != std::end(names);
}

class parser {
 public:
  explicit parser(std::vector<token> tokens) : toks_(std::move(tokens)) {}

  node_ptr parse_template() {
    auto root = std::make_unique<template_node>();
    root->kind = node_kind::sequence;
    std::string end;
    root->bodies.push_back(parse_body({}, &end));
    resolve(*root, false);
    return root;
  }

 private:
  struct depth_guard {
    explicit depth_guard(parser& p) : p_(p) {
      if (++p_.depth_ > max_parse_depth) syntax_error(p_.cur().line, "template nesting is too deep");
    }
    ~depth_guard() { --p_.depth_; }
    parser& p_;
  };

  const token& cur() const { return toks_[pos_]; }
  const token& peek(size_t ahead = 1) const { return toks_[std::min(pos_ + ahead, toks_.size() - 1)]; }
  void advance() { if (pos_ + 1 < toks_.size()) ++pos_; }
  bool is_op(const char* op) const { return cur().type == tok::op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == tok::name && cur().text == n; }
  static std::string describe(const token& t) {
    switch (t.type) {
      case tok::eof: return "end of template";
      case tok::var_end: return "'}}'";
      case tok::block_end: return "'%}'";
      case tok::string: return "string literal";
      case tok::integer: case tok::floating: return "number " + t.text;
      default: return "'" + t.text + "'";
    }
  }
  [[noreturn]] void unexpected(const std::string& expected) const {
    syntax_error(cur().line, "expected " + expected + ", got " + describe(cur()));
  }
  void expect_op(const char* op) {
    if (!is_op(op)) unexpected(std::string("'") + op + "'");
    advance();
  }
  void expect_block_end() {
    if (cur().type != tok::block_end) unexpected("'%}'");
    advance();
  }
  // Tags that open a body accept a Python-style colon before "%}" (jinja2/parser.py, parse_statements).
  void expect_body_start() {
    if (is_op(":")) advance();
    expect_block_end();
  }
  std::string expect_name() {
    if (cur().type != tok::name) unexpected("a name");
    std::string n = cur().text;
    advance();
    return n;
  }

  // Parses nodes until `{% <one of end_tags>`; consumes that tag name (not the rest of its tag) and
  // reports which one. With no end tags, parses to the end of the template.
  node_list parse_body(std::initializer_list<const char*> end_tags, std::string* which) {
    depth_guard guard(*this);
    node_list nodes;
    while (true) {
      const token& t = cur();
      if (t.type == tok::eof) {
        if (end_tags.size() == 0) return nodes;
        std::string list;
        for (const char* e : end_tags) list += (list.empty() ? "" : " or ") + std::string("'") + e + "'";
        syntax_error(t.line, "unexpected end of template, expected " + list);
      }
      if (t.type == tok::text) {
        auto n = std::make_unique<template_node>();
        n->kind = node_kind::text;
        n->line = t.line;
        n->text = t.text;
        nodes.push_back(std::move(n));
        advance();
      } else if (t.type == tok::var_begin) {
        auto n = std::make_unique<template_node>();
        n->kind = node_kind::output;
        n->line = t.line;
        advance();
        n->exprs.push_back(parse_tuple(true, false));
        if (cur().type != tok::var_end) unexpected("'}}'");
        advance();
        nodes.push_back(std::move(n));
      } else if (t.type == tok::block_begin) {
        advance();
        if (cur().type != tok::name) unexpected("a tag name");
        const std::string tag = cur().text;
        for (const char* e : end_tags) {
          if (tag == e) {
            advance();
            *which = tag;
            return nodes;
          }
        }
        nodes.push_back(parse_statement());
      } else {
        unexpected("text or a tag");
      }
    }
  }

  node_ptr parse_statement() {
    const int line = cur().line;
    const std::string tag = cur().text;
    advance();
    auto n = std::make_unique<template_node>();
    n->line = line;
    if (tag == "if") {
      n->kind = node_kind::if_chain;
      n->exprs.push_back(parse_tuple(false, false));
      expect_body_start();
      while (true) {
        std::string which;
        n->bodies.push_back(parse_body({"elif", "else", "endif"}, &which));
        if (which == "elif") {
          n->exprs.push_back(parse_tuple(false, false));
          expect_body_start();
        } else if (which == "else") {
          expect_body_start();
          std::string end;
          n->bodies.push_back(parse_body({"endif"}, &end));
          expect_block_end();
          break;
        } else {
          expect_block_end();
          break;
        }
      }
    } else if (tag == "for") {
      n->kind = node_kind::for_loop;
      const bool parens = is_op("(");
      if (parens) advance();
      n->targets.push_back(expect_name());
      while (is_op(",")) {
        advance();
        if (cur().type != tok::name) break;
        n->targets.push_back(expect_name());
      }
      if (parens) expect_op(")");
      if (!is_name("in")) unexpected("'in'");
      advance();
      n->exprs.push_back(parse_tuple(false, false));
      if (is_name("if")) {
        advance();
        n->exprs.push_back(parse_expression(true));
      } else {
        n->exprs.push_back(nullptr);
      }
      if (is_name("recursive")) fail(chat_template_error_kind::unsupported, "chat template uses a recursive for loop (line " + std::to_string(line) + "), which is not supported");
      expect_body_start();
      ++loop_depth_;
      std::string which;
      n->bodies.push_back(parse_body({"else", "endfor"}, &which));
      --loop_depth_;
      if (which == "else") {
        expect_body_start();
        std::string end;
        n->bodies.push_back(parse_body({"endfor"}, &end));
      }
      expect_block_end();
      n->uses_loop = mentions_loop(n->bodies[0]) || (n->exprs[1] && mentions_loop(*n->exprs[1]));
    } else if (tag == "set") {
      n->targets.push_back(expect_name());
      if (is_op(".")) {
        advance();
        n->attribute = expect_name();
      } else {
        while (is_op(",")) {
          advance();
          n->targets.push_back(expect_name());
        }
      }
      if (is_op("=")) {
        advance();
        n->kind = node_kind::set_value;
        n->exprs.push_back(parse_tuple(true, false));
        expect_block_end();
      } else {
        if (is_op("|")) fail(chat_template_error_kind::unsupported, "chat template uses a filtered block set (line " + std::to_string(line) + "), which is not supported");
        if (n->targets.size() != 1) unexpected("'='");
        n->kind = node_kind::set_block;
        expect_body_start();
        std::string end;
        n->bodies.push_back(parse_body({"endset"}, &end));
        expect_block_end();
      }
    } else if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) syntax_error(line, "'" + tag + "' outside of a loop");
      n->kind = tag == "break" ? node_kind::break_loop : node_kind::continue_loop;
      expect_block_end();
    } else if (tag == "generation") {
      // transformers' {% generation %} marks assistant text for masks; it renders its body unchanged.
      n->kind = node_kind::sequence;
      expect_body_start();
      std::string end;
      n->bodies.push_back(parse_body({"endgeneration"}, &end));
      expect_block_end();
    } else if (tag == "macro" || tag == "call" || tag == "filter" || tag == "import" || tag == "from" ||
               tag == "include" || tag == "extends" || tag == "block" || tag == "raw" || tag == "with" ||
               tag == "autoescape" || tag == "do") {
      fail(chat_template_error_kind::unsupported,
           "chat template uses '{% " + tag + " %}' (line " + std::to_string(line) + "), which is not supported");
    } else {
      syntax_error(line, "unknown tag '" + tag + "'");
    }
    return n;
  }

  // Jinja resolves filter and test names when it compiles a template, except inside "soft" frames
  // (the test and branches of an {% if %}, and inline `a if b else c` expressions), where an unknown
  // name only fails if it is evaluated (jinja2/compiler.py, _filter_test_common). Loop and block-set
  // bodies are inner frames and therefore strict again.
  static void resolve(const expr& e, bool soft) {
    const bool inner_soft = soft || e.kind == expr_kind::cond;
    if (!inner_soft && e.kind == expr_kind::filter && !is_known_filter(e.name)) {
      if (is_standard_jinja_filter(e.name))
        fail(chat_template_error_kind::unsupported, "chat template uses the filter '" + e.name + "' (line " + std::to_string(e.line) + "), which is not supported");
      syntax_error(e.line, "no filter named '" + e.name + "'");
    }
    if (!inner_soft && e.kind == expr_kind::test && !is_known_test(e.name)) {
      if (is_standard_jinja_test(e.name))
        fail(chat_template_error_kind::unsupported, "chat template uses the test '" + e.name + "' (line " + std::to_string(e.line) + "), which is not supported");
      syntax_error(e.line, "no test named '" + e.name + "'");
    }
    for (const auto& k : e.kids) if (k) resolve(*k, inner_soft);
  }
  static void resolve(const template_node& n, bool soft) {
    switch (n.kind) {
      case node_kind::if_chain:
        for (const auto& e : n.exprs) resolve(*e, true);
        for (const auto& b : n.bodies) for (const auto& c : b) resolve(*c, true);
        return;
      case node_kind::for_loop:
        resolve(*n.exprs[0], soft);
        if (n.exprs[1]) resolve(*n.exprs[1], false);
        for (const auto& b : n.bodies) for (const auto& c : b) resolve(*c, false);
        return;
      case node_kind::set_block:
        for (const auto& c : n.bodies[0]) resolve(*c, false);
        return;
      default:
        for (const auto& e : n.exprs) if (e) resolve(*e, soft);
        for (const auto& b : n.bodies) for (const auto& c : b) resolve(*c, soft);
    }
  }

  static bool mentions_loop(const expr& e) {
    if (e.kind == expr_kind::name && e.name == "loop") return true;
    return std::any_of(e.kids.begin(), e.kids.end(), [](const expr_ptr& k) { return k && mentions_loop(*k); });
  }
  static bool mentions_loop(const node_list& body) {
    for (const auto& n : body) {
      for (const auto& e : n->exprs) if (e && mentions_loop(*e)) return true;
      for (const auto& b : n->bodies) if (mentions_loop(b)) return true;
    }
    return false;
  }

  // Left-associative chains (a + b + ..., x|f|g..., x.a.b...) are built by loops, not recursion,
  // so their height is checked here; it bounds every later recursion over the tree (resolution,
  // evaluation, destruction).
  void add_kid(expr& e, expr_ptr kid) {
    if (kid) {
      e.depth = std::max(e.depth, kid->depth + 1);
      if (e.depth > max_parse_depth) syntax_error(e.line, "expression is nested too deeply");
    }
    e.kids.push_back(std::move(kid));
  }

  expr_ptr make(expr_kind kind, int line) {
    auto e = std::make_unique<expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  bool is_tuple_end() const {
    return cur().type == tok::var_end || cur().type == tok::block_end || is_op(")") || cur().type == tok::eof;
  }

  expr_ptr parse_tuple(bool with_condexpr, bool explicit_parens) {
    const int line = cur().line;
    std::vector<expr_ptr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end()) break;
      items.push_back(parse_expression(with_condexpr));
      if (is_op(",")) is_tuple = true;
      else break;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) unexpected("an expression");
    }
    auto e = make(expr_kind::tuple, line);
    for (auto& item : items) add_kid(*e, std::move(item));
    return e;
  }

  expr_ptr parse_expression(bool with_condexpr) {
    depth_guard guard(*this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  expr_ptr parse_condexpr() {
    expr_ptr body = parse_or();
    while (is_name("if")) {
      const int line = cur().line;
      advance();
      auto e = make(expr_kind::cond, line);
      expr_ptr test = parse_or();
      expr_ptr otherwise;
      if (is_name("else")) {
        advance();
        depth_guard guard(*this);
        otherwise = parse_condexpr();
      }
      add_kid(*e, std::move(test));
      add_kid(*e, std::move(body));
      add_kid(*e, std::move(otherwise));  // may be null: renders as undefined
      body = std::move(e);
    }
    return body;
  }

  expr_ptr parse_or() {
    expr_ptr left = parse_and();
    while (is_name("or")) {
      auto e = make(expr_kind::or_op, cur().line);
      advance();
      add_kid(*e, std::move(left));
      add_kid(*e, parse_and());
      left = std::move(e);
    }
    return left;
  }
  expr_ptr parse_and() {
    expr_ptr left = parse_not();
    while (is_name("and")) {
      auto e = make(expr_kind::and_op, cur().line);
      advance();
      add_kid(*e, std::move(left));
      add_kid(*e, parse_not());
      left = std::move(e);
    }
    return left;
  }
  expr_ptr parse_not() {
    if (is_name("not")) {
      depth_guard guard(*this);
      auto e = make(expr_kind::not_op, cur().line);
      advance();
      add_kid(*e, parse_not());
      return e;
    }
    return parse_compare();
  }
  expr_ptr parse_compare() {
    const int line = cur().line;
    expr_ptr first = parse_math1();
    std::vector<std::string> ops;
    std::vector<expr_ptr> operands;
    while (true) {
      std::string op;
      if (cur().type == tok::op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                    cur().text == ">" || cur().text == "<=" || cur().text == ">=")) {
        op = cur().text;
        advance();
      } else if (is_name("in")) {
        op = "in";
        advance();
      } else if (is_name("not") && peek().type == tok::name && peek().text == "in") {
        op = "not in";
        advance();
        advance();
      } else {
        break;
      }
      ops.push_back(op);
      operands.push_back(parse_math1());
    }
    if (ops.empty()) return first;
    auto e = make(expr_kind::compare, line);
    add_kid(*e, std::move(first));
    for (auto& o : operands) add_kid(*e, std::move(o));
    e->compare_ops = std::move(ops);
    return e;
  }
  expr_ptr binary(const std::string& op, expr_ptr left, expr_ptr right, int line) {
    auto e = make(expr_kind::binary, line);
    e->name = op;
    add_kid(*e, std::move(left));
    add_kid(*e, std::move(right));
    return e;
  }
  expr_ptr parse_math1() {
    expr_ptr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = cur().text;
      const int line = cur().line;
      advance();
      left = binary(op, std::move(left), parse_concat(), line);
    }
    return left;
  }
  expr_ptr parse_concat() {
    const int line = cur().line;
    expr_ptr first = parse_math2();
    if (!is_op("~")) return first;
    auto e = make(expr_kind::concat, line);
    add_kid(*e, std::move(first));
    while (is_op("~")) {
      advance();
      add_kid(*e, parse_math2());
    }
    return e;
  }
  expr_ptr parse_math2() {
    expr_ptr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = cur().text;
      const int line = cur().line;
      advance();
      left = binary(op, std::move(left), parse_pow(), line);
    }
    return left;
  }
  expr_ptr parse_pow() {
    expr_ptr left = parse_unary(true);
    while (is_op("**")) {
      const int line = cur().line;
      advance();
      left = binary("**", std::move(left), parse_unary(true), line);
    }
    return left;
  }
  expr_ptr parse_unary(bool with_filter) {
    depth_guard guard(*this);
    expr_ptr node;
    if (is_op("-") || is_op("+")) {
      auto e = make(is_op("-") ? expr_kind::neg : expr_kind::pos, cur().line);
      advance();
      add_kid(*e, parse_unary(false));
      node = std::move(e);
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }
  expr_ptr parse_primary() {
    const token& t = cur();
    const int line = t.line;
    if (t.type == tok::name) {
      const std::string n = t.text;
      advance();
      auto e = make(expr_kind::literal, line);
      if (n == "true" || n == "True") e->literal = value::boolean(true);
      else if (n == "false" || n == "False") e->literal = value::boolean(false);
      else if (n == "none" || n == "None") e->literal = value::none();
      else {
        e->kind = expr_kind::name;
        e->name = n;
      }
      return e;
    }
    if (t.type == tok::string) {
      std::string s;
      while (cur().type == tok::string) {  // adjacent literals concatenate, as in Python
        s += cur().text;
        advance();
      }
      auto e = make(expr_kind::literal, line);
      e->literal = value::string(std::move(s));
      return e;
    }
    if (t.type == tok::integer || t.type == tok::floating) {
      auto e = make(expr_kind::literal, line);
      e->literal = t.type == tok::integer ? value::integer(t.i) : value::floating(t.f);
      advance();
      return e;
    }
    if (is_op("(")) {
      advance();
      expr_ptr inner = parse_tuple(true, true);
      expect_op(")");
      return inner;
    }
    if (is_op("[")) {
      advance();
      auto e = make(expr_kind::list, line);
      while (!is_op("]")) {
        if (!e->kids.empty()) expect_op(",");
        if (is_op("]")) break;
        add_kid(*e, parse_expression(true));
      }
      expect_op("]");
      return e;
    }
    if (is_op("{")) {
      advance();
      auto e = make(expr_kind::dict, line);
      while (!is_op("}")) {
        if (!e->kids.empty()) expect_op(",");
        if (is_op("}")) break;
        add_kid(*e, parse_expression(true));
        expect_op(":");
        add_kid(*e, parse_expression(true));
      }
      expect_op("}");
      return e;
    }
    unexpected("an expression");
  }
  expr_ptr parse_postfix(expr_ptr node) {
    while (true) {
      if (is_op(".")) {
        const int line = cur().line;
        advance();
        if (cur().type == tok::name) {
          auto e = make(expr_kind::getattr, line);
          e->name = cur().text;
          advance();
          add_kid(*e, std::move(node));
          node = std::move(e);
        } else if (cur().type == tok::integer) {
          auto e = make(expr_kind::getitem, line);
          add_kid(*e, std::move(node));
          auto idx = make(expr_kind::literal, line);
          idx->literal = value::integer(cur().i);
          add_kid(*e, std::move(idx));
          advance();
          node = std::move(e);
        } else {
          unexpected("an attribute name");
        }
      } else if (is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node), expr_kind::call, "");
      } else {
        return node;
      }
    }
  }
  expr_ptr parse_subscript(expr_ptr node) {
    const int line = cur().line;
    advance();  // [
    std::vector<expr_ptr> parts;
    bool is_slice = false;
    if (is_op("]")) {  // x[] subscripts with the empty tuple
      parts.push_back(make(expr_kind::tuple, line));
    } else if (is_op(":")) {
      parts.push_back(nullptr);
    } else {
      parts.push_back(parse_expression(true));
      if (is_op(",")) {  // x[a, b] subscripts with the tuple (a, b)
        auto key = make(expr_kind::tuple, line);
        add_kid(*key, std::move(parts[0]));
        while (is_op(",")) {
          advance();
          add_kid(*key, parse_expression(true));
        }
        parts[0] = std::move(key);
      }
    }
    if (is_op(":")) {
      is_slice = true;
      advance();
      parts.push_back(is_op("]") || is_op(":") ? nullptr : parse_expression(true));
      if (is_op(":")) {
        advance();
        parts.push_back(is_op("]") ? nullptr : parse_expression(true));
      } else {
        parts.push_back(nullptr);
      }
    }
    expect_op("]");
    auto e = make(is_slice ? expr_kind::slice : expr_kind::getitem, line);
    add_kid(*e, std::move(node));
    for (auto& p : parts) add_kid(*e, std::move(p));
    return e;
  }
  // Parses "(args)" into e->kids[1..] / e->keywords; kids[0] is the callee or filtered value.
  expr_ptr parse_call(expr_ptr subject, expr_kind kind, std::string name) {
    auto e = make(kind, cur().line);
    e->name = std::move(name);
    add_kid(*e, std::move(subject));
    if (is_op("(")) {
      advance();
      bool first = true;
      while (!is_op(")")) {
        if (!first) expect_op(",");
        first = false;
        if (is_op(")")) break;
        if (is_op("*") || is_op("**")) fail(chat_template_error_kind::unsupported, "chat template uses *args/**kwargs in a call (line " + std::to_string(cur().line) + "), which is not supported");
        if (cur().type == tok::name && peek().type == tok::op && peek().text == "=") {
          e->keywords.push_back(cur().text);
          advance();
          advance();
        } else {
          if (std::any_of(e->keywords.begin(), e->keywords.end(), [](const std::string& k) { return !k.empty(); }))
            syntax_error(cur().line, "positional argument follows keyword argument");
          e->keywords.emplace_back();
        }
        add_kid(*e, parse_expression(true));
      }
      expect_op(")");
    }
    return e;
  }
  expr_ptr parse_filter_expr(expr_ptr node) {
    while (true) {
      if (is_op("|")) {
        advance();
        const int line = cur().line;
        std::string name = expect_name();
        while (is_op(".")) {
          advance();
          name += "." + expect_name();
        }
        node = parse_call(std::move(node), expr_kind::filter, name);
        node->line = line;
      } else if (is_name("is")) {
        advance();
        bool negated = false;
        if (is_name("not")) {
          negated = true;
          advance();
        }
        const int line = cur().line;
        std::string name = expect_name();
        while (is_op(".")) {
          advance();
          name += "." + expect_name();
        }
        if (is_op("(")) {
          node = parse_call(std::move(node), expr_kind::test, name);
          node->line = line;
        } else {
          auto e = make(expr_kind::test, line);
          e->name = name;
          add_kid(*e, std::move(node));
          const token& t = cur();
          const bool arg_follows =
              (t.type == tok::name && t.text != "else" && t.text != "or" && t.text != "and") ||
              t.type == tok::string || t.type == tok::integer || t.type == tok::floating ||
              is_op("(") || is_op("[") || is_op("{");
          if (arg_follows) {
            add_kid(*e, parse_postfix(parse_primary()));
            e->keywords.emplace_back();
          }
          node = std::move(e);
        }
        node->negated = negated;
      } else if (is_op("(")) {
        node = parse_call(std::move(node), expr_kind::call, "");
      } else {
        return node;
      }
    }
  }

  std::vector<token> toks_;
  size_t pos_ = 0;
  size_t depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

// ---- values ----------------------------------------------------------------------------------------

value value::string(std::string x) {
  value v;
  v.kind = value_kind::string;
  v.s = std::make_shared<const std::string>(std::move(x));
  return v;
}

namespace {
size_t depth_of(const value& v) {
  if (v.kind == value_kind::list) return v.list->depth;
  if (v.kind == value_kind::dict) return v.dict->depth;
  if (v.kind == value_kind::ns) return v.dict->depth;
  return 0;
}
bool holds_namespace(const value& v) {
  if (v.kind == value_kind::ns) return true;
  if (v.kind == value_kind::list) return v.list->holds_namespace;
  if (v.kind == value_kind::dict) return v.dict->holds_namespace;
  return false;
}
}  // namespace

value value::make_list(std::vector<value> items, bool is_tuple) {
  auto data = std::make_shared<list_data>();
  for (const auto& item : items) {
    data->depth = std::max(data->depth, depth_of(item) + 1);
    data->holds_namespace = data->holds_namespace || holds_namespace(item);
  }
  data->items = std::move(items);
  data->is_tuple = is_tuple;
  value v;
  v.kind = value_kind::list;
  v.list = std::move(data);
  return v;
}

value value::make_dict(std::vector<std::pair<value, value>> entries) {
  auto data = std::make_shared<dict_data>();
  for (const auto& [k, item] : entries) {
    data->depth = std::max({data->depth, depth_of(k) + 1, depth_of(item) + 1});
    data->holds_namespace = data->holds_namespace || holds_namespace(item) || holds_namespace(k);
  }
  data->entries = std::move(entries);
  value v;
  v.kind = value_kind::dict;
  v.dict = std::move(data);
  return v;
}

program::~program() = default;

std::shared_ptr<const program> program::parse(std::string_view source) {
  // Real chat templates are a few KiB; a multi-MiB "template" is an attack on load time.
  constexpr size_t max_source_bytes = 4u << 20;
  if (source.size() > max_source_bytes)
    fail(chat_template_error_kind::limit, "chat template is too large (" + std::to_string(source.size()) + " bytes, limit " +
                                              std::to_string(max_source_bytes) + ")");
  std::vector<token> tokens = lexer(source).run();
  parser p(std::move(tokens));
  std::shared_ptr<program> prog(new program());
  prog->root_ = p.parse_template();
  return prog;
}

// ---- evaluator -------------------------------------------------------------------------------------

namespace {

enum class flow { normal, break_loop, continue_loop };

struct call_args {
  std::vector<value> positional;
  std::vector<std::pair<std::string, value>> keyword;

  // The argument at `index` (after the subject) or named `name`, or null.
  const value* get(size_t index, std::string_view name) const {
    if (index < positional.size()) return &positional[index];
    for (const auto& [k, v] : keyword) if (k == name) return &v;
    return nullptr;
  }
};

const char* kind_name(const value& v) {
  switch (v.kind) {
    case value_kind::undefined: return "undefined";
    case value_kind::none: return "none";
    case value_kind::boolean: return "bool";
    case value_kind::integer: return "int";
    case value_kind::floating: return "float";
    case value_kind::string: return "string";
    case value_kind::list: return v.list->is_tuple ? "tuple" : "list";
    case value_kind::dict: return "dict";
    case value_kind::ns: return "namespace";
    case value_kind::function: return "function";
  }
  return "value";
}

bool is_number(const value& v) {
  return v.kind == value_kind::integer || v.kind == value_kind::floating || v.kind == value_kind::boolean;
}
double as_double(const value& v) {
  return v.kind == value_kind::floating ? v.f : static_cast<double>(v.kind == value_kind::boolean ? v.b : v.i);
}
int64_t as_int(const value& v) { return v.kind == value_kind::boolean ? v.b : v.i; }

class renderer {
 public:
  renderer(const limits& bounds, int64_t now) : lim_(bounds), now_(now) {}

  std::string run(const template_node& root, const context& variables) {
    frames_.emplace_back();
    frames_.back().emplace_back("raise_exception", value::function(builtin_function::raise_exception));
    frames_.back().emplace_back("namespace", value::function(builtin_function::namespace_ctor));
    frames_.back().emplace_back("range", value::function(builtin_function::range));
    frames_.back().emplace_back("dict", value::function(builtin_function::dict_ctor));
    frames_.back().emplace_back("strftime_now", value::function(builtin_function::strftime_now));
    for (const auto& [k, v] : variables) set_var(k, v);
    frames_.emplace_back();  // the template's own top-level assignments
    exec(root);
    return std::move(out_);
  }

 private:
  using frame = std::vector<std::pair<std::string, value>>;

  struct depth_guard {
    explicit depth_guard(renderer& r) : r_(r) {
      if (++r_.depth_ > r_.lim_.max_depth)
        fail(chat_template_error_kind::limit, "chat template exceeded the recursion depth limit (" + std::to_string(r_.lim_.max_depth) + ")");
    }
    ~depth_guard() { --r_.depth_; }
    renderer& r_;
  };

  void spend(uint64_t n) {
    steps_ += n;
    if (steps_ > lim_.max_steps)
      fail(chat_template_error_kind::limit, "chat template exceeded the work budget (" + std::to_string(lim_.max_steps) + " steps)");
  }
  void check_size(size_t bytes) {
    if (bytes > lim_.max_output_bytes)
      fail(chat_template_error_kind::limit, "chat template exceeded the output size limit (" + std::to_string(lim_.max_output_bytes) + " bytes)");
  }
  // Building strings costs 1 step per 64 bytes, so the budget also bounds how much memory a
  // template can fill with distinct large strings (about 64 MiB at the default budget).
  value make_string(std::string s) {
    check_size(s.size());
    spend(1 + s.size() / 64);
    return value::string(std::move(s));
  }
  value make_list(std::vector<value> items, bool is_tuple = false) {
    spend(1 + items.size());
    value v = value::make_list(std::move(items), is_tuple);
    check_depth(v);
    return v;
  }
  value make_dict(std::vector<std::pair<value, value>> entries) {
    spend(1 + entries.size());
    value v = value::make_dict(std::move(entries));
    check_depth(v);
    return v;
  }
  void check_depth(const value& v) {
    if (depth_of(v) > lim_.max_depth)
      fail(chat_template_error_kind::limit, "chat template built a value nested deeper than " + std::to_string(lim_.max_depth) + " levels");
  }
  void emit(std::string_view s) {
    check_size(out_.size() + s.size());
    spend(s.size() / 256);
    out_.append(s);
  }

  // ---- variables ----
  const value* find_var(const std::string& name) const {
    for (auto f = frames_.rbegin(); f != frames_.rend(); ++f)
      for (auto& [k, v] : *f) if (k == name) return &v;
    return nullptr;
  }
  void set_var(const std::string& name, value v) {
    for (auto& [k, old] : frames_.back()) {
      if (k == name) { old = std::move(v); return; }
    }
    frames_.back().emplace_back(name, std::move(v));
  }

  // ---- statements ----
  flow exec_body(const node_list& body) {
    for (const auto& n : body) {
      flow f = exec(*n);
      if (f != flow::normal) return f;
    }
    return flow::normal;
  }

  flow exec(const template_node& n) {
    depth_guard guard(*this);
    spend(1);
    switch (n.kind) {
      case node_kind::sequence: return exec_body(n.bodies[0]);
      case node_kind::text: emit(n.text); return flow::normal;
      case node_kind::output: {
        value v = eval(*n.exprs[0]);
        if (v.kind == value_kind::string) emit(v.str());
        else emit(to_str(v));
        return flow::normal;
      }
      case node_kind::if_chain:
        for (size_t k = 0; k < n.exprs.size(); ++k)
          if (truthy(eval(*n.exprs[k]))) return exec_body(n.bodies[k]);
        if (n.bodies.size() > n.exprs.size()) return exec_body(n.bodies.back());
        return flow::normal;
      case node_kind::for_loop: exec_for(n); return flow::normal;
      case node_kind::set_value: {
        value v = eval(*n.exprs[0]);
        assign(n, std::move(v));
        return flow::normal;
      }
      case node_kind::set_block: {
        std::string saved = std::move(out_);
        out_.clear();
        frames_.emplace_back();
        try {
          exec_body(n.bodies[0]);
        } catch (...) {
          frames_.pop_back();
          throw;
        }
        frames_.pop_back();
        std::string captured = std::move(out_);
        out_ = std::move(saved);
        set_var(n.targets[0], make_string(std::move(captured)));
        return flow::normal;
      }
      case node_kind::break_loop: return flow::break_loop;
      case node_kind::continue_loop: return flow::continue_loop;
    }
    return flow::normal;
  }

  void assign(const template_node& n, value v) {
    if (!n.attribute.empty()) {
      const value* target = find_var(n.targets[0]);
      if (!target || target->kind != value_kind::ns)
        fail_render("can only assign attributes of a namespace() object, not of '" + n.targets[0] + "'");
      if (!n.attribute.empty() && n.attribute[0] == '_') fail_render("namespace attributes may not start with '_'");
      if (holds_namespace(v)) fail_render("a namespace() object cannot be stored inside a namespace");
      auto& data = const_cast<dict_data&>(*target->dict);  // namespaces are the one mutable value
      data.depth = std::max(data.depth, depth_of(v) + 1);
      const value key = value::string(n.attribute);
      for (auto& [k, old] : data.entries) {
        if (k.str() == n.attribute) { old = std::move(v); return; }
      }
      data.entries.emplace_back(key, std::move(v));
      return;
    }
    if (n.targets.size() == 1) {
      set_var(n.targets[0], std::move(v));
      return;
    }
    std::vector<value> items = iterate(v);
    if (items.size() != n.targets.size())
      fail_render("cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(n.targets.size()) + " variables");
    for (size_t k = 0; k < items.size(); ++k) set_var(n.targets[k], std::move(items[k]));
  }

  void bind_targets(const std::vector<std::string>& targets, const value& item) {
    if (targets.size() == 1) {
      set_var(targets[0], item);
      return;
    }
    std::vector<value> parts = iterate(item);
    if (parts.size() != targets.size())
      fail_render("cannot unpack " + std::to_string(parts.size()) + " values into " + std::to_string(targets.size()) + " loop variables");
    for (size_t k = 0; k < parts.size(); ++k) set_var(targets[k], parts[k]);
  }

  struct frame_guard {
    explicit frame_guard(renderer& r) : r_(r) { r_.frames_.emplace_back(); }
    ~frame_guard() { r_.frames_.pop_back(); }
    renderer& r_;
  };

  void exec_for(const template_node& n) {
    std::vector<value> items = iterate(eval(*n.exprs[0]));
    if (n.exprs[1]) {
      std::vector<value> kept;
      for (auto& item : items) {
        frame_guard scope(*this);
        bind_targets(n.targets, item);
        if (truthy(eval(*n.exprs[1]))) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      if (n.bodies.size() > 1) exec_body(n.bodies[1]);
      return;
    }
    const auto length = static_cast<int64_t>(items.size());
    for (int64_t idx = 0; idx < length; ++idx) {
      spend(1);
      // Each iteration gets a fresh scope: assignments inside a loop body do not survive the
      // iteration (Jinja scoping; templates use namespace() to carry state across iterations).
      frame_guard scope(*this);
      if (n.uses_loop) {
        const auto u = static_cast<size_t>(idx);
        std::vector<std::pair<value, value>> e;
        e.reserve(11);
        auto put = [&](const char* k, value v) { e.emplace_back(value::string(k), std::move(v)); };
        put("index", value::integer(idx + 1));
        put("index0", value::integer(idx));
        put("revindex", value::integer(length - idx));
        put("revindex0", value::integer(length - idx - 1));
        put("first", value::boolean(idx == 0));
        put("last", value::boolean(idx == length - 1));
        put("length", value::integer(length));
        put("depth", value::integer(1));
        put("depth0", value::integer(0));
        put("previtem", idx > 0 ? items[u - 1] : value::undefined());
        put("nextitem", idx + 1 < length ? items[u + 1] : value::undefined());
        value loop = value::make_dict(std::move(e));
        const_cast<dict_data&>(*loop.dict).is_loop = true;
        spend(4);
        set_var("loop", std::move(loop));
      }
      bind_targets(n.targets, items[static_cast<size_t>(idx)]);
      flow f = exec_body(n.bodies[0]);
      if (f == flow::break_loop) break;
    }
  }

  // ---- conversions ----
  static bool truthy(const value& v) {
    switch (v.kind) {
      case value_kind::undefined: case value_kind::none: return false;
      case value_kind::boolean: return v.b;
      case value_kind::integer: return v.i != 0;
      case value_kind::floating: return v.f != 0.0;
      case value_kind::string: return !v.s->empty();
      case value_kind::list: return !v.list->items.empty();
      case value_kind::dict: return !v.dict->entries.empty();
      case value_kind::ns: case value_kind::function: return true;
    }
    return false;
  }

  // Python str().
  std::string to_str(const value& v) {
    switch (v.kind) {
      case value_kind::undefined: return "";
      case value_kind::string: return v.str();
      default: {
        std::string out;
        append_repr(out, v);
        return out;
      }
    }
  }

  static void append_string_repr(std::string& out, const std::string& s) {
    const bool has_single = s.find('\'') != std::string::npos;
    const bool has_double = s.find('"') != std::string::npos;
    const char quote = has_single && !has_double ? '"' : '\'';
    out.push_back(quote);
    for (char32_t c : decode_utf8(s)) {
      if (c == static_cast<char32_t>(quote) || c == '\\') { out.push_back('\\'); out.push_back(static_cast<char>(c)); }
      else if (c == '\n') out += "\\n";
      else if (c == '\r') out += "\\r";
      else if (c == '\t') out += "\\t";
      else if (c < 0x20 || c == 0x7F || (c >= 0x80 && c <= 0xA0) || c == 0xAD) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
        out += buf;
      } else if (c >= 0xDC80 && c <= 0xDCFF) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\udc%02x", static_cast<unsigned>(c - 0xDC00));
        out += buf;
      } else {
        append_utf8(out, c);
      }
    }
    out.push_back(quote);
  }

  // Python repr() (str() of containers uses repr() of their items).
  void append_repr(std::string& out, const value& v) {
    spend(1);
    check_size(out.size());
    switch (v.kind) {
      case value_kind::undefined: out += "Undefined"; return;
      case value_kind::none: out += "None"; return;
      case value_kind::boolean: out += v.b ? "True" : "False"; return;
      case value_kind::integer: out += std::to_string(v.i); return;
      case value_kind::floating: out += python_float_repr(v.f); return;
      case value_kind::string: spend(v.s->size() / 256); append_string_repr(out, v.str()); return;
      case value_kind::function:
        out += v.fn == builtin_function::bound_method ? "<built-in method " + *v.s + ">" : std::string("<built-in function>");
        return;
      case value_kind::list: {
        const bool tuple = v.list->is_tuple;
        out += tuple ? "(" : "[";
        bool first = true;
        for (const auto& item : v.list->items) {
          if (!first) out += ", ";
          first = false;
          append_repr(out, item);
        }
        if (tuple && v.list->items.size() == 1) out += ",";
        out += tuple ? ")" : "]";
        return;
      }
      case value_kind::dict: case value_kind::ns: {
        if (v.kind == value_kind::ns) out += "<Namespace ";
        out += "{";
        bool first = true;
        for (const auto& [k, item] : v.dict->entries) {
          if (!first) out += ", ";
          first = false;
          append_repr(out, k);
          out += ": ";
          append_repr(out, item);
        }
        out += "}";
        if (v.kind == value_kind::ns) out += ">";
        return;
      }
    }
  }

  static void append_json_string(std::string& out, const std::string& s, bool ensure_ascii) {
    out.push_back('"');
    for (char32_t c : decode_utf8(s)) {
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default: {
          char buf[16];
          if (c < 0x20) {
            std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
            out += buf;
          } else if (ensure_ascii && c >= 0x80) {
            if (c >= 0x10000) {
              const char32_t v = c - 0x10000;
              std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 + (v >> 10)),
                            static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
            } else {
              std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
            }
            out += buf;
          } else {
            append_utf8(out, c);
          }
        }
      }
    }
    out.push_back('"');
  }

  struct json_style {
    std::optional<std::string> indent;
    std::string item_separator = ", ";
    std::string key_separator = ": ";
    bool sort_keys = false;
    bool ensure_ascii = false;
  };

  // transformers' tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
  void append_json(std::string& out, const value& v, const json_style& style, size_t level) {
    spend(1);
    check_size(out.size());
    auto newline = [&](size_t lvl) {
      if (!style.indent) return;
      out.push_back('\n');
      for (size_t k = 0; k < lvl; ++k) out += *style.indent;
    };
    switch (v.kind) {
      case value_kind::undefined: fail_render("Object of type Undefined is not JSON serializable");
      case value_kind::none: out += "null"; return;
      case value_kind::boolean: out += v.b ? "true" : "false"; return;
      case value_kind::integer: out += std::to_string(v.i); return;
      case value_kind::floating:
        if (std::isnan(v.f)) out += "NaN";
        else if (std::isinf(v.f)) out += v.f < 0 ? "-Infinity" : "Infinity";
        else out += python_float_repr(v.f);
        return;
      case value_kind::string: spend(v.s->size() / 256); append_json_string(out, v.str(), style.ensure_ascii); return;
      case value_kind::function: case value_kind::ns:
        fail_render(std::string("Object of type ") + kind_name(v) + " is not JSON serializable");
      case value_kind::list: {
        if (v.list->items.empty()) { out += "[]"; return; }
        out += "[";
        bool first = true;
        for (const auto& item : v.list->items) {
          if (!first) out += style.item_separator;
          first = false;
          newline(level + 1);
          append_json(out, item, style, level + 1);
        }
        newline(level);
        out += "]";
        return;
      }
      case value_kind::dict: {
        if (v.dict->entries.empty()) { out += "{}"; return; }
        std::vector<std::pair<std::string, const value*>> entries;
        for (const auto& [k, item] : v.dict->entries) {
          std::string key;
          switch (k.kind) {
            case value_kind::string: key = k.str(); break;
            case value_kind::integer: key = std::to_string(k.i); break;
            case value_kind::floating: key = python_float_repr(k.f); break;
            case value_kind::boolean: key = k.b ? "true" : "false"; break;
            case value_kind::none: key = "null"; break;
            default: fail_render(std::string("keys must be str, int, float, bool or None, not ") + kind_name(k));
          }
          entries.emplace_back(std::move(key), &item);
        }
        if (style.sort_keys)
          std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
        out += "{";
        bool first = true;
        for (const auto& [k, item] : entries) {
          if (!first) out += style.item_separator;
          first = false;
          newline(level + 1);
          append_json_string(out, k, style.ensure_ascii);
          out += style.key_separator;
          append_json(out, *item, style, level + 1);
        }
        newline(level);
        out += "}";
        return;
      }
    }
  }

  // Python ==.
  bool equals(const value& a, const value& b) {
    spend(1);
    if (is_number(a) && is_number(b)) {
      if (a.kind == value_kind::floating || b.kind == value_kind::floating) return as_double(a) == as_double(b);
      return as_int(a) == as_int(b);
    }
    if (a.kind != b.kind) return false;
    switch (a.kind) {
      case value_kind::undefined: case value_kind::none: return true;
      case value_kind::string: return a.str() == b.str();
      case value_kind::list: {
        if (a.list->is_tuple != b.list->is_tuple || a.list->items.size() != b.list->items.size()) return false;
        for (size_t k = 0; k < a.list->items.size(); ++k)
          if (!equals(a.list->items[k], b.list->items[k])) return false;
        return true;
      }
      case value_kind::dict: {
        if (a.dict->entries.size() != b.dict->entries.size()) return false;
        for (const auto& [k, item] : a.dict->entries) {
          const value* other = find_in_dict(*b.dict, k);
          if (!other || !equals(item, *other)) return false;
        }
        return true;
      }
      case value_kind::ns: return a.dict == b.dict;
      case value_kind::function:
        return a.fn == b.fn && (a.fn != builtin_function::bound_method || (*a.s == *b.s && a.list == b.list));
      default: return false;
    }
  }

  const value* find_in_dict(const dict_data& d, const value& key) {
    for (const auto& [k, item] : d.entries) {
      if (equals(k, key)) return &item;
    }
    return nullptr;
  }

  // Python <, returning -1/0/1; raises for unordered types.
  int order(const value& a, const value& b) {
    spend(1);
    if (is_number(a) && is_number(b)) {
      if (a.kind == value_kind::floating || b.kind == value_kind::floating) {
        const double x = as_double(a), y = as_double(b);
        return x < y ? -1 : (x > y ? 1 : 0);
      }
      return as_int(a) < as_int(b) ? -1 : (as_int(a) > as_int(b) ? 1 : 0);
    }
    if (a.kind == value_kind::string && b.kind == value_kind::string) {
      const int c = a.str().compare(b.str());  // UTF-8 byte order is code point order
      return c < 0 ? -1 : (c > 0 ? 1 : 0);
    }
    if (a.kind == value_kind::list && b.kind == value_kind::list) {
      const auto& x = a.list->items;
      const auto& y = b.list->items;
      for (size_t k = 0; k < std::min(x.size(), y.size()); ++k) {
        if (!equals(x[k], y[k])) return order(x[k], y[k]);
      }
      return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
    }
    fail_render(std::string("'<' not supported between ") + kind_name(a) + " and " + kind_name(b));
  }

  bool contains(const value& container, const value& item) {
    switch (container.kind) {
      case value_kind::undefined: return false;
      case value_kind::string:
        if (item.kind != value_kind::string) fail_render(std::string("'in <string>' requires string as left operand, not ") + kind_name(item));
        spend(1 + container.s->size() / 256);
        return container.str().find(item.str()) != std::string::npos;
      case value_kind::list:
        for (const auto& x : container.list->items) if (equals(x, item)) return true;
        return false;
      case value_kind::dict: return find_in_dict(*container.dict, item) != nullptr;
      default: fail_render(std::string("argument of type ") + kind_name(container) + " is not iterable");
    }
  }

  std::vector<value> iterate(const value& v) {
    switch (v.kind) {
      case value_kind::undefined: return {};
      case value_kind::list: spend(v.list->items.size()); return v.list->items;
      case value_kind::dict: {
        std::vector<value> keys;
        for (const auto& e : v.dict->entries) keys.push_back(e.first);
        spend(keys.size());
        return keys;
      }
      case value_kind::string: {
        std::vector<value> chars;
        for (char32_t c : decode_utf8(v.str())) {
          std::string s;
          append_utf8(s, c);
          chars.push_back(value::string(std::move(s)));
        }
        spend(chars.size());
        return chars;
      }
      default: fail_render(std::string("'") + kind_name(v) + "' object is not iterable");
    }
  }

  static size_t length_of_value(const value& v) {
    switch (v.kind) {
      case value_kind::undefined: return 0;
      case value_kind::string: return count_code_points(v.str());
      case value_kind::list: return v.list->items.size();
      case value_kind::dict: return v.dict->entries.size();
      default: fail_render(std::string("object of type '") + kind_name(v) + "' has no len()");
    }
  }

  // ---- expressions ----
  value eval(const expr& e) {
    depth_guard guard(*this);
    spend(1);
    switch (e.kind) {
      case expr_kind::literal: return e.literal;
      case expr_kind::name: {
        const value* v = find_var(e.name);
        return v ? *v : value::undefined();
      }
      case expr_kind::list: case expr_kind::tuple: {
        std::vector<value> items;
        items.reserve(e.kids.size());
        for (const auto& k : e.kids) items.push_back(eval(*k));
        return make_list(std::move(items), e.kind == expr_kind::tuple);
      }
      case expr_kind::dict: {
        std::vector<std::pair<value, value>> entries;
        for (size_t k = 0; k + 1 < e.kids.size(); k += 2) {
          value key = eval(*e.kids[k]);
          if (key.kind == value_kind::list && !key.list->is_tuple) fail_render("unhashable type: 'list'");
          if (key.kind == value_kind::dict || key.kind == value_kind::ns) fail_render("unhashable type: 'dict'");
          value item = eval(*e.kids[k + 1]);
          bool replaced = false;
          for (auto& [old_key, old_item] : entries) {
            if (equals(old_key, key)) { old_item = item; replaced = true; break; }
          }
          if (!replaced) entries.emplace_back(std::move(key), std::move(item));
        }
        return make_dict(std::move(entries));
      }
      case expr_kind::getattr: return get_attribute(eval(*e.kids[0]), e.name);
      case expr_kind::getitem: return get_item(eval(*e.kids[0]), eval(*e.kids[1]));
      case expr_kind::slice: return eval_slice(e);
      case expr_kind::call: return eval_call(e);
      case expr_kind::filter: {
        value subject = eval(*e.kids[0]);
        return apply_filter(e.name, subject, eval_args(e));
      }
      case expr_kind::test: {
        value subject = eval(*e.kids[0]);
        const bool r = apply_test(e.name, subject, eval_args(e));
        return value::boolean(e.negated ? !r : r);
      }
      case expr_kind::not_op: return value::boolean(!truthy(eval(*e.kids[0])));
      case expr_kind::neg: case expr_kind::pos: {
        value v = eval(*e.kids[0]);
        if (!is_number(v)) fail_render(std::string("bad operand type for unary ") + (e.kind == expr_kind::neg ? "-" : "+") + ": " + kind_name(v));
        if (e.kind == expr_kind::pos) return v.kind == value_kind::boolean ? value::integer(v.b) : v;
        if (v.kind == value_kind::floating) return value::floating(-v.f);
        if (as_int(v) == std::numeric_limits<int64_t>::min()) fail_render("integer overflow");
        return value::integer(-as_int(v));
      }
      case expr_kind::binary: return binary_op(e.name, eval(*e.kids[0]), eval(*e.kids[1]));
      case expr_kind::compare: {
        value left = eval(*e.kids[0]);
        for (size_t k = 0; k < e.compare_ops.size(); ++k) {
          value right = eval(*e.kids[k + 1]);
          if (!compare_op(e.compare_ops[k], left, right)) return value::boolean(false);
          left = std::move(right);
        }
        return value::boolean(true);
      }
      case expr_kind::and_op: {
        value left = eval(*e.kids[0]);
        return truthy(left) ? eval(*e.kids[1]) : left;
      }
      case expr_kind::or_op: {
        value left = eval(*e.kids[0]);
        return truthy(left) ? left : eval(*e.kids[1]);
      }
      case expr_kind::cond: {
        if (truthy(eval(*e.kids[0]))) return eval(*e.kids[1]);
        return e.kids[2] ? eval(*e.kids[2]) : value::undefined();
      }
      case expr_kind::concat: {
        std::string s;
        for (const auto& k : e.kids) {
          s += to_str(eval(*k));
          check_size(s.size());
        }
        return make_string(std::move(s));
      }
    }
    return value::undefined();
  }

  call_args eval_args(const expr& e) {
    call_args args;
    for (size_t k = 1; k < e.kids.size(); ++k) {
      value v = eval(*e.kids[k]);
      const std::string& kw = e.keywords[k - 1];
      if (kw.empty()) args.positional.push_back(std::move(v));
      else args.keyword.emplace_back(kw, std::move(v));
    }
    return args;
  }

  value get_attribute(const value& obj, const std::string& name) {
    // Jinja's getattr tries the Python attribute first (so `d.items` is the method even when the
    // dict has an "items" key), then the item.
    if (has_method(obj, name)) {
      value method = value::function(builtin_function::bound_method);
      method.s = std::make_shared<const std::string>(name);
      method.list = std::make_shared<const list_data>(list_data{{obj}, false, depth_of(obj) + 1, holds_namespace(obj)});
      return method;
    }
    switch (obj.kind) {
      case value_kind::undefined: fail_render("cannot read attribute '" + name + "' of an undefined value");
      case value_kind::dict: case value_kind::ns: {
        for (const auto& [k, v] : obj.dict->entries) {
          if (k.kind == value_kind::string && k.str() == name) return v;
        }
        if (obj.kind == value_kind::dict && obj.dict->is_loop && name == "cycle") return value::function(builtin_function::loop_cycle);
        return value::undefined();
      }
      default: return value::undefined();
    }
  }

  static int64_t normalize_index(int64_t index, int64_t size) { return index < 0 ? index + size : index; }

  value get_item(const value& obj, const value& key) {
    switch (obj.kind) {
      case value_kind::undefined: fail_render("cannot index an undefined value");
      case value_kind::dict: {
        const value* v = find_in_dict(*obj.dict, key);
        return v ? *v : value::undefined();
      }
      case value_kind::ns:
        if (key.kind == value_kind::string) return get_attribute(obj, key.str());
        return value::undefined();
      case value_kind::list: {
        if (key.kind != value_kind::integer && key.kind != value_kind::boolean) return value::undefined();
        const auto size = static_cast<int64_t>(obj.list->items.size());
        const int64_t idx = normalize_index(as_int(key), size);
        if (idx < 0 || idx >= size) return value::undefined();
        return obj.list->items[static_cast<size_t>(idx)];
      }
      case value_kind::string: {
        if (key.kind != value_kind::integer && key.kind != value_kind::boolean) return value::undefined();
        if (is_ascii(obj.str())) {
          const auto size = static_cast<int64_t>(obj.s->size());
          const int64_t idx = normalize_index(as_int(key), size);
          if (idx < 0 || idx >= size) return value::undefined();
          return value::string(std::string(1, obj.str()[static_cast<size_t>(idx)]));
        }
        const std::u32string cps = decode_utf8(obj.str());
        spend(cps.size() / 256);
        const auto size = static_cast<int64_t>(cps.size());
        const int64_t idx = normalize_index(as_int(key), size);
        if (idx < 0 || idx >= size) return value::undefined();
        std::string s;
        append_utf8(s, cps[static_cast<size_t>(idx)]);
        return value::string(std::move(s));
      }
      default: return value::undefined();
    }
  }

  // Python slice semantics (PySlice_AdjustIndices). Jinja compiles slices to plain Python
  // indexing (they bypass environment.getitem), so slicing a non-sequence or using non-integer
  // bounds is an error rather than undefined.
  value eval_slice(const expr& e) {
    value obj = eval(*e.kids[0]);
    auto bound = [&](size_t k) -> std::optional<int64_t> {
      if (!e.kids[k]) return std::nullopt;
      value v = eval(*e.kids[k]);
      if (v.kind == value_kind::none) return std::nullopt;
      if (v.kind != value_kind::integer && v.kind != value_kind::boolean)
        fail_render("slice indices must be integers or None");
      return as_int(v);
    };
    const std::optional<int64_t> start_arg = bound(1), stop_arg = bound(2), step_arg = bound(3);
    if (obj.kind == value_kind::undefined) fail_render("cannot slice an undefined value");
    if (obj.kind != value_kind::list && obj.kind != value_kind::string)
      fail_render(std::string("'") + kind_name(obj) + "' object is not subscriptable");
    const int64_t step = step_arg.value_or(1);
    if (step == 0) fail_render("slice step cannot be zero");
    auto pick = [&](int64_t size) {
      std::vector<size_t> picked;
      int64_t start, stop;
      if (step > 0) {
        start = start_arg ? *start_arg : 0;
        stop = stop_arg ? *stop_arg : size;
        if (start < 0) start = std::max<int64_t>(start + size, 0);
        if (stop < 0) stop = std::max<int64_t>(stop + size, 0);
        start = std::min(start, size);
        stop = std::min(stop, size);
        for (int64_t k = start; k < stop; k += step) picked.push_back(static_cast<size_t>(k));
      } else {
        start = start_arg ? *start_arg : size - 1;
        stop = stop_arg ? *stop_arg : -1 - size;
        if (start < 0) start = std::max<int64_t>(start + size, -1);
        else start = std::min(start, size - 1);
        if (stop < 0) stop = std::max<int64_t>(stop + size, -1);
        else stop = std::min(stop, size - 1);
        for (int64_t k = start; k > stop; k += step) picked.push_back(static_cast<size_t>(k));
      }
      spend(picked.size());
      return picked;
    };
    switch (obj.kind) {
      case value_kind::list: {
        std::vector<value> out;
        for (size_t k : pick(static_cast<int64_t>(obj.list->items.size()))) out.push_back(obj.list->items[k]);
        return make_list(std::move(out), obj.list->is_tuple);
      }
      case value_kind::string: {
        const std::u32string cps = decode_utf8(obj.str());
        std::u32string out;
        for (size_t k : pick(static_cast<int64_t>(cps.size()))) out.push_back(cps[k]);
        return make_string(encode_utf8(out));
      }
      default: return value::undefined();
    }
  }

  // Python integers do not overflow; ours are 64-bit and refuse to wrap.
  static int64_t checked_add(int64_t a, int64_t b) {
    int64_t r = 0;
    if (__builtin_add_overflow(a, b, &r)) fail_render("integer overflow");
    return r;
  }
  static int64_t checked_sub(int64_t a, int64_t b) {
    int64_t r = 0;
    if (__builtin_sub_overflow(a, b, &r)) fail_render("integer overflow");
    return r;
  }
  static int64_t checked_mul(int64_t a, int64_t b) {
    int64_t r = 0;
    if (__builtin_mul_overflow(a, b, &r)) fail_render("integer overflow");
    return r;
  }

  value binary_op(const std::string& op, const value& a, const value& b) {
    if (a.is_undefined() || b.is_undefined())
      fail_render("undefined value used with operator '" + op + "'");
    const bool numeric = is_number(a) && is_number(b);
    const bool as_float = numeric && (a.kind == value_kind::floating || b.kind == value_kind::floating);
    if (op == "+") {
      if (numeric) {
        if (as_float) return value::floating(as_double(a) + as_double(b));
        return value::integer(checked_add(as_int(a), as_int(b)));
      }
      if (a.kind == value_kind::string && b.kind == value_kind::string) {
        check_size(a.s->size() + b.s->size());
        return make_string(a.str() + b.str());
      }
      if (a.kind == value_kind::list && b.kind == value_kind::list) {
        if (a.list->is_tuple != b.list->is_tuple) fail_render("can only concatenate list to list");
        std::vector<value> items = a.list->items;
        items.insert(items.end(), b.list->items.begin(), b.list->items.end());
        return make_list(std::move(items), a.list->is_tuple);
      }
    } else if (op == "-") {
      if (numeric) {
        if (as_float) return value::floating(as_double(a) - as_double(b));
        return value::integer(checked_sub(as_int(a), as_int(b)));
      }
    } else if (op == "*") {
      if (numeric) {
        if (as_float) return value::floating(as_double(a) * as_double(b));
        return value::integer(checked_mul(as_int(a), as_int(b)));
      }
      const value* seq = (a.kind == value_kind::string || a.kind == value_kind::list) ? &a : &b;
      const value* count = seq == &a ? &b : &a;
      if ((seq->kind == value_kind::string || seq->kind == value_kind::list) &&
          (count->kind == value_kind::integer || count->kind == value_kind::boolean)) {
        const int64_t n = std::max<int64_t>(as_int(*count), 0);
        if (seq->kind == value_kind::string) {
          const auto unit = seq->s->size();
          if (unit != 0 && static_cast<uint64_t>(n) > lim_.max_output_bytes / unit) check_size(lim_.max_output_bytes + 1);
          std::string s;
          s.reserve(unit * static_cast<size_t>(n));
          for (int64_t k = 0; k < n; ++k) s += seq->str();
          return make_string(std::move(s));
        }
        const auto unit = seq->list->items.size();
        if (unit != 0 && static_cast<uint64_t>(n) > lim_.max_steps / unit) spend(lim_.max_steps + 1);
        spend(unit * static_cast<uint64_t>(n));
        std::vector<value> items;
        for (int64_t k = 0; k < n; ++k) items.insert(items.end(), seq->list->items.begin(), seq->list->items.end());
        return make_list(std::move(items), seq->list->is_tuple);
      }
    } else if (op == "/") {
      if (numeric) {
        if (as_double(b) == 0.0) fail_render("division by zero");
        return value::floating(as_double(a) / as_double(b));
      }
    } else if (op == "//" || op == "%") {
      if (numeric) {
        if (as_double(b) == 0.0) fail_render(op == "%" ? "modulo by zero" : "integer division by zero");
        if (as_float) {
          // CPython's float_divmod, including the signs of zero results.
          const double x = as_double(a), y = as_double(b);
          double m = std::fmod(x, y);
          double div = (x - m) / y;
          if (m != 0.0) {
            if ((y < 0) != (m < 0)) { m += y; div -= 1.0; }
          } else {
            m = std::copysign(0.0, y);
          }
          double floordiv;
          if (div != 0.0) {
            floordiv = std::floor(div);
            if (div - floordiv > 0.5) floordiv += 1.0;
          } else {
            floordiv = std::copysign(0.0, x / y);
          }
          return value::floating(op == "%" ? m : floordiv);
        }
        const int64_t x = as_int(a), y = as_int(b);
        if (x == std::numeric_limits<int64_t>::min() && y == -1) fail_render("integer overflow");
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) { m += y; q -= 1; }
        return value::integer(op == "%" ? m : q);
      }
      if (op == "%" && a.kind == value_kind::string)
        fail(chat_template_error_kind::unsupported, "chat template uses printf-style '%' string formatting, which is not supported");
    } else if (op == "**") {
      if (numeric) {
        if (as_float || as_int(b) < 0) {
          const double r = std::pow(as_double(a), as_double(b));
          if (std::isinf(r) && std::isfinite(as_double(a)) && std::isfinite(as_double(b)))
            fail_render("numerical result out of range");  // Python raises OverflowError
          return value::floating(r);
        }
        int64_t base = as_int(a), exp = as_int(b), result = 1;
        while (exp > 0) {
          spend(1);
          if (exp & 1) result = checked_mul(result, base);
          exp >>= 1;
          if (exp > 0) base = checked_mul(base, base);
        }
        return value::integer(result);
      }
    }
    fail_render("unsupported operand types for " + op + ": " + kind_name(a) + " and " + kind_name(b));
  }

  bool compare_op(const std::string& op, const value& a, const value& b) {
    if (op == "==") return equals(a, b);
    if (op == "!=") return !equals(a, b);
    if (op == "in") return contains(b, a);
    if (op == "not in") return !contains(b, a);
    const int c = order(a, b);
    if (op == "<") return c < 0;
    if (op == ">") return c > 0;
    if (op == "<=") return c <= 0;
    return c >= 0;
  }

  // ---- calls ----
  value eval_call(const expr& e) {
    const expr& callee = *e.kids[0];
    if (callee.kind == expr_kind::getattr) {
      value obj = eval(*callee.kids[0]);
      if (obj.kind == value_kind::string || obj.kind == value_kind::dict || obj.kind == value_kind::list) {
        const bool loop_attr = obj.kind == value_kind::dict && obj.dict->is_loop;
        if (!loop_attr) return call_method(obj, callee.name, eval_args(e));
      }
      value fn = get_attribute(obj, callee.name);
      return call_value(fn, eval_args(e), obj);
    }
    value fn = eval(callee);
    return call_value(fn, eval_args(e), value::undefined());
  }

  value call_value(const value& fn, const call_args& args, const value& self) {
    if (fn.kind != value_kind::function) {
      if (fn.is_undefined()) fail_render("called an undefined function");
      fail_render(std::string("'") + kind_name(fn) + "' object is not callable");
    }
    switch (fn.fn) {
      case builtin_function::raise_exception: {
        check_signature("raise_exception", args, {"message"}, true);
        const value* msg = args.get(0, "message");
        fail(chat_template_error_kind::raised, msg ? to_str(*msg) : std::string("raise_exception() called"));
      }
      case builtin_function::namespace_ctor: {
        std::vector<std::pair<value, value>> entries;
        auto put = [&](const value& k, const value& v) {
          if (k.kind != value_kind::string) fail_render("namespace() keys must be strings");
          if (!k.s->empty() && (*k.s)[0] == '_') fail_render("namespace attributes may not start with '_'");
          if (holds_namespace(v)) fail_render("a namespace() object cannot be stored inside a namespace");
          for (auto& [ok, ov] : entries) if (ok.str() == k.str()) { ov = v; return; }
          entries.emplace_back(k, v);
        };
        for (const auto& p : args.positional) {
          if (p.kind != value_kind::dict) fail_render("namespace() positional argument must be a dict");
          for (const auto& [k, v] : p.dict->entries) put(k, v);
        }
        for (const auto& [k, v] : args.keyword) put(value::string(k), v);
        value ns = make_dict(std::move(entries));
        ns.kind = value_kind::ns;
        return ns;
      }
      case builtin_function::dict_ctor: {
        std::vector<std::pair<value, value>> entries;
        for (const auto& p : args.positional) {
          if (p.kind != value_kind::dict) fail_render("dict() positional argument must be a dict");
          entries = p.dict->entries;
        }
        for (const auto& [k, v] : args.keyword) {
          bool replaced = false;
          for (auto& [ok, ov] : entries) if (ok.kind == value_kind::string && ok.str() == k) { ov = v; replaced = true; }
          if (!replaced) entries.emplace_back(value::string(k), v);
        }
        return make_dict(std::move(entries));
      }
      case builtin_function::range: {
        if (!args.keyword.empty()) fail_render("range() takes no keyword arguments");
        std::vector<int64_t> nums;
        for (const auto& p : args.positional) {
          if (p.kind != value_kind::integer && p.kind != value_kind::boolean) fail_render("range() arguments must be integers");
          nums.push_back(as_int(p));
        }
        if (nums.empty() || nums.size() > 3) fail_render("range() takes 1 to 3 arguments");
        const int64_t start = nums.size() == 1 ? 0 : nums[0];
        const int64_t stop = nums.size() == 1 ? nums[0] : nums[1];
        const int64_t step = nums.size() == 3 ? nums[2] : 1;
        if (step == 0) fail_render("range() arg 3 must not be zero");
        // Jinja's sandbox refuses ranges longer than MAX_RANGE = 100000.
        const long double count = step > 0 ? std::ceil((static_cast<long double>(stop) - start) / step)
                                           : std::ceil((static_cast<long double>(start) - stop) / -static_cast<long double>(step));
        if (count > 100000) fail(chat_template_error_kind::limit, "chat template range() is too big (more than 100000 items)");
        std::vector<value> items;
        for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) items.push_back(value::integer(k));
        return make_list(std::move(items));
      }
      case builtin_function::strftime_now: {
        check_signature("strftime_now", args, {"format"}, true);
        const value* fmt = args.get(0, "format");
        if (!fmt || fmt->kind != value_kind::string) fail_render("strftime_now() needs a format string");
        if (fmt->s->size() > 256) fail_render("strftime_now() format is too long");
        // transformers formats datetime.now(), a naive datetime: %z and %Z are empty, %f is the
        // microsecond (always 0 with our one-second clock). Everything else is C strftime, as in CPython.
        std::string c_format;
        const std::string& f = fmt->str();
        for (size_t k = 0; k < f.size(); ++k) {
          if (f[k] == '%' && k + 1 < f.size()) {
            const char conv = f[k + 1];
            ++k;
            if (conv == 'f') c_format += "000000";
            else if (conv != 'z' && conv != 'Z') { c_format += '%'; c_format += conv; }
          } else {
            c_format += f[k];
          }
        }
        const std::time_t t = static_cast<std::time_t>(now_);
        std::tm tm{};
        gmtime_r(&t, &tm);
        std::string buf(8192, '\0');
        const size_t n = c_format.empty() ? 0 : std::strftime(buf.data(), buf.size(), c_format.c_str(), &tm);
        buf.resize(n);
        return make_string(std::move(buf));
      }
      case builtin_function::bound_method: return call_method(fn.list->items[0], *fn.s, args);
      case builtin_function::loop_cycle: {
        if (args.positional.empty()) fail_render("loop.cycle() needs at least one argument");
        const value* idx = self.kind == value_kind::dict ? get_attr_ptr(self, "index0") : nullptr;
        const int64_t i = idx ? idx->i : 0;
        return args.positional[static_cast<size_t>(i % static_cast<int64_t>(args.positional.size()))];
      }
    }
    fail_render("unknown function");
  }

  static const value* get_attr_ptr(const value& obj, const char* name) {
    for (const auto& [k, v] : obj.dict->entries)
      if (k.kind == value_kind::string && k.str() == name) return &v;
    return nullptr;
  }

  // ---- string helpers ----
  static std::u32string strip_set(const value* chars, bool& whitespace) {
    whitespace = !chars || chars->kind == value_kind::none;
    if (whitespace) return {};
    if (chars->kind != value_kind::string) fail_render("strip arg must be None or str");
    return decode_utf8(chars->str());
  }
  static std::string py_strip(const std::string& s, const value* chars, bool left, bool right) {
    bool whitespace = false;
    const std::u32string set = strip_set(chars, whitespace);
    auto strip_it = [&](char32_t c) { return whitespace ? is_py_space(c) : set.find(c) != std::u32string::npos; };
    if (whitespace && is_ascii(s)) {
      size_t b = 0, e = s.size();
      if (left) while (b < e && is_py_space(static_cast<unsigned char>(s[b]))) ++b;
      if (right) while (e > b && is_py_space(static_cast<unsigned char>(s[e - 1]))) --e;
      return s.substr(b, e - b);
    }
    const std::u32string cps = decode_utf8(s);
    size_t b = 0, e = cps.size();
    if (left) while (b < e && strip_it(cps[b])) ++b;
    if (right) while (e > b && strip_it(cps[e - 1])) --e;
    return encode_utf8(std::u32string_view(cps).substr(b, e - b));
  }
  static std::string map_case(const std::string& s, char32_t (*fn)(char32_t)) {
    std::string out;
    for (char32_t c : decode_utf8(s)) {
      if (c == 0xDF && fn == to_upper_cp) out += "SS";  // Python's special casing of sharp s
      else append_utf8(out, fn(c));
    }
    return out;
  }
  static std::string py_capitalize(const std::string& s) {
    std::u32string cps = decode_utf8(s);
    for (size_t k = 0; k < cps.size(); ++k) cps[k] = k == 0 ? to_upper_cp(cps[k]) : to_lower_cp(cps[k]);
    return encode_utf8(cps);
  }
  // Python str.title(): upper-case a cased character after an uncased one, lower-case the rest.
  static std::string py_title(const std::string& s) {
    std::u32string cps = decode_utf8(s);
    bool prev_cased = false;
    for (auto& c : cps) {
      const bool cased = is_cased(c);
      c = cased ? (prev_cased ? to_lower_cp(c) : to_upper_cp(c)) : c;
      prev_cased = cased;
    }
    return encode_utf8(cps);
  }
  // Jinja's title filter: words start after '-', whitespace, '(', '{', '[' or '<'.
  static std::string jinja_title(const std::string& s) {
    std::u32string cps = decode_utf8(s);
    bool word_start = true;
    for (auto& c : cps) {
      const bool sep = c == '-' || is_py_space(c) || c == '(' || c == '{' || c == '[' || c == '<';
      if (sep) { word_start = true; continue; }
      c = word_start ? to_upper_cp(c) : to_lower_cp(c);
      word_start = false;
    }
    return encode_utf8(cps);
  }
  value py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
    std::string out;
    int64_t done = 0;
    if (from.empty()) {
      const std::u32string cps = decode_utf8(s);
      for (size_t k = 0; k <= cps.size(); ++k) {
        if (count < 0 || done < count) { out += to; ++done; }
        if (k < cps.size()) append_utf8(out, cps[k]);
        check_size(out.size());
      }
      return make_string(std::move(out));
    }
    size_t pos = 0;
    while (count < 0 || done < count) {
      const size_t hit = s.find(from, pos);
      if (hit == std::string::npos) break;
      out.append(s, pos, hit - pos);
      out += to;
      check_size(out.size());
      pos = hit + from.size();
      ++done;
    }
    out.append(s, pos, std::string::npos);
    return make_string(std::move(out));
  }
  value py_split(const std::string& s, const value* sep, int64_t maxsplit) {
    std::vector<value> parts;
    if (!sep || sep->kind == value_kind::none) {
      const std::u32string cps = decode_utf8(s);
      size_t k = 0;
      while (true) {
        while (k < cps.size() && is_py_space(cps[k])) ++k;
        if (k >= cps.size()) break;
        if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
          parts.push_back(value::string(encode_utf8(std::u32string_view(cps).substr(k))));  // keeps trailing space
          break;
        }
        size_t e = k;
        while (e < cps.size() && !is_py_space(cps[e])) ++e;
        parts.push_back(value::string(encode_utf8(std::u32string_view(cps).substr(k, e - k))));
        k = e;
      }
      return make_list(std::move(parts));
    }
    if (sep->kind != value_kind::string) fail_render("split() separator must be a string");
    const std::string& d = sep->str();
    if (d.empty()) fail_render("empty separator");
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      const size_t hit = s.find(d, pos);
      if (hit == std::string::npos) break;
      parts.push_back(value::string(s.substr(pos, hit - pos)));
      spend(1);
      pos = hit + d.size();
    }
    parts.push_back(value::string(s.substr(pos)));
    return make_list(std::move(parts));
  }

  static const std::string& need_string(const value* v, const char* what) {
    if (!v || v->kind != value_kind::string) fail_render(std::string(what) + " must be a string");
    return v->str();
  }
  static int64_t int_arg(const value* v, int64_t fallback) {
    if (!v || v->kind == value_kind::none) return fallback;
    if (v->kind != value_kind::integer && v->kind != value_kind::boolean) fail_render("expected an integer argument");
    return as_int(*v);
  }
  bool prefix_match(const std::string& s, const value* arg, bool suffix) {
    if (!arg) fail_render(std::string(suffix ? "endswith" : "startswith") + "() takes at least 1 argument");
    auto test = [&](const value& p) {
      const std::string& x = need_string(&p, "prefix");
      if (x.size() > s.size()) return false;
      return suffix ? s.compare(s.size() - x.size(), x.size(), x) == 0 : s.compare(0, x.size(), x) == 0;
    };
    if (arg->kind == value_kind::list && arg->list->is_tuple) {
      for (const auto& p : arg->list->items) if (test(p)) return true;
      return false;
    }
    return test(*arg);
  }

  // Jinja's ignore_case(): strings compare lower-cased unless case_sensitive is set.
  value sort_key(const value& v, bool case_sensitive) {
    if (case_sensitive || v.kind != value_kind::string) return v;
    return make_string(map_case(v.str(), to_lower_cp));
  }

  // Python str.splitlines(): \n, \r\n, \r, \v, \f, \x1c-\x1e, \x85, U+2028, U+2029 end lines.
  static std::vector<std::string> py_splitlines(const std::string& s) {
    std::vector<std::string> lines;
    const std::u32string cps = decode_utf8(s);
    std::u32string cur;
    for (size_t k = 0; k < cps.size(); ++k) {
      const char32_t c = cps[k];
      const bool boundary = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E) || c == 0x85 ||
                            c == 0x2028 || c == 0x2029;
      if (!boundary) { cur.push_back(c); continue; }
      if (c == '\r' && k + 1 < cps.size() && cps[k + 1] == '\n') ++k;
      lines.push_back(encode_utf8(cur));
      cur.clear();
    }
    if (!cur.empty()) lines.push_back(encode_utf8(cur));
    return lines;
  }

  // Positional-only parameter lists of the str and dict methods implemented (split also takes
  // keywords); optional start/end arguments of find/startswith/... are not supported.
  static const std::map<std::string, std::vector<std::string>>* method_table(const value& obj) {
    static const std::map<std::string, std::vector<std::string>> string_methods = {
        {"strip", {"chars"}}, {"lstrip", {"chars"}}, {"rstrip", {"chars"}}, {"upper", {}}, {"lower", {}}, {"title", {}},
        {"capitalize", {}}, {"startswith", {"prefix"}}, {"endswith", {"suffix"}}, {"split", {"sep", "maxsplit"}},
        {"replace", {"old", "new", "count"}}, {"find", {"sub"}}, {"count", {"sub"}}, {"index", {"sub"}},
        {"join", {"iterable"}}, {"isdigit", {}}, {"isspace", {}}, {"isalpha", {}}, {"isupper", {}}, {"islower", {}}};
    static const std::map<std::string, std::vector<std::string>> dict_methods = {
        {"items", {}}, {"keys", {}}, {"values", {}}, {"get", {"key", "default"}}};
    if (obj.kind == value_kind::string) return &string_methods;
    if (obj.kind == value_kind::dict && !obj.dict->is_loop) return &dict_methods;
    return nullptr;
  }
  static bool has_method(const value& obj, const std::string& name) {
    const auto* table = method_table(obj);
    return table && table->count(name);
  }
  static void check_method_signature(const value& obj, const std::string& name, const call_args& args) {
    const auto* table = method_table(obj);
    if (!table) return;
    const auto it = table->find(name);
    if (it != table->end()) check_signature(name, args, it->second, name == "split");
  }

  value call_method(const value& obj, const std::string& name, const call_args& args) {
    if (obj.kind == value_kind::string || obj.kind == value_kind::dict) check_method_signature(obj, name, args);
    if (obj.kind == value_kind::string) {
      const std::string& s = obj.str();
      spend(1 + s.size() / 256);
      if (name == "strip") return make_string(py_strip(s, args.get(0, "chars"), true, true));
      if (name == "lstrip") return make_string(py_strip(s, args.get(0, "chars"), true, false));
      if (name == "rstrip") return make_string(py_strip(s, args.get(0, "chars"), false, true));
      if (name == "upper") return make_string(map_case(s, to_upper_cp));
      if (name == "lower") return make_string(map_case(s, to_lower_cp));
      if (name == "title") return make_string(py_title(s));
      if (name == "capitalize") return make_string(py_capitalize(s));
      if (name == "startswith") return value::boolean(prefix_match(s, args.get(0, "prefix"), false));
      if (name == "endswith") return value::boolean(prefix_match(s, args.get(0, "suffix"), true));
      if (name == "split") return py_split(s, args.get(0, "sep"), int_arg(args.get(1, "maxsplit"), -1));
      if (name == "replace")
        return py_replace(s, need_string(args.get(0, "old"), "replace() old"), need_string(args.get(1, "new"), "replace() new"),
                          int_arg(args.get(2, "count"), -1));
      if (name == "find" || name == "count" || name == "index") {
        const std::string& sub = need_string(args.get(0, "sub"), std::string(name + "() argument").c_str());
        if (name == "count") {
          if (sub.empty()) return value::integer(static_cast<int64_t>(count_code_points(s)) + 1);
          int64_t n = 0;
          for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
          return value::integer(n);
        }
        const size_t hit = s.find(sub);
        if (hit == std::string::npos) {
          if (name == "index") fail_render("substring not found");
          return value::integer(-1);
        }
        return value::integer(static_cast<int64_t>(count_code_points(std::string_view(s).substr(0, hit))));
      }
      if (name == "join") {
        const value* items = args.get(0, "iterable");
        if (!items) fail_render("join() takes exactly one argument");
        std::string out;
        bool first = true;
        for (const auto& item : iterate(*items)) {
          if (item.kind != value_kind::string) fail_render(std::string("join() expected str instance, ") + kind_name(item) + " found");
          if (!first) out += s;
          first = false;
          out += item.str();
          check_size(out.size());
        }
        return make_string(std::move(out));
      }
      if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isupper" || name == "islower") {
        const std::u32string cps = decode_utf8(s);
        if (cps.empty()) return value::boolean(false);
        bool any_cased = false;
        for (char32_t c : cps) {
          if (name == "isdigit" && !(c >= '0' && c <= '9')) return value::boolean(false);
          if (name == "isspace" && !is_py_space(c)) return value::boolean(false);
          if (name == "isalpha" && !is_cased(c)) return value::boolean(false);
          if (name == "isupper" && to_upper_cp(c) != c) return value::boolean(false);
          if (name == "islower" && to_lower_cp(c) != c) return value::boolean(false);
          any_cased = any_cased || is_cased(c);
        }
        return value::boolean(name == "isupper" || name == "islower" ? any_cased : true);
      }
    } else if (obj.kind == value_kind::dict) {
      spend(1 + obj.dict->entries.size());
      if (name == "items") {
        std::vector<value> pairs;
        for (const auto& [k, v] : obj.dict->entries) pairs.push_back(value::make_list({k, v}, true));
        return make_list(std::move(pairs));
      }
      if (name == "keys" || name == "values") {
        std::vector<value> out;
        for (const auto& [k, v] : obj.dict->entries) out.push_back(name == "keys" ? k : v);
        return make_list(std::move(out));
      }
      if (name == "get") {
        const value* key = args.get(0, "key");
        if (!key) fail_render("get() needs a key");
        const value* v = find_in_dict(*obj.dict, *key);
        if (v) return *v;
        const value* fallback = args.get(1, "default");
        return fallback ? *fallback : value::none();
      }
      const value attr = get_attribute(obj, name);
      if (attr.kind == value_kind::function) return call_value(attr, args, obj);
    }
    fail_render(std::string("'") + kind_name(obj) + "' object has no method '" + name + "'");
  }

  // Python's argument checks: too many positional arguments, unknown or repeated keywords.
  static void check_signature(const std::string& what, const call_args& args, const std::vector<std::string>& params,
                              bool keywords_allowed) {
    if (args.positional.size() > params.size())
      fail_render(what + "() takes at most " + std::to_string(params.size()) + " argument(s), " +
                  std::to_string(args.positional.size()) + " given");
    for (const auto& [k, unused] : args.keyword) {
      const auto it = std::find(params.begin(), params.end(), k);
      if (!keywords_allowed || it == params.end()) fail_render(what + "() got an unexpected keyword argument '" + k + "'");
      if (static_cast<size_t>(it - params.begin()) < args.positional.size())
        fail_render(what + "() got multiple values for argument '" + k + "'");
    }
  }

  // Parameters after the subject, as Jinja's filter functions declare them. Filters that take
  // arbitrary arguments (map, select, ...) check them where they are used.
  static const std::vector<std::string>* filter_parameters(const std::string& name) {
    static const std::map<std::string, std::vector<std::string>> table = {
        {"trim", {"chars"}}, {"length", {}}, {"count", {}}, {"upper", {}}, {"lower", {}}, {"capitalize", {}},
        {"title", {}}, {"string", {}}, {"safe", {}}, {"list", {}}, {"abs", {}}, {"items", {}}, {"reverse", {}},
        {"escape", {}}, {"e", {}}, {"first", {}}, {"last", {}},
        {"tojson", {"ensure_ascii", "indent", "separators", "sort_keys"}},
        {"default", {"default_value", "boolean"}}, {"d", {"default_value", "boolean"}}, {"join", {"d", "attribute"}},
        {"replace", {"old", "new", "count"}}, {"int", {"default", "base"}}, {"float", {"default"}},
        {"unique", {"case_sensitive", "attribute"}}, {"sort", {"reverse", "case_sensitive", "attribute"}},
        {"sum", {"attribute", "start"}}, {"min", {"case_sensitive", "attribute"}}, {"max", {"case_sensitive", "attribute"}},
        {"indent", {"width", "first", "blank"}}};
    const auto it = table.find(name);
    return it == table.end() ? nullptr : &it->second;
  }

  // ---- filters ----
  value apply_filter(const std::string& name, const value& v, const call_args& args) {
    spend(1);
    if (const auto* params = filter_parameters(name)) check_signature(name, args, *params, true);
    if (name == "trim") {
      return make_string(py_strip(to_str(v), args.get(0, "chars"), true, true));
    }
    if (name == "length" || name == "count") return value::integer(static_cast<int64_t>(length_of_value(v)));
    if (name == "upper") return make_string(map_case(to_str(v), to_upper_cp));
    if (name == "lower") return make_string(map_case(to_str(v), to_lower_cp));
    if (name == "capitalize") return make_string(py_capitalize(to_str(v)));
    if (name == "title") return make_string(jinja_title(to_str(v)));
    if (name == "string") return v.kind == value_kind::string ? v : make_string(to_str(v));
    if (name == "safe") return v;
    if (name == "tojson") {
      json_style style;
      if (const value* ascii = args.get(0, "ensure_ascii")) style.ensure_ascii = truthy(*ascii);
      if (const value* indent = args.get(1, "indent"); indent && indent->kind != value_kind::none) {
        if (indent->kind == value_kind::string) style.indent = indent->str();
        else style.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(int_arg(indent, 0), 0, 64)), ' ');
        style.item_separator = ",";
      }
      if (const value* sep = args.get(2, "separators"); sep && sep->kind != value_kind::none) {
        if (sep->kind != value_kind::list || sep->list->items.size() != 2) fail_render("tojson separators must be a pair of strings");
        style.item_separator = need_string(&sep->list->items[0], "separator");
        style.key_separator = need_string(&sep->list->items[1], "separator");
      }
      if (const value* sort = args.get(3, "sort_keys")) style.sort_keys = truthy(*sort);
      std::string out;
      append_json(out, v, style, 0);
      return make_string(std::move(out));
    }
    if (name == "default" || name == "d") {
      const value* fallback = args.get(0, "default_value");
      const value* boolean = args.get(1, "boolean");
      const bool use_fallback = v.is_undefined() || (boolean && truthy(*boolean) && !truthy(v));
      if (use_fallback) return fallback ? *fallback : value::string("");
      return v;
    }
    if (name == "join") {
      const value* sep = args.get(0, "d");
      const value* attribute = args.get(1, "attribute");
      const std::string d = sep ? to_str(*sep) : std::string();
      std::string out;
      bool first = true;
      for (const auto& item : iterate(v)) {
        if (!first) out += d;
        first = false;
        out += to_str(attribute ? get_item_or_attr(item, *attribute) : item);
        check_size(out.size());
      }
      return make_string(std::move(out));
    }
    if (name == "replace") {
      return py_replace(to_str(v), to_str(*need(args.get(0, "old"), "replace old")), to_str(*need(args.get(1, "new"), "replace new")),
                        int_arg(args.get(2, "count"), -1));
    }
    if (name == "first" || name == "last") {
      std::vector<value> items = iterate(v);
      if (items.empty()) return value::undefined();
      return name == "first" ? items.front() : items.back();
    }
    if ((name == "int" || name == "float" || name == "indent") && v.is_undefined())
      fail_render("'" + name + "' filter applied to an undefined value");
    if (name == "int") return to_int(v, args);
    if (name == "float") {
      const value* fallback = args.get(0, "default");
      if (is_number(v)) return value::floating(as_double(v));
      if (v.kind == value_kind::string) {
        if (const auto d = parse_py_float(v.str())) return value::floating(*d);
      }
      return fallback ? *fallback : value::floating(0.0);
    }
    if (name == "list") return make_list(iterate(v));
    if (name == "abs") {
      if (v.kind == value_kind::floating) return value::floating(std::fabs(v.f));
      if (!is_number(v)) fail_render(std::string("bad operand type for abs(): ") + kind_name(v));
      if (as_int(v) == std::numeric_limits<int64_t>::min()) fail_render("integer overflow");
      return value::integer(std::llabs(as_int(v)));
    }
    if (name == "items") {
      if (v.is_undefined()) return make_list({});
      if (v.kind != value_kind::dict) fail_render("items filter needs a mapping");
      return call_method(v, "items", {});
    }
    if (name == "reverse") {
      if (v.kind == value_kind::string) {
        std::u32string cps = decode_utf8(v.str());
        std::reverse(cps.begin(), cps.end());
        return make_string(encode_utf8(cps));
      }
      std::vector<value> items = iterate(v);
      std::reverse(items.begin(), items.end());
      return make_list(std::move(items));
    }
    if (name == "unique") {
      const bool case_sensitive = args.get(0, "case_sensitive") && truthy(*args.get(0, "case_sensitive"));
      const value* attribute = args.get(1, "attribute");
      std::vector<value> out, keys;
      for (const auto& item : iterate(v)) {
        const value key = sort_key(attribute ? get_item_or_attr(item, *attribute) : item, case_sensitive);
        bool seen = false;
        for (const auto& o : keys) if (equals(o, key)) { seen = true; break; }
        if (!seen) { out.push_back(item); keys.push_back(key); }
      }
      return make_list(std::move(out));
    }
    if (name == "sort") {
      const bool reverse = args.get(0, "reverse") && truthy(*args.get(0, "reverse"));
      const bool case_sensitive = args.get(1, "case_sensitive") && truthy(*args.get(1, "case_sensitive"));
      const value* attribute = args.get(2, "attribute");
      std::vector<std::pair<value, value>> keyed;
      for (const auto& item : iterate(v))
        keyed.emplace_back(sort_key(attribute ? get_item_or_attr(item, *attribute) : item, case_sensitive), item);
      std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
        return reverse ? order(b.first, a.first) < 0 : order(a.first, b.first) < 0;
      });
      std::vector<value> out;
      for (auto& [k, item] : keyed) out.push_back(std::move(item));
      return make_list(std::move(out));
    }
    if (name == "sum") {
      const value* attribute = args.get(0, "attribute");
      value total = args.get(1, "start") ? *args.get(1, "start") : value::integer(0);
      for (const auto& item : iterate(v)) total = binary_op("+", total, attribute ? get_item_or_attr(item, *attribute) : item);
      return total;
    }
    if (name == "min" || name == "max") {
      const bool case_sensitive = args.get(0, "case_sensitive") && truthy(*args.get(0, "case_sensitive"));
      const value* attribute = args.get(1, "attribute");
      std::vector<value> items = iterate(v);
      if (items.empty()) return value::undefined();
      auto key = [&](const value& item) { return sort_key(attribute ? get_item_or_attr(item, *attribute) : item, case_sensitive); };
      value best = items[0];
      value best_key = key(best);
      for (size_t k = 1; k < items.size(); ++k) {
        const value item_key = key(items[k]);
        const int c = order(item_key, best_key);
        if (name == "min" ? c < 0 : c > 0) { best = items[k]; best_key = item_key; }
      }
      return best;
    }
    // Jinja's map/select/... yield nothing for a falsy input (`if value:`), even a non-iterable one.
    if ((name == "map" || name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") && !truthy(v))
      return make_list({});
    if (name == "map") {
      std::vector<value> out;
      const value* attribute = nullptr;
      for (const auto& [k, a] : args.keyword) if (k == "attribute") attribute = &a;
      if (attribute) {
        const value* fallback = nullptr;
        for (const auto& [k, a] : args.keyword) if (k == "default") fallback = &a;
        for (const auto& item : iterate(v)) {
          value x = get_item_or_attr(item, *attribute);
          out.push_back(x.is_undefined() && fallback ? *fallback : x);
        }
        return make_list(std::move(out));
      }
      if (args.positional.empty()) fail_render("map() needs a filter name or attribute=");
      const std::string filter_name = need_string(&args.positional[0], "map() filter name");
      call_args rest;
      rest.positional.assign(args.positional.begin() + 1, args.positional.end());
      rest.keyword = args.keyword;
      for (const auto& item : iterate(v)) out.push_back(apply_filter(filter_name, item, rest));
      return make_list(std::move(out));
    }
    if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
      const bool by_attr = name == "selectattr" || name == "rejectattr";
      const bool keep_when = name == "select" || name == "selectattr";
      size_t first_arg = 0;
      const value* attribute = nullptr;
      if (by_attr) {
        if (args.positional.empty()) fail_render(name + "() needs an attribute name");
        attribute = &args.positional[0];
        first_arg = 1;
      }
      std::string test_name;
      call_args test_args;
      if (args.positional.size() > first_arg) {
        test_name = need_string(&args.positional[first_arg], "test name");
        test_args.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(first_arg) + 1, args.positional.end());
      }
      std::vector<value> out;
      for (const auto& item : iterate(v)) {
        const value subject = attribute ? get_item_or_attr(item, *attribute) : item;
        const bool ok = test_name.empty() ? truthy(subject) : apply_test(test_name, subject, test_args);
        if (ok == keep_when) out.push_back(item);
      }
      return make_list(std::move(out));
    }
    if (name == "indent") {
      // Jinja's do_indent: lines = (s + "\n").splitlines(); indent all but the first (and blank
      // lines only when blank=True), rejoined with "\n".
      const value* width_arg = args.get(0, "width");
      const bool first = args.get(1, "first") && truthy(*args.get(1, "first"));
      const bool blank = args.get(2, "blank") && truthy(*args.get(2, "blank"));
      const std::string pad = width_arg && width_arg->kind == value_kind::string
                                  ? width_arg->str()
                                  : std::string(static_cast<size_t>(std::clamp<int64_t>(int_arg(width_arg, 4), 0, 256)), ' ');
      const std::vector<std::string> lines = py_splitlines(to_str(v) + "\n");
      std::string out;
      for (size_t k = 0; k < lines.size(); ++k) {
        if (k > 0) {
          out += '\n';
          if (blank || !lines[k].empty()) out += pad;
        }
        out += lines[k];
        check_size(out.size());
      }
      if (first) out = pad + out;
      return make_string(std::move(out));
    }
    if (name == "escape" || name == "e") {
      std::string out;
      for (char c : to_str(v)) {
        switch (c) {
          case '&': out += "&amp;"; break;
          case '<': out += "&lt;"; break;
          case '>': out += "&gt;"; break;
          case '"': out += "&#34;"; break;
          case '\'': out += "&#39;"; break;
          default: out.push_back(c);
        }
      }
      return make_string(std::move(out));
    }
    if (is_standard_jinja_filter(name))
      fail(chat_template_error_kind::unsupported, "chat template uses the filter '" + name + "', which is not supported");
    fail_render("no filter named '" + name + "'");
  }

  static const value* need(const value* v, const char* what) {
    if (!v) fail_render(std::string(what) + " argument is missing");
    return v;
  }

  value get_item_or_attr(const value& item, const value& attribute) {
    // Jinja's attribute="a.b" walks dotted paths; integer parts index lists.
    if (attribute.kind != value_kind::string) return get_item(item, attribute);
    value cur = item;
    const std::string& path = attribute.str();
    size_t start = 0;
    while (true) {
      const size_t dot = path.find('.', start);
      const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      if (cur.is_undefined()) return cur;
      int64_t idx = 0;
      auto r = std::from_chars(part.data(), part.data() + part.size(), idx);
      if (!part.empty() && r.ec == std::errc() && r.ptr == part.data() + part.size() && cur.kind == value_kind::list)
        cur = get_item(cur, value::integer(idx));
      else if (cur.kind == value_kind::dict || cur.kind == value_kind::ns)
        cur = get_item(cur, value::string(part));
      else
        cur = value::undefined();
      if (dot == std::string::npos) return cur;
      start = dot + 1;
    }
  }

  // Removes '_' between digits (Python numeric literal syntax); nullopt when one is misplaced.
  static std::optional<std::string> drop_digit_underscores(const std::string& t) {
    std::string out;
    for (size_t k = 0; k < t.size(); ++k) {
      if (t[k] != '_') { out.push_back(t[k]); continue; }
      if (k == 0 || k + 1 == t.size() || !std::isxdigit(static_cast<unsigned char>(t[k - 1])) ||
          !std::isxdigit(static_cast<unsigned char>(t[k + 1])))
        return std::nullopt;
    }
    return out;
  }

  // Python int(s, base) for bases 0 and 2..36, limited to 64 bits.
  static std::optional<int64_t> parse_py_int(const std::string& s, int64_t base) {
    if (base != 0 && (base < 2 || base > 36)) return std::nullopt;
    const auto cleaned = drop_digit_underscores(py_strip(s, nullptr, true, true));
    if (!cleaned) return std::nullopt;
    std::string t = *cleaned;
    bool negative = false;
    if (!t.empty() && (t[0] == '+' || t[0] == '-')) {
      negative = t[0] == '-';
      t.erase(0, 1);
    }
    auto prefix_base = [&](const std::string& x) -> int {
      if (x.size() < 2 || x[0] != '0') return 0;
      const char p = static_cast<char>(std::tolower(static_cast<unsigned char>(x[1])));
      return p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
    };
    const int detected = prefix_base(t);
    if (base == 0) {
      base = detected ? detected : 10;
      if (detected) t.erase(0, 2);
      else if (t.size() > 1 && t[0] == '0' && t.find_first_not_of('0') != std::string::npos) return std::nullopt;
    } else if (detected == base) {
      t.erase(0, 2);
    }
    if (t.empty()) return std::nullopt;
    uint64_t magnitude = 0;
    auto r = std::from_chars(t.data(), t.data() + t.size(), magnitude, static_cast<int>(base));
    const bool too_big = r.ec == std::errc::result_out_of_range ||
                         (r.ec == std::errc() && magnitude > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) + (negative ? 1 : 0));
    if (too_big && r.ptr == t.data() + t.size()) fail_render("integer overflow (integers are 64-bit here, Python's are unbounded)");
    if (r.ec != std::errc() || r.ptr != t.data() + t.size()) return std::nullopt;
    return negative ? static_cast<int64_t>(0 - magnitude) : static_cast<int64_t>(magnitude);
  }

  // Python float(s): decimal digits with optional fraction and exponent, or inf/infinity/nan.
  static std::optional<double> parse_py_float(const std::string& s) {
    const auto cleaned = drop_digit_underscores(py_strip(s, nullptr, true, true));
    if (!cleaned || cleaned->empty()) return std::nullopt;
    const std::string& t = *cleaned;
    size_t k = (t[0] == '+' || t[0] == '-') ? 1 : 0;
    std::string word;
    for (size_t m = k; m < t.size(); ++m) word.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(t[m]))));
    if (word == "inf" || word == "infinity") return t[0] == '-' ? -HUGE_VAL : HUGE_VAL;
    if (word == "nan") return std::numeric_limits<double>::quiet_NaN();
    size_t digits = 0;
    while (k < t.size() && std::isdigit(static_cast<unsigned char>(t[k]))) { ++k; ++digits; }
    if (k < t.size() && t[k] == '.') {
      ++k;
      while (k < t.size() && std::isdigit(static_cast<unsigned char>(t[k]))) { ++k; ++digits; }
    }
    if (digits == 0) return std::nullopt;
    if (k < t.size() && (t[k] == 'e' || t[k] == 'E')) {
      ++k;
      if (k < t.size() && (t[k] == '+' || t[k] == '-')) ++k;
      size_t exp_digits = 0;
      while (k < t.size() && std::isdigit(static_cast<unsigned char>(t[k]))) { ++k; ++exp_digits; }
      if (exp_digits == 0) return std::nullopt;
    }
    if (k != t.size()) return std::nullopt;
    return std::strtod(t.c_str(), nullptr);
  }

  value to_int(const value& v, const call_args& args) {
    const value* fallback = args.get(0, "default");
    const int64_t base = int_arg(args.get(1, "base"), 10);
    const value def = fallback ? *fallback : value::integer(0);
    if (v.kind == value_kind::integer) return v;
    if (v.kind == value_kind::boolean) return value::integer(v.b);
    if (v.kind == value_kind::floating) {
      if (!std::isfinite(v.f) || std::fabs(v.f) >= 9.2e18) return def;
      return value::integer(static_cast<int64_t>(v.f));
    }
    if (v.kind == value_kind::string) {
      // Jinja: int(s, base), else int(float(s)), else the default.
      if (const auto i = parse_py_int(v.str(), base)) return value::integer(*i);
      if (const auto d = parse_py_float(v.str()); d && std::isfinite(*d) && std::fabs(*d) < 9.2e18)
        return value::integer(static_cast<int64_t>(*d));
    }
    return def;
  }

  // ---- tests ----
  bool apply_test(const std::string& name, const value& v, const call_args& args) {
    spend(1);
    // Jinja's tests take the subject plus at most one positional argument (operator.* functions).
    const bool takes_argument = name == "divisibleby" || name == "in" || name == "sameas" || name == "eq" ||
                                name == "equalto" || name == "==" || name == "ne" || name == "!=" || name == "lt" ||
                                name == "lessthan" || name == "<" || name == "le" || name == "<=" || name == "gt" ||
                                name == "greaterthan" || name == ">" || name == "ge" || name == ">=";
    if (is_known_test(name)) {
      static const std::vector<std::string> one = {"value"}, none;
      check_signature("test " + name, args, takes_argument ? one : none, false);
    }
    const value* arg = args.get(0, "value");
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.kind == value_kind::none;
    if (name == "string") return v.kind == value_kind::string;
    if (name == "number") return is_number(v);
    if (name == "integer") return v.kind == value_kind::integer;
    if (name == "float") return v.kind == value_kind::floating;
    if (name == "boolean") return v.kind == value_kind::boolean;
    if (name == "true") return v.kind == value_kind::boolean && v.b;
    if (name == "false") return v.kind == value_kind::boolean && !v.b;
    if (name == "mapping") return v.kind == value_kind::dict;
    if (name == "sequence") return v.kind == value_kind::string || v.kind == value_kind::list || v.kind == value_kind::dict;
    if (name == "iterable") return v.kind == value_kind::string || v.kind == value_kind::list || v.kind == value_kind::dict || v.is_undefined();
    if (name == "callable") return v.kind == value_kind::function || v.is_undefined();  // Undefined has __call__
    if (name == "lower" || name == "upper") {
      // str(value).islower() / isupper(): at least one cased character and none of the other case.
      bool any_cased = false;
      for (char32_t c : decode_utf8(to_str(v))) {
        if (name == "lower" ? to_lower_cp(c) != c : to_upper_cp(c) != c) return false;
        any_cased = any_cased || is_cased(c);
      }
      return any_cased;
    }
    if (name == "even" || name == "odd") {
      if (v.kind != value_kind::integer && v.kind != value_kind::boolean) fail_render("even/odd test needs an integer");
      const bool even = as_int(v) % 2 == 0;
      return name == "even" ? even : !even;
    }
    if (name == "divisibleby") {
      const value& d = *need(arg, "divisibleby");
      if (!is_number(v) || !is_number(d)) fail_render("divisibleby needs numbers");
      const value rem = binary_op("%", v, d);
      return rem.kind == value_kind::floating ? rem.f == 0.0 : rem.i == 0;
    }
    if (name == "eq" || name == "equalto" || name == "==") return equals(v, *need(arg, name.c_str()));
    if (name == "ne" || name == "!=") return !equals(v, *need(arg, name.c_str()));
    if (name == "lt" || name == "lessthan" || name == "<") return order(v, *need(arg, name.c_str())) < 0;
    if (name == "le" || name == "<=") return order(v, *need(arg, name.c_str())) <= 0;
    if (name == "gt" || name == "greaterthan" || name == ">") return order(v, *need(arg, name.c_str())) > 0;
    if (name == "ge" || name == ">=") return order(v, *need(arg, name.c_str())) >= 0;
    if (name == "in") return contains(*need(arg, "in"), v);
    if (name == "sameas") {
      const value& o = *need(arg, "sameas");
      if (v.kind != o.kind) return false;
      if (v.kind == value_kind::none || v.kind == value_kind::undefined) return true;
      if (v.kind == value_kind::boolean) return v.b == o.b;
      if (v.kind == value_kind::ns || v.kind == value_kind::dict) return v.dict == o.dict;
      if (v.kind == value_kind::list) return v.list == o.list;
      return equals(v, o);
    }
    if (is_standard_jinja_test(name))
      fail(chat_template_error_kind::unsupported, "chat template uses the test '" + name + "', which is not supported");
    fail_render("no test named '" + name + "'");
  }

  const limits& lim_;
  int64_t now_;
  std::string out_;
  uint64_t steps_ = 0;
  size_t depth_ = 0;
  std::vector<frame> frames_;
};

}  // namespace

std::string program::render(const context& variables, const limits& bounds, int64_t now_unix_seconds) const {
  renderer r(bounds, now_unix_seconds);
  return r.run(*root_, variables);
}

}  // namespace tessera::jinja
