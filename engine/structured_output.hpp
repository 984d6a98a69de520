// Constrained decoding, as the engine core sees it: what a request asks its output to match
// (structured_output_spec, plain data in sampling_params), and the interfaces of the grammar engine
// that enforces it (engine/structured/ implements them over xgrammar). The core never includes the
// grammar engine: it holds one token_constraint per sequence, asks the backend for every constrained
// sequence's allowed-token bitmask while the executor runs the forward pass, masks the logits with it
// (host sampler or device sampler), and advances the constraint with each accepted token.
//
//   bitmask layout: ceil(vocab / 32) uint32 words; token t is allowed when bit (t % 32) of word t / 32
//   is set (xgrammar's layout, so its masks are used as they come).
#pragma once
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/base/token_id.hpp"

namespace tessera {

// What the output must match. Built by the server from response_format / structured_outputs /
// guided_* / llama-server's json_schema and grammar (server/structured_output_request.cpp).
struct structured_output_spec {
  enum class kind : uint8_t {
    json_object,     // any JSON object (response_format {"type": "json_object"})
    json_schema,     // `source`: a JSON Schema
    regex,           // `source`: a regular expression the whole output matches
    choice,          // the output is exactly one of `choices`
    grammar,         // `source`: an EBNF grammar (xgrammar's, which reads llama.cpp's GBNF), root rule "root"
    structural_tag,  // `source`: an xgrammar structural tag (JSON): free text with constrained segments
  };
  kind type = kind::json_object;
  std::string source;
  std::vector<std::string> choices;
  bool strict = false;  // json_schema: keywords outside the supported subset are errors, not ignored
  // The request field the spec came from ("response_format", "guided_json", ...): errors name it.
  std::string field = "response_format";

  friend bool operator==(const structured_output_spec&, const structured_output_spec&) = default;
};

std::string_view to_string(structured_output_spec::kind k);

// Words of a packed bitmask over `vocab_size` tokens.
constexpr int32_t token_mask_words(int32_t vocab_size) { return (vocab_size + 31) / 32; }
inline bool token_allowed(std::span<const uint32_t> mask, token_id t) {
  return (mask[static_cast<size_t>(t) / 32] >> (static_cast<uint32_t>(t) % 32)) & 1u;
}

// One sequence's place in its grammar. Not thread-safe; the engine never calls two methods of one
// constraint at once (fill_next_mask runs on a grammar worker while the engine thread waits for the
// executor, and only then does the engine thread accept the sampled token).
class token_constraint {
 public:
  virtual ~token_constraint() = default;
  // The tokens allowed next, into `mask` (token_mask_words(vocab) words, every word written).
  virtual void fill_next_mask(std::span<uint32_t> mask) = 0;
  // Advances past `token`. False, with the state unchanged, when the grammar does not allow it.
  virtual bool accept(token_id token) = 0;
  // Undoes the last `num_tokens` accepted tokens (speculative decoding verifies drafts this way);
  // num_tokens <= num_accepted().
  virtual void rollback(int32_t num_tokens) = 0;
  virtual int32_t num_accepted() const = 0;
  // The output is complete: the grammar accepted an end token, or its root rule is matched and
  // nothing but an end token may follow. The engine then finishes the sequence with reason stop.
  virtual bool is_complete() = 0;
  // An independent copy in the same state (n > 1 requests fork after the prompt).
  virtual std::unique_ptr<token_constraint> fork() const = 0;
};

// A compiled grammar: immutable, shared by every request that asks for the same spec (the backend
// caches them by content hash).
class compiled_constraint {
 public:
  virtual ~compiled_constraint() = default;
  virtual std::unique_ptr<token_constraint> start() const = 0;
  virtual size_t memory_bytes() const = 0;
};

struct compile_result {
  std::shared_ptr<const compiled_constraint> compiled;  // null: failed, see error
  std::string error;                                    // names the problem (and the request field)
  bool cache_hit = false;
  double seconds = 0;  // compile time (0 on a cache hit)
};

// One mask to fill: `constraint`'s next allowed tokens into `mask`.
struct mask_job {
  token_constraint* constraint = nullptr;
  std::span<uint32_t> mask;
};

// The grammar engine behind the interface: compiles specs (cached, bounded in size and time) and
// fills masks on its own worker threads.
class constraint_backend {
 public:
  virtual ~constraint_backend() = default;
  // Compiles `spec` or finds it in the cache; `done` is called exactly once, from the calling thread
  // (cache hit, or a spec rejected before compiling) or from a compile worker, or when the compile
  // runs past its time bound. Never throws; failures arrive as compile_result::error.
  virtual void compile_async(const structured_output_spec& spec, std::function<void(compile_result)> done) = 0;
  // Starts filling every job's mask on the grammar workers and returns at once; the future is ready
  // when all are written. The caller keeps the constraints and masks alive, and untouched, until then.
  virtual std::shared_future<void> fill_masks(std::vector<mask_job> jobs) = 0;

  // compile_async, waited for. Throws invalid_request with the error.
  std::shared_ptr<const compiled_constraint> compile(const structured_output_spec& spec);
};

}  // namespace tessera
