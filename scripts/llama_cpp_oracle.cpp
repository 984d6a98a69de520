// The llama.cpp side of scripts/make_model_fixtures.py and scripts/make_gemma_fixtures.py, built there
// against the static libllama of the pinned llama.cpp sources (bench/build_llama_cpp.sh). Commands:
//
//   llama_cpp_oracle quantize IN.gguf OUT.gguf FTYPE     llama_model_quantize, as llama-quantize calls it
//                                                       (FTYPE: the llama_ftype number, e.g. 15 = Q4_K_M)
//   llama_cpp_oracle logits MODEL.gguf N_CTX N_NEW ID... the prompt in one batch with every position's
//                                                       logits, then N_NEW greedy tokens one at a time
//   llama_cpp_oracle tokenize MODEL.gguf                 stdin: one input per line, "S HEX" (S: 1 to parse
//                                                       special-token spellings, HEX: the raw bytes); stdout:
//                                                       one line of ids each (llama_tokenize, no BOS), or
//                                                       "error" where llama.cpp throws on the input
//   llama_cpp_oracle greedy MODEL.gguf N_CTX N_NEW       stdin: one prompt of ids per line; stdout per prompt:
//                                                       N_NEW greedy ids, '|', the top-1 minus top-2 logit
//                                                       margin of each of those steps (the KV is cleared
//                                                       between prompts; the model loads once)
//
// `logits` writes to stdout: int32 vocab, int32 rows, rows x vocab float32 (prompt rows, then one row
// per fed greedy token but the last), then N_NEW int32 greedy ids. Default context settings (F16 KV
// cache, flash attention as llama.cpp chooses), one sequence, n_threads 1: the engine's outputs are
// compared with what a llama.cpp user gets.
#include <llama.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

void quiet(ggml_log_level level, const char* text, void*) {
  if (level >= GGML_LOG_LEVEL_WARN) std::fputs(text, stderr);
}

int quantize(const char* in, const char* out, int ftype) {
  llama_model_quantize_params p = llama_model_quantize_default_params();
  p.ftype = static_cast<llama_ftype>(ftype);
  p.nthread = 1;
  return llama_model_quantize(in, out, &p) == 0 ? 0 : 1;
}

// A model and one single-threaded context whose batch takes a whole n_ctx prompt; ctx is null when
// either failed to load.
struct loaded_model {
  llama_model* model = nullptr;
  llama_context* ctx = nullptr;
  int32_t vocab = 0;

  loaded_model(const char* path, int n_ctx) {
    model = llama_model_load_from_file(path, llama_model_default_params());
    if (model == nullptr) return;
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = static_cast<uint32_t>(n_ctx);
    cp.n_batch = static_cast<uint32_t>(n_ctx);
    cp.n_ubatch = static_cast<uint32_t>(n_ctx);
    cp.n_threads = 1;
    cp.n_threads_batch = 1;
    ctx = llama_init_from_model(model, cp);
    vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  }
  ~loaded_model() {
    if (ctx != nullptr) llama_free(ctx);
    if (model != nullptr) llama_model_free(model);
  }
  loaded_model(const loaded_model&) = delete;
  loaded_model& operator=(const loaded_model&) = delete;
};

int logits(const char* path, int n_ctx, int n_new, const std::vector<llama_token>& prompt) {
  const loaded_model m(path, n_ctx);
  if (m.ctx == nullptr) return 1;
  llama_context* ctx = m.ctx;
  const int32_t vocab = m.vocab;
  std::vector<float> rows;
  auto argmax = [&](const float* l) {
    int32_t best = 0;
    for (int32_t i = 1; i < vocab; ++i) best = l[i] > l[best] ? i : best;
    return best;
  };
  llama_batch b = llama_batch_init(static_cast<int32_t>(prompt.size()), 0, 1);
  for (size_t i = 0; i < prompt.size(); ++i) {
    b.token[i] = prompt[i];
    b.pos[i] = static_cast<llama_pos>(i);
    b.n_seq_id[i] = 1;
    b.seq_id[i][0] = 0;
    b.logits[i] = 1;
  }
  b.n_tokens = static_cast<int32_t>(prompt.size());
  if (llama_decode(ctx, b) != 0) return 1;
  for (size_t i = 0; i < prompt.size(); ++i) {
    const float* l = llama_get_logits_ith(ctx, static_cast<int32_t>(i));
    rows.insert(rows.end(), l, l + vocab);
  }
  std::vector<int32_t> greedy{argmax(rows.data() + (prompt.size() - 1) * vocab)};
  while (static_cast<int>(greedy.size()) < n_new) {
    b.n_tokens = 1;
    b.token[0] = greedy.back();
    b.pos[0] = static_cast<llama_pos>(prompt.size() + greedy.size() - 1);
    b.logits[0] = 1;
    if (llama_decode(ctx, b) != 0) return 1;
    const float* l = llama_get_logits_ith(ctx, 0);
    rows.insert(rows.end(), l, l + vocab);
    greedy.push_back(argmax(l));
  }
  const int32_t num_rows = static_cast<int32_t>(rows.size() / vocab);
  std::fwrite(&vocab, 4, 1, stdout);
  std::fwrite(&num_rows, 4, 1, stdout);
  std::fwrite(rows.data(), 4, rows.size(), stdout);
  std::fwrite(greedy.data(), 4, greedy.size(), stdout);
  llama_batch_free(b);
  return 0;
}

int tokenize(const char* path) {
  llama_model_params mp = llama_model_default_params();
  mp.vocab_only = true;
  llama_model* model = llama_model_load_from_file(path, mp);
  if (model == nullptr) return 1;
  const llama_vocab* vocab = llama_model_get_vocab(model);
  std::string line;
  while (std::getline(std::cin, line)) {
    const size_t space = line.find(' ');
    const bool special = line.compare(0, space, "1") == 0;
    std::string text;
    for (size_t i = space == std::string::npos ? line.size() : space + 1; i + 1 < line.size(); i += 2) {
      text.push_back(static_cast<char>(std::stoi(line.substr(i, 2), nullptr, 16)));
    }
    std::vector<llama_token> ids(text.size() + 16);
    try {
      int32_t n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), ids.data(),
                                 static_cast<int32_t>(ids.size()), /*add_special=*/false, special);
      if (n < 0) {
        ids.resize(static_cast<size_t>(-n));
        n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), ids.data(),
                           static_cast<int32_t>(ids.size()), false, special);
      }
      for (int32_t i = 0; i < n; ++i) std::printf(i ? " %d" : "%d", ids[static_cast<size_t>(i)]);
      std::printf("\n");
    } catch (const std::exception&) {
      // llama.cpp throws on some inputs (a 4-byte code point above U+10FFFF): no oracle for those.
      std::printf("error\n");
    }
  }
  llama_model_free(model);
  return 0;
}

int greedy(const char* path, int n_ctx, int n_new) {
  const loaded_model m(path, n_ctx);
  if (m.ctx == nullptr) return 1;
  llama_context* ctx = m.ctx;
  const int32_t vocab = m.vocab;
  llama_batch b = llama_batch_init(n_ctx, 0, 1);
  std::string line;
  while (std::getline(std::cin, line)) {
    std::vector<llama_token> prompt;
    std::istringstream in(line);
    for (llama_token t; in >> t;) prompt.push_back(t);
    if (prompt.empty() || static_cast<int>(prompt.size()) + n_new > n_ctx) return 1;
    llama_memory_clear(llama_get_memory(ctx), true);
    std::vector<int32_t> ids;
    std::vector<float> margins;
    size_t fed = prompt.size();
    b.n_tokens = static_cast<int32_t>(prompt.size());
    for (size_t i = 0; i < prompt.size(); ++i) {
      b.token[i] = prompt[i];
      b.pos[i] = static_cast<llama_pos>(i);
      b.n_seq_id[i] = 1;
      b.seq_id[i][0] = 0;
      b.logits[i] = i + 1 == prompt.size();
    }
    while (true) {
      if (llama_decode(ctx, b) != 0) return 1;
      const float* l = llama_get_logits_ith(ctx, b.n_tokens - 1);
      int32_t best = 0, second = -1;
      for (int32_t i = 1; i < vocab; ++i) {
        if (l[i] > l[best]) {
          second = best;
          best = i;
        } else if (second < 0 || l[i] > l[second]) {
          second = i;
        }
      }
      ids.push_back(best);
      margins.push_back(l[best] - l[second]);
      if (static_cast<int>(ids.size()) == n_new) break;
      b.n_tokens = 1;
      b.token[0] = best;
      b.pos[0] = static_cast<llama_pos>(fed++);
      b.logits[0] = 1;
    }
    for (size_t i = 0; i < ids.size(); ++i) std::printf(i ? " %d" : "%d", ids[i]);
    std::printf(" |");
    for (float m : margins) std::printf(" %.4f", m);
    std::printf("\n");
    std::fflush(stdout);
  }
  llama_batch_free(b);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  llama_log_set(quiet, nullptr);
  llama_backend_init();
  if (argc == 5 && std::strcmp(argv[1], "quantize") == 0) return quantize(argv[2], argv[3], std::atoi(argv[4]));
  if (argc >= 6 && std::strcmp(argv[1], "logits") == 0) {
    std::vector<llama_token> ids;
    for (int i = 5; i < argc; ++i) ids.push_back(std::atoi(argv[i]));
    return logits(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), ids);
  }
  if (argc == 3 && std::strcmp(argv[1], "tokenize") == 0) return tokenize(argv[2]);
  if (argc == 5 && std::strcmp(argv[1], "greedy") == 0) return greedy(argv[2], std::atoi(argv[3]), std::atoi(argv[4]));
  std::fprintf(
      stderr,
      "usage: %s quantize IN OUT FTYPE | logits MODEL N_CTX N_NEW ID... | tokenize MODEL | greedy MODEL N_CTX N_NEW\n",
      argv[0]);
  return 2;
}
