// Decides, per sequence and per generated token, whether generation ends and which text is safe to
// stream to the client.
//
// The engine calls append() once for every generated token, with that token's decoded text delta
// (from the incremental detokenizer; may be empty, must not split a UTF-8 character):
//
//   stop_checker stops(params, eos_token_ids);
//   ...each step:  stop_update u = stops.append(token, delta);
//                  stream(u.text); if (u.reason != finish_reason::none) finish(u);
//   ...finished for another reason (context full, abort):  stream(stops.flush());
//
// Stop strings: text that might be the start of a stop string is held back until it either
// completes one (then the output is cut before it, or after it with include_stop_str_in_output) or
// cannot any more, so a partial stop string never reaches the client. The match found is the one
// that completes first in the text, the longest on ties; this is independent of how the text was
// split into deltas.
//
// Order of checks for one token (as vLLM): nothing ends the output before params.min_tokens tokens;
// then EOS (unless ignore_eos) and stop_token_ids end it, dropping that token's text unless
// include_stop_str_in_output; then stop strings; then params.max_tokens (finish_reason::length).
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/base/token_id.hpp"
#include "engine/sampling_params.hpp"

namespace tessera {

struct stop_update {
  std::string text;  // text to stream now (possibly empty)
  finish_reason reason = finish_reason::none;
  // What stopped the sequence when reason == stop: an index into params.stop, or the EOS / stop
  // token id. Both empty for other reasons.
  std::optional<int32_t> stop_string_index;
  std::optional<token_id> stop_token;
};

class stop_checker {
 public:
  stop_checker(const sampling_params& params, std::span<const token_id> eos_token_ids = {});

  // One generated token and its text delta. After a result with reason != none the checker is
  // finished and further calls return an empty update.
  stop_update append(token_id token, std::string_view text_delta);

  // Ends the sequence for a reason decided elsewhere: returns the held-back text (which did not turn
  // out to be a stop string) and marks the checker finished.
  std::string flush();

  bool finished() const { return finished_; }
  int32_t num_generated() const { return num_generated_; }
  // Bytes currently held back (a possible stop-string prefix).
  size_t num_held_bytes() const { return pending_.size(); }

 private:
  bool is_stop_token(token_id token) const;
  // Moves the first num_bytes of pending_ to `out` (and to tail_).
  void release(std::string& out, size_t num_bytes);
  size_t held_suffix_bytes() const;

  std::vector<std::string> stops_;
  std::vector<token_id> stop_token_ids_;
  std::vector<token_id> eos_token_ids_;
  int32_t min_tokens_ = 0;
  int32_t max_tokens_ = 0;
  bool ignore_eos_ = false;
  bool include_stop_ = false;
  int32_t num_generated_ = 0;
  bool finished_ = false;
  size_t max_stop_bytes_ = 0;
  std::string pending_;  // text received but not yet released
  std::string tail_;     // the last (max_stop_bytes_ - 1) released bytes
};

}  // namespace tessera
