// UTF-8 <-> code points, as lenient as llama.cpp: what the tokenizer and the Jinja interpreter share.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

// UTF-8 -> code points exactly as llama.cpp's unicode_cpts_from_utf8: the length comes from the
// lead byte and only the continuation bytes' top bits are checked (overlong forms and surrogates
// are accepted); a byte that cannot start a complete sequence becomes one U+FFFD.
void decode_utf8_lenient(std::string_view text, std::vector<uint32_t>& out);

// Appends the UTF-8 form of cpt (any value up to U+10FFFF, surrogates included); larger values,
// which only the lenient decoder can produce, are written as U+FFFD.
void append_utf8(uint32_t cpt, std::string& out);

}  // namespace tessera
