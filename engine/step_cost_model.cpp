#include "engine/step_cost_model.hpp"

#include <algorithm>
#include <cmath>

namespace tessera {

namespace {

// Feature scales: a typical step's decode rows, prefill rows and attended positions. Normalizing by
// them keeps the normal equations well conditioned and makes one unit of ridge weight mean "one step's
// worth" in every direction.
constexpr std::array<double, 4> scale = {1.0, 16.0, 256.0, 1e6};
constexpr double min_prefill_token_seconds = 1e-9;

}  // namespace

int64_t chunk_attention_positions(int32_t num_computed, int32_t num_new, int32_t window) {
  if (num_new <= 0) return 0;
  // Row i attends to min(num_computed + i + 1, window) keys: a sum of 1..n terms split at the window.
  const int64_t first = int64_t{num_computed} + 1, last = int64_t{num_computed} + num_new;  // unclamped counts
  const auto sum = [](int64_t a, int64_t b) { return b < a ? 0 : (a + b) * (b - a + 1) / 2; };
  if (window <= 0 || last <= window) return sum(first, last);
  if (first > window) return int64_t{num_new} * window;
  return sum(first, window) + (last - window) * window;
}

step_cost_model::step_cost_model(const step_cost_options& options) : options_(options) {
  const step_cost_coefficients& p = options.prior;
  prior_ = {p.base * scale[0], p.decode_token * scale[1], p.prefill_token * scale[2],
            p.attention_mpos * scale[3] / 1e6};
  // The ridge is relative to the prior: each term needs a positive one.
  for (double& v : prior_) v = std::max(v, 1e-12);
  theta_ = prior_;
}

step_cost_model::vec step_cost_model::features(const step_shape& s) const {
  return {1.0, s.decode_tokens / scale[1], s.prefill_tokens / scale[2],
          static_cast<double>(s.attention_positions) / scale[3]};
}

double step_cost_model::predict(const step_shape& shape) const {
  const step_cost_coefficients c = coefficients();
  return c.base + c.decode_token * shape.decode_tokens + c.prefill_token * shape.prefill_tokens +
         c.attention_mpos * static_cast<double>(shape.attention_positions) / 1e6;
}

step_cost_coefficients step_cost_model::coefficients() const {
  step_cost_coefficients c;
  c.base = std::max(0.0, theta_[0] / scale[0]);
  c.decode_token = std::max(0.0, theta_[1] / scale[1]);
  c.prefill_token = std::max(min_prefill_token_seconds, theta_[2] / scale[2]);
  c.attention_mpos = std::max(0.0, theta_[3] / scale[3] * 1e6);
  return c;
}

void step_cost_model::observe(const step_shape& shape, double seconds) {
  if (shape.decode_tokens + shape.prefill_tokens <= 0 || !(seconds > 0) || !std::isfinite(seconds)) return;
  const double predicted = predict(shape);
  const double error = std::abs(predicted - seconds) / seconds;
  mean_relative_error_ = num_observations_ == 0 ? error : 0.9 * mean_relative_error_ + 0.1 * error;
  if (num_observations_ >= 8 && predicted > 0) seconds = std::clamp(seconds, predicted / 3, predicted * 3);
  const vec x = features(shape);
  const double g = options_.forgetting;
  // Relative errors: a 5 ms decode step and a 2 s prefill-only step count alike (in absolute terms
  // the long steps would decide the fit alone, and the steps near the target are short). Relative to
  // the prior's prediction, a function of the shape only: relative to the measured time, the steps of
  // a faster past would outweigh those of a slower present.
  double scale_seconds = 0;
  for (int i = 0; i < k; ++i) scale_seconds += prior_[i] * x[i];
  const double w = 1.0 / (scale_seconds * scale_seconds);
  for (int i = 0; i < k; ++i) {
    for (int j = 0; j < k; ++j) xtx_[i][j] = g * xtx_[i][j] + w * x[i] * x[j];
    xty_[i] = g * xty_[i] + w * x[i] * seconds;
  }
  ++num_observations_;
  solve();
}

// theta = (X'WX + R)^-1 (X'Wy + R prior), W the decayed 1 / seconds^2 weights and R the ridge
// diag(r / prior_j^2): a relative deviation from the prior costs what a step mispredicted by that
// fraction costs, r steps' worth. Gaussian elimination with partial pivoting on a 4x4 system that the
// ridge keeps positive definite.
void step_cost_model::solve() {
  const double r = options_.prior_weight;
  std::array<std::array<double, k + 1>, k> m{};
  for (int i = 0; i < k; ++i) {
    const double ridge = r / (prior_[i] * prior_[i]);
    for (int j = 0; j < k; ++j) m[i][j] = xtx_[i][j] + (i == j ? ridge : 0.0);
    m[i][k] = xty_[i] + ridge * prior_[i];
  }
  for (int c = 0; c < k; ++c) {
    int pivot = c;
    for (int i = c + 1; i < k; ++i)
      if (std::abs(m[i][c]) > std::abs(m[pivot][c])) pivot = i;
    std::swap(m[c], m[pivot]);
    if (std::abs(m[c][c]) < 1e-300) return;  // cannot happen with r > 0; keep the last fit
    for (int i = c + 1; i < k; ++i) {
      const double f = m[i][c] / m[c][c];
      for (int j = c; j <= k; ++j) m[i][j] -= f * m[c][j];
    }
  }
  vec t{};
  for (int i = k - 1; i >= 0; --i) {
    double v = m[i][k];
    for (int j = i + 1; j < k; ++j) v -= m[i][j] * t[j];
    t[i] = v / m[i][i];
  }
  for (double v : t)
    if (!std::isfinite(v)) return;
  theta_ = t;
}

}  // namespace tessera
