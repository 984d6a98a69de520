// GGUF reader (engine/model/gguf.hpp) on arbitrary bytes, then what the model loader does with a file
// that parses: the architecture binding (read_gguf_config, load_gguf_weights), the tokenizer
// (tokenizer::from_gguf) and a short encode/decode with it.
//
// Oracles besides the sanitizers: from_bytes (heap copy) and open (the mmap path, through a scratch
// file) must agree on success; every tensor must lie inside the image; the first and last row of
// every bound weight are dequantized, so a view past its tensor is an ASan report; token ids from
// encode must be inside the vocabulary.
#include <algorithm>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/base/error.hpp"
#include "engine/model/ggml_types.hpp"
#include "engine/model/gguf.hpp"
#include "engine/model/model_weights.hpp"
#include "engine/text/tokenizer.hpp"
#include "fuzz_support.hpp"

namespace {

using namespace tessera;

void touch_weight(const weight_tensor& w) {
  if (w.empty()) return;
  const ggml_type_info& ti = type_info(w.type);
  if (!ti.can_dequantize || w.cols <= 0 || w.cols > (1 << 20)) return;
  std::vector<float> row(static_cast<size_t>(w.cols));
  dequantize_row(w.type, w.row(0), row.data(), w.cols);
  dequantize_row(w.type, w.row(w.rows - 1), row.data(), w.cols);
}

void exercise(const std::shared_ptr<const gguf_file>& file, std::string_view image) {
  const size_t image_size = image.size();
  for (const auto& key : file->keys()) {
    fuzz::check(file->find(key) != nullptr, "keys() lists '" + key + "' but find() does not know it");
    (void)file->describe(key);
  }
  for (const auto& t : file->tensors()) {
    fuzz::check(file->tensor(t.name) == &t, "tensor('" + t.name + "') is not the listed tensor");
    fuzz::check(t.num_bytes <= image_size, "tensor '" + t.name + "' is larger than the file");
    if (t.num_bytes > 0) {
      // The last byte must be readable: ASan reports it when the reader's bounds are wrong.
      volatile std::byte last = t.data[t.num_bytes - 1];
      (void)last;
    }
  }

  try {
    const model_config config = read_gguf_config(*file);
    (void)config;
    const auto weights = load_gguf_weights(file);
    touch_weight(weights->token_embedding);
    touch_weight(weights->output_norm);
    touch_weight(weights->output);
    for (const auto& l : weights->layers) {
      for (const weight_tensor* w :
           {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_norm, &l.w_gate, &l.w_up, &l.w_down, &l.bq, &l.bk, &l.bv,
            &l.q_norm, &l.k_norm, &l.post_attn_norm, &l.post_ffn_norm}) {
        touch_weight(*w);
      }
    }
  } catch (const load_error&) {  // a refusal: the documented answer to bad input
  }

  std::shared_ptr<const tokenizer> tok;
  try {
    tok = tokenizer::from_gguf(*file);
  } catch (const load_error&) { return; }
  // Fixed text, and the image's last bytes: hostile text against the hostile vocabulary (the fuzzer
  // controls both there, e.g. special tokens that are prefixes of one another).
  const std::string_view tail = image.substr(image.size() - std::min<size_t>(image.size(), 128));
  for (const std::string_view text :
       {std::string_view("Hello, world! 123 <|im_start|>user\n\xe4\xb8\x96\xff"), std::string_view("  \t\n"), tail}) {
    const auto ids = tok->encode(text, {.add_special = true, .parse_special = true});
    for (token_id id : ids) {
      fuzz::check(id >= 0 && static_cast<size_t>(id) < tok->vocab_size(),
                  "encode produced an id outside the vocabulary");
    }
    (void)tok->decode(ids);
    (void)tok->decode(ids, /*skip_special=*/true);
  }
}

fuzz::scratch_dir& scratch() {
  static fuzz::scratch_dir dir;
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  std::shared_ptr<const gguf_file> file;
  bool parsed = false;
  try {
    file = gguf_file::from_bytes(bytes);
    parsed = true;
  } catch (const load_error&) {  // a refusal: the documented answer to bad input
  }

  // The mmap path must agree. Files shorter than the header are refused by open() before parsing,
  // exactly as the parser refuses them, so every input can go through both.
  scratch().put("model.gguf", fuzz::as_text(data, size));
  bool opened = false;
  try {
    const auto mapped = gguf_file::open(scratch().path() / "model.gguf");
    opened = true;
    fuzz::check(!parsed || mapped->tensors().size() == file->tensors().size(),
                "open() and from_bytes() disagree on the tensors");
  } catch (const load_error&) {  // a refusal: the documented answer to bad input
  }
  fuzz::check(parsed == opened,
              parsed ? "from_bytes() accepted what open() refused" : "open() accepted what from_bytes() refused");

  if (parsed) exercise(file, fuzz::as_text(data, size));
  return 0;
}
