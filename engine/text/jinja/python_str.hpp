// Python's str semantics over UTF-8 bytes: templates run on Python strings, so lengths, indices,
// slices, whitespace and case follow code points and Python's own tables, not bytes or C locales.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace tessera::jinja::detail {

// Bytes that are not valid UTF-8 decode to U+DC80..U+DCFF (Python's "surrogateescape") and encode
// back to the same byte, so no input is ever altered or rejected.
std::u32string decode_utf8(std::string_view s);
void append_utf8(std::string& out, char32_t cp);
std::string encode_utf8(std::u32string_view s);

bool is_ascii(std::string_view s);
size_t count_code_points(std::string_view s);

// Python's str.isspace() set.
bool is_py_space(char32_t c);

// Case mapping covers ASCII, Latin-1, Greek and Cyrillic (full Unicode tables are out of scope).
char32_t to_upper_cp(char32_t c);
char32_t to_lower_cp(char32_t c);
bool is_cased(char32_t c);

std::string py_upper(const std::string& s);  // with Python's special casing of sharp s: "ß" -> "SS"
std::string py_lower(const std::string& s);
std::string py_capitalize(const std::string& s);
// Python str.title(): upper-case a cased character after an uncased one, lower-case the rest.
std::string py_title(const std::string& s);

// Python str.strip/lstrip/rstrip: `chars` null strips whitespace, otherwise the code points given.
std::string py_strip(const std::string& s, const std::u32string* chars, bool left, bool right);

// Python str.splitlines(): \n, \r\n, \r, \v, \f, \x1c-\x1e, \x85, U+2028, U+2029 end lines.
std::vector<std::string> py_splitlines(const std::string& s);

// The base named by a "0x", "0o" or "0b" prefix (any case), else 0: integer literals and int(s, 0)
// read the same prefixes.
int radix_prefix(std::string_view s);

}  // namespace tessera::jinja::detail
