#include "engine/stop_checker.hpp"

#include <algorithm>

namespace tessera {

stop_checker::stop_checker(const sampling_params& params, std::span<const token_id> eos_token_ids)
    : stops_(params.stop),
      stop_token_ids_(params.stop_token_ids),
      eos_token_ids_(eos_token_ids.begin(), eos_token_ids.end()),
      min_tokens_(params.min_tokens),
      max_tokens_(params.max_tokens),
      ignore_eos_(params.ignore_eos),
      include_stop_(params.include_stop_str_in_output) {
  for (const std::string& s : stops_) max_stop_bytes_ = std::max(max_stop_bytes_, s.size());
}

bool stop_checker::is_stop_token(token_id token) const {
  if (std::find(stop_token_ids_.begin(), stop_token_ids_.end(), token) != stop_token_ids_.end()) { return true; }
  return !ignore_eos_ && std::find(eos_token_ids_.begin(), eos_token_ids_.end(), token) != eos_token_ids_.end();
}

void stop_checker::release(std::string& out, size_t num_bytes) {
  const std::string_view released(pending_.data(), num_bytes);
  out.append(released);
  // Keep the last (longest stop - 1) released bytes: a stop string can begin in text that has been
  // released already when nothing is held back (include_stop_str_in_output).
  tail_.append(released);
  const size_t keep = max_stop_bytes_ > 0 ? max_stop_bytes_ - 1 : 0;
  if (tail_.size() > keep) tail_.erase(0, tail_.size() - keep);
  pending_.erase(0, num_bytes);
}

size_t stop_checker::held_suffix_bytes() const {
  // The longest suffix of pending_ that is a proper prefix of some stop string. Most comparisons
  // fail on the first byte, so this costs about window * num_stops byte compares.
  const size_t size = pending_.size();
  const size_t window = std::min(size, max_stop_bytes_ > 0 ? max_stop_bytes_ - 1 : size_t{0});
  for (size_t start = size - window; start < size; ++start) {
    const std::string_view suffix(pending_.data() + start, size - start);
    for (const std::string& s : stops_) {
      if (s.size() > suffix.size() && s.compare(0, suffix.size(), suffix) == 0) { return suffix.size(); }
    }
  }
  return 0;
}

stop_update stop_checker::append(token_id token, std::string_view text_delta) {
  stop_update update;
  if (finished_) return update;
  ++num_generated_;
  // As vLLM: the min_tokens-th token may end the output (the sampler keeps it from being EOS).
  const bool may_stop = num_generated_ >= min_tokens_;

  if (may_stop && is_stop_token(token)) {
    if (include_stop_) pending_.append(text_delta);
    update.text = flush();
    update.reason = finish_reason::stop;
    update.stop_token = token;
    return update;
  }

  pending_.append(text_delta);
  if (may_stop && !stops_.empty()) {
    // Search tail_ + pending_ for the stop that completes first (smallest end), longest on ties,
    // among occurrences that end in pending_ (those ending earlier were seen before, or fell in
    // text released while stops could not end the output yet).
    const std::string text = tail_ + pending_;
    const size_t boundary = tail_.size();
    size_t best_end = std::string::npos;
    size_t best_start = 0;
    int32_t best_index = -1;
    for (size_t i = 0; i < stops_.size(); ++i) {
      const std::string& s = stops_[i];
      const size_t from = boundary + 1 > s.size() ? boundary + 1 - s.size() : 0;
      const size_t pos = text.find(s, from);
      if (pos == std::string::npos) continue;
      const size_t end = pos + s.size();
      if (end < best_end || (end == best_end && pos < best_start)) {
        best_end = end;
        best_start = pos;
        best_index = static_cast<int32_t>(i);
      }
    }
    if (best_index >= 0) {
      const size_t cut = include_stop_ ? best_end : best_start;
      release(update.text, cut > boundary ? cut - boundary : 0);
      pending_.clear();
      finished_ = true;
      update.reason = finish_reason::stop;
      update.stop_string_index = best_index;
      return update;
    }
  }

  if (num_generated_ >= max_tokens_) {
    update.text = flush();
    update.reason = finish_reason::length;
    return update;
  }

  // With include_stop_str_in_output a stop prefix will reach the client either way (as the start of
  // the stop string or as ordinary text), so nothing needs holding back.
  const size_t held = include_stop_ ? 0 : held_suffix_bytes();
  release(update.text, pending_.size() - held);
  return update;
}

std::string stop_checker::flush() {
  std::string out;
  if (!finished_) release(out, pending_.size());
  finished_ = true;
  return out;
}

}  // namespace tessera
