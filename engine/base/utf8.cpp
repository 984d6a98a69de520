// UTF-8 coding with llama.cpp's tolerance (unicode.cpp, unicode_cpts_from_utf8 / unicode_cpt_to_utf8),
// shared by the tokenizer and the Jinja interpreter.
#include "engine/base/utf8.hpp"

namespace tessera {

void decode_utf8_lenient(std::string_view text, std::vector<uint32_t>& out) {
  out.reserve(out.size() + text.size());
  const size_t size = text.size();
  auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  auto is_cont = [&](size_t i) { return i < size && (byte(i) & 0xC0) == 0x80; };
  size_t i = 0;
  while (i < size) {
    const uint8_t b0 = byte(i);
    if (b0 < 0x80) {
      out.push_back(b0);
      i += 1;
    } else if ((b0 & 0xE0) == 0xC0 && is_cont(i + 1)) {
      out.push_back((uint32_t{b0} & 0x1F) << 6 | (byte(i + 1) & 0x3F));
      i += 2;
    } else if ((b0 & 0xF0) == 0xE0 && is_cont(i + 1) && is_cont(i + 2)) {
      out.push_back((uint32_t{b0} & 0x0F) << 12 | (uint32_t{byte(i + 1)} & 0x3F) << 6 | (byte(i + 2) & 0x3F));
      i += 3;
    } else if ((b0 & 0xF8) == 0xF0 && is_cont(i + 1) && is_cont(i + 2) && is_cont(i + 3)) {
      out.push_back((uint32_t{b0} & 0x07) << 18 | (uint32_t{byte(i + 1)} & 0x3F) << 12 |
                    (uint32_t{byte(i + 2)} & 0x3F) << 6 | (byte(i + 3) & 0x3F));
      i += 4;
    } else {
      out.push_back(0xFFFD);  // stray continuation byte, 0xF8..0xFF, or a truncated sequence
      i += 1;
    }
  }
}

void append_utf8(uint32_t cpt, std::string& out) {
  if (cpt > 0x10FFFF) cpt = 0xFFFD;
  if (cpt < 0x80) {
    out.push_back(static_cast<char>(cpt));
  } else if (cpt < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cpt >> 6)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else if (cpt < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cpt >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cpt >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  }
}

}  // namespace tessera
