#include "engine/text/jinja/lexer.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <cstring>

#include "engine/text/jinja/errors.hpp"
#include "engine/text/jinja/python_str.hpp"

namespace tessera::jinja::detail {

namespace {

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
          const bool only_ws =
              line_start < text.size() && std::all_of(text.begin() + static_cast<std::ptrdiff_t>(line_start),
                                                      text.end(), [](char c) { return is_ws(c); });
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
  void push(tok type, std::string text) {
    token t;
    t.type = type;
    t.text = std::move(text);
    t.line = line_;
    tokens_.push_back(std::move(t));
  }
  void emit_text(std::string text) {
    if (!text.empty()) push(tok::text, std::move(text));
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
        static const char* const ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "/", "*", "%", "~", "[",
                                          "]",  "(",  ")",  "{",  "}",  "<",  ">", "=", ".", ":", "|", ",", ";"};
        std::string op;
        for (const char* o : ops) {
          if (src_.compare(pos_, std::strlen(o), o) == 0) {
            op = o;
            break;
          }
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
    auto is_digit = [&](size_t at) { return at < src_.size() && std::isdigit(static_cast<unsigned char>(src_[at])); };
    auto digits = [&] {
      while (is_digit(k) || (k < src_.size() && src_[k] == '_' && is_digit(k + 1))) ++k;
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
    for (size_t m = pos_; m < k; ++m)
      if (src_[m] != '_') lit.push_back(src_[m]);
    token t;
    t.line = line_;
    t.text = lit;
    if (is_float) {
      t.type = tok::floating;
      t.f = std::strtod(lit.c_str(), nullptr);
    } else {
      t.type = tok::integer;
      int base = radix_prefix(lit);
      std::string_view digits_only = lit;
      if (base != 0)
        digits_only.remove_prefix(2);
      else
        base = 10;
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
        if (k < src_.size() && digit_in(src_[k], base)) {
          ++k;
          continue;
        }
        if (k + 1 < src_.size() && src_[k] == '_' && digit_in(src_[k + 1], base)) {
          k += 2;
          continue;
        }
        return k;
      }
    };
    if (const int base = radix_prefix(std::string_view(src_).substr(pos_)); base != 0) {
      const size_t end = run(pos_ + 2, base);
      if (end > pos_ + 2) return end;  // at least one digit after the prefix
    }
    if (src_[pos_] != '0') return run(pos_ + 1, 10);
    size_t k = pos_ + 1;  // 0(_?0)*
    while (true) {
      if (k < src_.size() && src_[k] == '0') {
        ++k;
        continue;
      }
      if (k + 1 < src_.size() && src_[k] == '_' && src_[k + 1] == '0') {
        k += 2;
        continue;
      }
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
      if (c == quote) {
        ++k;
        break;
      }
      if (c == '\n') ++line_;
      if (c != '\\') {
        out.push_back(c);
        ++k;
        continue;
      }
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
        case 'x':
        case 'u':
        case 'U': {
          const int width = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          char32_t cp = 0;
          for (int d = 0; d < width; ++d) {
            const int h = k < src_.size() ? hex_value(src_[k]) : -1;
            if (h < 0) syntax_error(start_line, std::string("truncated \\") + e + " escape in string literal");
            cp = cp * 16 + static_cast<char32_t>(h);
            ++k;
          }
          if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            syntax_error(start_line, "invalid code point escape in string literal");
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

std::vector<token> tokenize(std::string_view source) { return lexer(source).run(); }

}  // namespace tessera::jinja::detail
