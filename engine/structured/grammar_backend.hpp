// The grammar engine of constrained decoding: engine/structured_output.hpp's constraint_backend over
// xgrammar's C++ core (Dong et al., "XGrammar: Flexible and Efficient Structured Generation Engine for
// Large Language Models", 2024; the engine vLLM, SGLang and TensorRT-LLM use).
//
// What xgrammar brings: JSON Schema / regex / EBNF (GBNF-compatible) / structural tags compiled into
// a pushdown automaton over bytes, and at compile time an "adaptive token mask cache": for every
// automaton position the tokens whose acceptance does not depend on the stack (the vast majority)
// are classified once, so a step's mask only runs the few context-dependent tokens through the
// automaton. What this file adds around it:
//
//   * compile cache: one compiled grammar per spec, keyed by a content hash (XXH3 over the kind,
//     flags and text; the full key is compared on a hit), LRU-bounded in entries and bytes; failures
//     are cached too, so a bad schema sent in a loop costs one check;
//   * bounds: the spec's bytes (sampling_limits), the schema's nesting depth and, in strict mode, its
//     keywords (schema_check.hpp) before compiling; compile time afterwards: a compile still running
//     after max_compile_seconds is reported as an error and its result discarded (remembered as too
//     slow, so the same spec fails fast after that). Concurrent requests for one spec share a compile;
//   * compile workers (compile_async) and mask workers (fill_masks): threads of their own, so neither
//     a compile nor a step's masks ever runs on the engine's or an I/O thread.
#pragma once
#include <cstdint>
#include <memory>

#include "engine/structured_output.hpp"
#include "engine/text/tokenizer.hpp"

namespace tessera::structured {

struct grammar_options {
  int32_t max_schema_depth = 32;      // nested subschemas of a JSON schema
  double max_compile_seconds = 10.0;  // per spec, from its arrival (queueing included)
  int32_t max_pending_compiles = 64;  // queued or running; beyond: an error at once
  int32_t max_cached_grammars = 512;
  int64_t max_cache_bytes = int64_t{1} << 30;
  int32_t num_compile_threads = 1;
  int32_t num_mask_threads = 0;  // 0: hardware threads / 2, 1..4
  // JSON: allow any whitespace between tokens. Off: the compact form (", " and ": " separators), which
  // keeps small models from spending their tokens on whitespace.
  bool any_whitespace = false;
};

// `vocab_size`: the width of the model's logits (at least the tokenizer's vocabulary).
std::shared_ptr<constraint_backend> make_grammar_backend(const tokenizer& tok, int32_t vocab_size,
                                                         const grammar_options& options = {});

// A GBNF/EBNF grammar whose root matches exactly one of `choices` (guided_choice).
std::string choice_grammar(const std::vector<std::string>& choices);

}  // namespace tessera::structured
