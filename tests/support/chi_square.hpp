// Pearson's chi-square goodness-of-fit test for the sampling tests: observed counts against exact
// probabilities, with cells whose expected count is below 5 pooled into one (the usual validity rule).
#pragma once
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

namespace tessera::test_support {

// Regularized upper incomplete gamma Q(a, x) = Γ(a, x) / Γ(a) (Numerical Recipes' gammq: the series
// below x < a + 1, Lentz's continued fraction above).
inline double upper_incomplete_gamma(double a, double x) {
  if (x <= 0) return 1.0;
  const double log_prefix = -x + a * std::log(x) - std::lgamma(a);
  if (x < a + 1) {
    double term = 1.0 / a, sum = term;
    for (int n = 1; n < 10000 && std::fabs(term) > std::fabs(sum) * 1e-15; ++n) {
      term *= x / (a + n);
      sum += term;
    }
    return 1.0 - sum * std::exp(log_prefix);
  }
  const double tiny = 1e-300;
  double b = x + 1 - a, c = 1 / tiny, d = 1 / b, h = d;
  for (int i = 1; i < 10000; ++i) {
    const double an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (std::fabs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1 / d;
    const double delta = d * c;
    h *= delta;
    if (std::fabs(delta - 1) < 1e-15) break;
  }
  return std::exp(log_prefix) * h;
}

struct chi_square_result {
  double statistic = 0;
  int32_t degrees_of_freedom = 0;
  double p_value = 1;
};

// `probabilities` must sum to 1 (cells of probability 0 must have no observations: that alone fails
// the test, p_value 0). Observations are the counts per cell.
inline chi_square_result chi_square(const std::vector<int64_t>& observed, const std::vector<double>& probabilities) {
  if (observed.size() != probabilities.size()) throw std::invalid_argument("chi_square: sizes differ");
  int64_t total = 0;
  for (int64_t o : observed) total += o;
  chi_square_result r;
  double pooled_expected = 0, pooled_observed = 0;
  int32_t cells = 0;
  for (size_t i = 0; i < observed.size(); ++i) {
    const double expected = probabilities[i] * static_cast<double>(total);
    if (probabilities[i] <= 0) {
      if (observed[i] > 0) return {INFINITY, 0, 0.0};
      continue;
    }
    if (expected < 5) {
      pooled_expected += expected;
      pooled_observed += static_cast<double>(observed[i]);
      continue;
    }
    const double diff = static_cast<double>(observed[i]) - expected;
    r.statistic += diff * diff / expected;
    ++cells;
  }
  if (pooled_expected > 0) {
    const double diff = pooled_observed - pooled_expected;
    r.statistic += diff * diff / pooled_expected;
    ++cells;
  }
  r.degrees_of_freedom = cells - 1;
  r.p_value = r.degrees_of_freedom > 0 ? upper_incomplete_gamma(r.degrees_of_freedom / 2.0, r.statistic / 2.0) : 1.0;
  return r;
}

}  // namespace tessera::test_support
