// The tokenizer's part of a Hugging Face directory (engine/text/hf_tokenizer.hpp): read_hf_vocab and
// read_hf_chat_template, which take a directory. An input holds up to four files separated by NUL
// bytes, written into a scratch directory of this process:
//
//   tokenizer.json \0 tokenizer_config.json \0 config.json \0 chat_template.jinja
//
// A file whose part is missing (fewer NULs) is absent. What read_hf_vocab accepts is then built into
// a tokenizer (whose constructor validates it again) and used to encode and decode a little text.
//
// The declared vocabulary (min_vocab_size) is config.json's vocab_size as read_hf_config accepts it,
// like the loader passes it, but only up to 2^16 here: the loader reaches read_hf_vocab only after
// binding an embedding matrix with that many rows, so a large declared size there is paid for by the
// checkpoint's own size; here it would only measure the placeholder padding.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "engine/base/error.hpp"
#include "engine/model/hf_model.hpp"
#include "engine/text/hf_tokenizer.hpp"
#include "engine/text/tokenizer.hpp"
#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  static const fuzz::scratch_dir dir;
  static const char* const k_files[] = {"tokenizer.json", "tokenizer_config.json", "config.json",
                                        "chat_template.jinja"};
  const auto parts = fuzz::split_parts(fuzz::as_text(data, size), 4);
  for (size_t i = 0; i < 4; ++i) {
    dir.put(k_files[i], i < parts.size() ? std::optional<std::string_view>(parts[i]) : std::nullopt);
  }

  int32_t declared = 0;
  if (parts.size() > 2) {
    try {
      declared = read_hf_config(dir.path()).vocab_size;
    } catch (const load_error&) {  // a refusal: the documented answer to bad input
    }
    if (declared > (1 << 16)) declared = 0;
  }

  std::vector<std::string> warnings;
  std::optional<vocab_data> vocab;
  try {
    vocab = read_hf_vocab(dir.path(), declared, &warnings);
  } catch (const load_error&) {  // a refusal: the documented answer to bad input
  }
  if (vocab) {
    fuzz::check(vocab->tokens.size() >= static_cast<size_t>(declared), "vocabulary not padded to the declared size");
    fuzz::check(vocab->types.size() == vocab->tokens.size(), "types and tokens differ in length");
    try {
      const tokenizer tok(std::move(*vocab));
      // Fixed text, and the input's last part: hostile text against the hostile vocabulary.
      for (const std::string_view text : {std::string_view("Hello world 123 <|im_start|>\xc3\xa9\xf0\x9f\x8e\x89 "),
                                          std::string_view("\n\n  x"), parts.back().substr(0, 256)}) {
        const auto ids = tok.encode(text, {.add_special = true, .parse_special = true});
        for (token_id id : ids) {
          fuzz::check(id >= 0 && static_cast<size_t>(id) < tok.vocab_size(),
                      "encode produced an id outside the vocabulary");
        }
        (void)tok.decode(ids);
      }
    } catch (const load_error&) {  // a refusal: the documented answer to bad input
    }
  }

  try {
    (void)read_hf_chat_template(dir.path());
  } catch (const load_error&) {  // a refusal: the documented answer to bad input
  }
  return 0;
}
