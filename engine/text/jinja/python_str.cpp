#include "engine/text/jinja/python_str.hpp"

#include <algorithm>
#include <cctype>
#include <cstdint>

#include "engine/base/utf8.hpp"

namespace tessera::jinja::detail {

std::u32string decode_utf8(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int len = 0;
    char32_t cp = 0;
    if (c < 0x80) {
      out.push_back(c);
      ++i;
      continue;
    }
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    }
    bool ok = len > 0 && i + static_cast<size_t>(len) <= s.size();
    for (int k = 1; ok && k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
      if ((cc & 0xC0) != 0x80)
        ok = false;
      else
        cp = (cp << 6) | (cc & 0x3F);
    }
    if (ok) {
      const bool overlong = (len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000);
      if (overlong || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) ok = false;
    }
    if (!ok) {
      out.push_back(0xDC00 + c);
      ++i;
      continue;
    }
    out.push_back(cp);
    i += static_cast<size_t>(len);
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp >= 0xDC80 && cp <= 0xDCFF) {
    out.push_back(static_cast<char>(cp - 0xDC00));
    return;
  }
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

bool is_py_space(char32_t c) {
  return (c >= 9 && c <= 13) || (c >= 28 && c <= 32) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

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

std::string py_upper(const std::string& s) {
  std::string out;
  for (char32_t c : decode_utf8(s)) {
    if (c == 0xDF)
      out += "SS";
    else
      append_utf8(out, to_upper_cp(c));
  }
  return out;
}

std::string py_lower(const std::string& s) {
  std::string out;
  for (char32_t c : decode_utf8(s)) append_utf8(out, to_lower_cp(c));
  return out;
}

std::string py_capitalize(const std::string& s) {
  std::u32string cps = decode_utf8(s);
  for (size_t k = 0; k < cps.size(); ++k) cps[k] = k == 0 ? to_upper_cp(cps[k]) : to_lower_cp(cps[k]);
  return encode_utf8(cps);
}

std::string py_title(const std::string& s) {
  std::u32string cps = decode_utf8(s);
  bool prev_cased = false;
  for (auto& c : cps) {
    const bool cased = is_cased(c);
    c = cased ? (prev_cased ? to_lower_cp(c) : to_upper_cp(c)) : c;
    prev_cased = cased;
  }
  return encode_utf8(cps);
}

std::string py_strip(const std::string& s, const std::u32string* chars, bool left, bool right) {
  if (!chars && is_ascii(s)) {
    size_t b = 0, e = s.size();
    if (left)
      while (b < e && is_py_space(static_cast<unsigned char>(s[b]))) ++b;
    if (right)
      while (e > b && is_py_space(static_cast<unsigned char>(s[e - 1]))) --e;
    return s.substr(b, e - b);
  }
  auto strip_it = [&](char32_t c) { return chars ? chars->find(c) != std::u32string::npos : is_py_space(c); };
  const std::u32string cps = decode_utf8(s);
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_it(cps[b])) ++b;
  if (right)
    while (e > b && strip_it(cps[e - 1])) --e;
  return encode_utf8(std::u32string_view(cps).substr(b, e - b));
}

std::vector<std::string> py_splitlines(const std::string& s) {
  std::vector<std::string> lines;
  const std::u32string cps = decode_utf8(s);
  std::u32string cur;
  for (size_t k = 0; k < cps.size(); ++k) {
    const char32_t c = cps[k];
    const bool boundary = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E) || c == 0x85 ||
                          c == 0x2028 || c == 0x2029;
    if (!boundary) {
      cur.push_back(c);
      continue;
    }
    if (c == '\r' && k + 1 < cps.size() && cps[k + 1] == '\n') ++k;
    lines.push_back(encode_utf8(cur));
    cur.clear();
  }
  if (!cur.empty()) lines.push_back(encode_utf8(cur));
  return lines;
}

int radix_prefix(std::string_view s) {
  if (s.size() < 2 || s[0] != '0') return 0;
  const char p = static_cast<char>(std::tolower(static_cast<unsigned char>(s[1])));
  return p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
}

}  // namespace tessera::jinja::detail
