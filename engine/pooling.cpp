#include "engine/pooling.hpp"

#include <algorithm>
#include <cmath>

namespace tessera {

std::string_view to_string(pooling_type type) {
  switch (type) {
    case pooling_type::none: return "none";
    case pooling_type::mean: return "mean";
    case pooling_type::last: return "last";
  }
  return "?";
}

std::optional<pooling_type> parse_pooling_type(std::string_view name) {
  if (name == "mean") return pooling_type::mean;
  if (name == "last") return pooling_type::last;
  return std::nullopt;
}

embedding_pool::embedding_pool(pooling_type type, int32_t hidden_size)
    : type_(type), sum_(static_cast<size_t>(hidden_size), 0.0) {}

void embedding_pool::reset() {
  std::fill(sum_.begin(), sum_.end(), 0.0);
  num_tokens_ = 0;
  num_missing_ = 0;
}

void embedding_pool::add(std::span<const float> row, int32_t num_tokens) {
  num_tokens_ += num_tokens;
  if (row.empty()) {
    num_missing_ += type_ == pooling_type::mean && num_tokens > 0;
    return;
  }
  const size_t n = std::min(row.size(), sum_.size());
  if (type_ == pooling_type::last) {
    for (size_t i = 0; i < n; ++i) sum_[i] = row[i];
  } else {
    for (size_t i = 0; i < n; ++i) sum_[i] += row[i];
  }
}

std::vector<float> embedding_pool::finish() const {
  const double count = type_ == pooling_type::mean && num_tokens_ > 0 ? num_tokens_ : 1.0;
  double norm = 0;
  for (double v : sum_) norm += (v / count) * (v / count);
  norm = std::sqrt(norm);
  std::vector<float> out(sum_.size());
  for (size_t i = 0; i < sum_.size(); ++i) out[i] = static_cast<float>(norm > 0 ? sum_[i] / count / norm : 0.0);
  return out;
}

}  // namespace tessera
