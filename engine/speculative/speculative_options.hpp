// The engine's speculative decoding settings (docs/speculative.md): which proposer, how many draft
// tokens per step, and the batch size above which a step does not speculate.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

#include "engine/executor.hpp"
#include "engine/speculative/draft_model_proposer.hpp"
#include "engine/speculative/ngram_proposer.hpp"

namespace tessera {

// off; n-gram prompt lookup; a draft model (a second, smaller model with the target's vocabulary).
enum class speculative_mode : uint8_t { off, ngram, draft };

// "off" / "ngram" / "draft"; nullopt for anything else (callers name the accepted values in their error).
std::optional<speculative_mode> parse_speculative_mode(std::string_view text);
std::string_view to_string(speculative_mode mode);

struct speculative_options {
  speculative_mode mode = speculative_mode::off;
  int32_t num_tokens = 4;  // draft tokens per sequence and step (k), >= 1
  ngram_options ngram;
  // mode draft: the draft model's executor (built by the composition root, app/, like the target's;
  // its KV pool is the proposer's alone) and how the proposer uses it.
  std::shared_ptr<executor> draft_executor;
  draft_model_options draft;
  // Decode is memory-bound only while the batch is small: with more decoding sequences than this, a
  // step verifies no drafts (their extra rows would cost compute the batch already fills). Measured
  // with bench/speculative_threshold.sh (docs/benchmarks.md, 2026-12-04): n-gram speculation still
  // gains 1.05x at 8 sequences on ShareGPT-like requests, breaks even at 16 and loses 6% at 32 (on
  // input-grounded text it gains at every size measured); the largest size at which it pays on both.
  int32_t max_batch = 8;

  // Throws invalid_request naming the bad value (num_tokens < 1, max_batch < 1, the n-gram range, the
  // draft model's chunk size). The draft executor is checked by make_proposer().
  void validate() const;
  // The proposer `mode` names for a target of `target_vocab` logits; null for off. pre: validate()
  // passed. Throws invalid_request for mode draft without a draft executor or when the draft model's
  // vocabulary size is not the target's.
  std::unique_ptr<draft_proposer> make_proposer(int32_t target_vocab) const;
};

}  // namespace tessera
