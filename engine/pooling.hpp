// Pooling a prompt's final hidden states into one embedding vector (/v1/embeddings), as vLLM and
// llama-server do for generative models: an embedding request is a prefill-only sequence whose
// executor steps return, instead of logits, its rows of the final-normed hidden state (summed per
// chunk for mean pooling, the last prompt row for last pooling); the engine accumulates them across
// prefill chunks here and L2-normalises the result (both peers' default).
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace tessera {

// none: a generation. mean: the average over every prompt token (llama-server's default for
// generative models). last: the last prompt token's (vLLM's default for decoder-only models).
enum class pooling_type : uint8_t { none, mean, last };

std::string_view to_string(pooling_type type);                          // "none", "mean", "last"
std::optional<pooling_type> parse_pooling_type(std::string_view name);  // "mean" / "last"; nullopt otherwise

// One embedding sequence's pool as its prefill chunks come back.
class embedding_pool {
 public:
  embedding_pool(pooling_type type, int32_t hidden_size);
  // Forgets every chunk: a sequence preempted by recompute starts its prefill over.
  void reset();
  // One chunk of `num_tokens` rows: mean pooling gets the sum of the chunk's rows, last pooling the
  // chunk's last row (only the prompt's final chunk matters; earlier ones come with no row). An empty
  // row where mean pooling needs one (an executor that returned none) makes the pool incomplete.
  void add(std::span<const float> row, int32_t num_tokens);
  int32_t num_tokens() const { return num_tokens_; }
  bool complete() const { return num_missing_ == 0; }
  // The pooled vector, L2-normalised (a zero vector stays zero).
  std::vector<float> finish() const;

 private:
  pooling_type type_;
  std::vector<double> sum_;  // double: a long prompt sums thousands of rows
  int32_t num_tokens_ = 0;
  int32_t num_missing_ = 0;  // mean pooling: chunks that came without their row sum
};

}  // namespace tessera
