#include "engine/sampling_params.hpp"

#include <cmath>
#include <string>
#include <utility>

#include "engine/base/error.hpp"

namespace tessera {
namespace {

[[noreturn]] void reject(std::string_view field, const std::string& why) {
  throw invalid_request("sampling parameter '" + std::string(field) + "' " + why);
}

std::string show(float v) {
  if (std::isnan(v)) return "nan";
  return std::to_string(v);
}

void require_finite(std::string_view field, float v) {
  if (!std::isfinite(v)) reject(field, "must be a finite number, got " + show(v));
}

void require_in(std::string_view field, float v, float lo, float hi) {
  require_finite(field, v);
  if (v < lo || v > hi) { reject(field, "must be in [" + show(lo) + ", " + show(hi) + "], got " + show(v)); }
}

// RFC 3629 well-formedness: no overlongs, no surrogates, nothing above U+10FFFF. Stop strings must be
// whole characters so that cutting the output at a match never splits one.
bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    if (b0 < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    unsigned char lo = 0x80;
    unsigned char hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      len = 2;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      len = 3;
      if (b0 == 0xE0) lo = 0xA0;  // overlong
      if (b0 == 0xED) hi = 0x9F;  // surrogates
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      len = 4;
      if (b0 == 0xF0) lo = 0x90;  // overlong
      if (b0 == 0xF4) hi = 0x8F;  // > U+10FFFF
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      const unsigned char klo = k == 1 ? lo : 0x80;
      const unsigned char khi = k == 1 ? hi : 0xBF;
      if (b < klo || b > khi) return false;
    }
    i += len;
  }
  return true;
}

}  // namespace

void sampling_params::validate(int32_t vocab_size, const sampling_limits& limits) const {
  if (n < 1 || n > limits.max_n) {
    reject("n", "must be in [1, " + std::to_string(limits.max_n) + "], got " + std::to_string(n));
  }
  require_finite("temperature", temperature);
  if (temperature < 0.0f) reject("temperature", "must be >= 0, got " + show(temperature));
  require_finite("top_p", top_p);
  if (!(top_p > 0.0f && top_p <= 1.0f)) reject("top_p", "must be in (0, 1], got " + show(top_p));
  if (top_k < -1) { reject("top_k", "must be -1 or 0 (disabled) or a positive count, got " + std::to_string(top_k)); }
  require_in("min_p", min_p, 0.0f, 1.0f);
  require_finite("repetition_penalty", repetition_penalty);
  if (!(repetition_penalty > 0.0f)) { reject("repetition_penalty", "must be > 0, got " + show(repetition_penalty)); }
  require_in("presence_penalty", presence_penalty, -2.0f, 2.0f);
  require_in("frequency_penalty", frequency_penalty, -2.0f, 2.0f);

  if (std::ssize(logit_bias) > limits.max_logit_bias_entries) {
    reject("logit_bias", "has " + std::to_string(logit_bias.size()) + " entries, at most " +
                             std::to_string(limits.max_logit_bias_entries) + " allowed");
  }
  for (const auto& [token, bias] : logit_bias) {
    if (token < 0 || token >= vocab_size) {
      reject("logit_bias", "token id " + std::to_string(token) + " is outside the vocabulary [0, " +
                               std::to_string(vocab_size) + ")");
    }
    if (!std::isfinite(bias) || std::fabs(bias) > limits.max_abs_logit_bias) {
      reject("logit_bias", "bias for token " + std::to_string(token) + " must be in [-" +
                               show(limits.max_abs_logit_bias) + ", " + show(limits.max_abs_logit_bias) + "], got " +
                               show(bias));
    }
  }

  // 0: the prompt is prefilled and nothing generated (its prompt logprobs, vLLM's echo with max_tokens 0).
  if (max_tokens < 0) reject("max_tokens", "must be >= 0, got " + std::to_string(max_tokens));
  if (prompt_logprobs < -1 || prompt_logprobs > limits.max_logprobs) {
    reject("prompt_logprobs", "must be in [0, " + std::to_string(limits.max_logprobs) + "] (or -1: none), got " +
                                  std::to_string(prompt_logprobs));
  }
  if (min_tokens < 0) reject("min_tokens", "must be >= 0, got " + std::to_string(min_tokens));
  if (min_tokens > max_tokens) {
    reject("min_tokens",
           "(" + std::to_string(min_tokens) + ") must not exceed max_tokens (" + std::to_string(max_tokens) + ")");
  }

  if (std::ssize(stop) > limits.max_stop_strings) {
    reject("stop", "has " + std::to_string(stop.size()) + " strings, at most " +
                       std::to_string(limits.max_stop_strings) + " allowed");
  }
  for (size_t i = 0; i < stop.size(); ++i) {
    const std::string& s = stop[i];
    const std::string which = "string " + std::to_string(i);
    if (s.empty()) reject("stop", which + " is empty");
    if (std::ssize(s) > limits.max_stop_string_bytes) {
      reject("stop", which + " is " + std::to_string(s.size()) + " bytes, at most " +
                         std::to_string(limits.max_stop_string_bytes) + " allowed");
    }
    if (!is_valid_utf8(s)) reject("stop", which + " is not valid UTF-8");
  }

  if (std::ssize(stop_token_ids) > limits.max_stop_token_ids) {
    reject("stop_token_ids", "has " + std::to_string(stop_token_ids.size()) + " ids, at most " +
                                 std::to_string(limits.max_stop_token_ids) + " allowed");
  }
  for (token_id token : stop_token_ids) {
    if (token < 0 || token >= vocab_size) {
      reject("stop_token_ids", "token id " + std::to_string(token) + " is outside the vocabulary [0, " +
                                   std::to_string(vocab_size) + ")");
    }
  }

  if (logprobs < -1 || logprobs > limits.max_logprobs) {
    reject("logprobs",
           "must be -1 (none) or in [0, " + std::to_string(limits.max_logprobs) + "], got " + std::to_string(logprobs));
  }

  if (structured) {
    const std::string& field = structured->field;
    size_t bytes = structured->source.size();
    for (const std::string& c : structured->choices) bytes += c.size();
    if (std::cmp_greater(bytes, limits.max_structured_output_bytes)) {
      reject(field, "is " + std::to_string(bytes) + " bytes, at most " +
                        std::to_string(limits.max_structured_output_bytes) + " allowed");
    }
    if (structured->type == structured_output_spec::kind::choice) {
      if (structured->choices.empty()) reject(field, "must list at least one choice");
      if (std::ssize(structured->choices) > limits.max_choices) {
        reject(field, "lists " + std::to_string(structured->choices.size()) + " choices, at most " +
                          std::to_string(limits.max_choices) + " allowed");
      }
      for (const std::string& c : structured->choices) {
        if (!is_valid_utf8(c)) reject(field, "holds a choice that is not valid UTF-8");
      }
    } else if (structured->type != structured_output_spec::kind::json_object && structured->source.empty()) {
      reject(field, "must not be empty");
    }
  }
}

std::string_view to_string(finish_reason reason) {
  switch (reason) {
    case finish_reason::none: return "none";
    case finish_reason::stop: return "stop";
    case finish_reason::length: return "length";
    case finish_reason::abort: return "abort";
    case finish_reason::error: return "error";
  }
  return "unknown";
}

}  // namespace tessera
