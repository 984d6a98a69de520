// The engine's speculative decoding settings (docs/speculative.md): which proposer, how many draft
// tokens per step, and the batch size above which a step does not speculate.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

#include "engine/speculative/ngram_proposer.hpp"

namespace tessera {

enum class speculative_mode : uint8_t { off, ngram };

// "off" / "ngram"; nullopt for anything else (callers name the accepted values in their error).
std::optional<speculative_mode> parse_speculative_mode(std::string_view text);
std::string_view to_string(speculative_mode mode);

struct speculative_options {
  speculative_mode mode = speculative_mode::off;
  int32_t num_tokens = 4;  // draft tokens per sequence and step (k), >= 1
  ngram_options ngram;
  // Decode is memory-bound only while the batch is small: with more decoding sequences than this, a
  // step verifies no drafts (their extra rows would cost compute the batch already fills). The measured
  // threshold is a benchmark's (bench/speculative_bench.sh); this default is a guess.
  int32_t max_batch = 4;

  // Throws invalid_request naming the bad value (num_tokens < 1, max_batch < 1, the n-gram range).
  void validate() const;
  // The proposer `mode` names; null for off. pre: validate() passed.
  std::unique_ptr<draft_proposer> make_proposer() const;
};

}  // namespace tessera
