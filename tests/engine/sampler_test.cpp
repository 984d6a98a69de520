// Tests of sampling_params::validate and the sampler. Distribution checks compare empirical
// frequencies over many seeded draws with probabilities from a naive reference implementation
// (full sort, double-precision softmax) written independently below; fixed seeds keep them stable.
#include "engine/sampler.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "engine/base/error.hpp"
#include "engine/sampling_params.hpp"

namespace tessera {
namespace {

constexpr float neg_inf = -std::numeric_limits<float>::infinity();

// ---- reference implementation ----------------------------------------------------------------

// Probabilities after temperature, top-k, top-p and min-p, by the textbook definitions, with a
// full sort. Ranking ties go to the lower id.
std::vector<double> reference_distribution(const std::vector<float>& logits, double temperature, int top_k,
                                           double top_p, double min_p) {
  const size_t vocab = logits.size();
  std::vector<size_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return logits[a] > logits[b]; });
  std::vector<bool> kept(vocab, true);
  if (top_k > 0) {
    for (size_t r = static_cast<size_t>(top_k); r < vocab; ++r) kept[order[r]] = false;
  }
  auto softmax_over_kept = [&] {
    std::vector<double> p(vocab, 0.0);
    double z = 0.0;
    for (size_t i = 0; i < vocab; ++i) {
      if (kept[i]) z += std::exp(logits[i] / temperature);
    }
    for (size_t i = 0; i < vocab; ++i) {
      if (kept[i]) p[i] = std::exp(logits[i] / temperature) / z;
    }
    return p;
  };
  std::vector<double> p = softmax_over_kept();
  if (top_p < 1.0) {
    double above = 0.0;
    for (size_t r = 0; r < vocab; ++r) {
      const size_t i = order[r];
      if (!kept[i]) continue;
      if (above >= top_p) kept[i] = false;
      above += p[i];
    }
    p = softmax_over_kept();
  }
  if (min_p > 0.0) {
    const double p_max = *std::max_element(p.begin(), p.end());
    for (size_t i = 0; i < vocab; ++i) {
      if (p[i] < min_p * p_max) kept[i] = false;
    }
    p = softmax_over_kept();
  }
  return p;
}

// Upper 0.1% point of chi-square with `df` degrees of freedom (Wilson-Hilferty approximation).
double chi_square_critical(int df) {
  const double z = 3.09;
  const double k = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - k + z * std::sqrt(k), 3.0);
}

std::vector<int> draw_counts(const sampling_params& params, const std::vector<float>& logits, int num_draws) {
  sampler s(params, 0, {});
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < num_draws; ++i) ++counts[static_cast<size_t>(s.sample(logits).token)];
  return counts;
}

// Support must match exactly; frequencies must pass a chi-square test (bins with tiny expectation
// are pooled so the test stays valid).
void expect_matches_distribution(const std::vector<int>& counts, const std::vector<double>& expected, int num_draws) {
  double chi2 = 0.0;
  int df = -1;
  double pooled_expected = 0.0;
  double pooled_observed = 0.0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (expected[i] == 0.0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " is outside the support";
      continue;
    }
    const double e = expected[i] * num_draws;
    if (e < 5.0) {
      pooled_expected += e;
      pooled_observed += counts[i];
      continue;
    }
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
    ++df;
  }
  if (pooled_expected > 0.0) {
    chi2 += (pooled_observed - pooled_expected) * (pooled_observed - pooled_expected) / std::max(pooled_expected, 1.0);
    ++df;
  }
  if (df >= 1) { EXPECT_LT(chi2, chi_square_critical(df)) << "df=" << df; }
}

const std::vector<float> k_logits = {1.0f, 2.5f, 0.2f, -1.0f, 2.0f, 0.9f, -0.3f, 1.7f, 3.0f, 0.0f};

std::vector<float> random_logits(size_t vocab, float stddev, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> out(vocab);
  for (float& x : out) x = normal(rng);
  return out;
}

sampling_params seeded(uint64_t seed) {
  sampling_params p;
  p.seed = seed;
  return p;
}

// ---- validation -------------------------------------------------------------------------------

struct bad_case {
  const char* field;
  std::function<void(sampling_params&)> mutate;
};

TEST(SamplingParamsTest, DefaultsAndEdgeValuesAreValid) {
  EXPECT_NO_THROW(sampling_params{}.validate(100));
  sampling_params p;
  p.n = 16;
  p.temperature = 0.0f;
  p.top_p = 1.0f;
  p.top_k = 0;
  p.min_p = 1.0f;
  p.repetition_penalty = 0.01f;
  p.presence_penalty = -2.0f;
  p.frequency_penalty = 2.0f;
  p.logit_bias = {{0, -100.0f}, {99, 100.0f}};
  p.max_tokens = 5;
  p.min_tokens = 5;
  p.stop = std::vector<std::string>(16, std::string(256, 'x'));
  p.stop_token_ids = {0, 99};
  p.logprobs = 20;
  EXPECT_NO_THROW(p.validate(100));
  p.top_k = -1;
  p.logprobs = 0;
  p.stop = {"\xC3\xA9t\xC3\xA9", "\xF0\x9F\x98\x80"};  // "été", an emoji
  EXPECT_NO_THROW(p.validate(100));
}

TEST(SamplingParamsTest, EveryBadValueIsRejectedNamingTheField) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<bad_case> cases = {
      {"n", [](sampling_params& p) { p.n = 0; }},
      {"n", [](sampling_params& p) { p.n = 17; }},
      {"temperature", [](sampling_params& p) { p.temperature = -0.1f; }},
      {"temperature", [nan](sampling_params& p) { p.temperature = nan; }},
      {"temperature", [inf](sampling_params& p) { p.temperature = inf; }},
      {"top_p", [](sampling_params& p) { p.top_p = 0.0f; }},
      {"top_p", [](sampling_params& p) { p.top_p = 1.01f; }},
      {"top_p", [nan](sampling_params& p) { p.top_p = nan; }},
      {"top_k", [](sampling_params& p) { p.top_k = -2; }},
      {"min_p", [](sampling_params& p) { p.min_p = -0.01f; }},
      {"min_p", [](sampling_params& p) { p.min_p = 1.5f; }},
      {"min_p", [nan](sampling_params& p) { p.min_p = nan; }},
      {"repetition_penalty", [](sampling_params& p) { p.repetition_penalty = 0.0f; }},
      {"repetition_penalty", [](sampling_params& p) { p.repetition_penalty = -1.0f; }},
      {"repetition_penalty", [nan](sampling_params& p) { p.repetition_penalty = nan; }},
      {"presence_penalty", [](sampling_params& p) { p.presence_penalty = 2.5f; }},
      {"presence_penalty", [](sampling_params& p) { p.presence_penalty = -2.01f; }},
      {"frequency_penalty", [](sampling_params& p) { p.frequency_penalty = -3.0f; }},
      {"frequency_penalty", [nan](sampling_params& p) { p.frequency_penalty = nan; }},
      {"logit_bias",
       [](sampling_params& p) {
         p.logit_bias = {{100, 1.0f}};
       }},
      {"logit_bias",
       [](sampling_params& p) {
         p.logit_bias = {{-1, 1.0f}};
       }},
      {"logit_bias",
       [](sampling_params& p) {
         p.logit_bias = {{3, 100.5f}};
       }},
      {"logit_bias",
       [](sampling_params& p) {
         p.logit_bias = {{3, -101.0f}};
       }},
      {"logit_bias",
       [nan](sampling_params& p) {
         p.logit_bias = {{3, nan}};
       }},
      {"logit_bias",
       [](sampling_params& p) {
         p.logit_bias.assign(1025, {1, 1.0f});
       }},
      {"max_tokens", [](sampling_params& p) { p.max_tokens = -1; }},  // 0 is a prefill only (prompt logprobs)
      {"max_tokens", [](sampling_params& p) { p.max_tokens = -5; }},
      {"min_tokens", [](sampling_params& p) { p.min_tokens = -1; }},
      {"min_tokens", [](sampling_params& p) { p.min_tokens = 17; }},  // > max_tokens (16)
      {"stop", [](sampling_params& p) { p.stop = std::vector<std::string>(17, "x"); }},
      {"stop",
       [](sampling_params& p) {
         p.stop = {"ok", std::string(257, 'x')};
       }},
      {"stop", [](sampling_params& p) { p.stop = {""}; }},
      {"stop", [](sampling_params& p) { p.stop = {"\xC3"}; }},          // truncated character
      {"stop", [](sampling_params& p) { p.stop = {"a\xC0\xAF"}; }},     // overlong '/'
      {"stop", [](sampling_params& p) { p.stop = {"\xED\xA0\x80"}; }},  // surrogate
      {"stop_token_ids",
       [](sampling_params& p) {
         p.stop_token_ids = {5, 100};
       }},
      {"stop_token_ids", [](sampling_params& p) { p.stop_token_ids = {-3}; }},
      {"stop_token_ids", [](sampling_params& p) { p.stop_token_ids.assign(65, 1); }},
      {"logprobs", [](sampling_params& p) { p.logprobs = 21; }},
      {"logprobs", [](sampling_params& p) { p.logprobs = -2; }},
      {"prompt_logprobs", [](sampling_params& p) { p.prompt_logprobs = 21; }},
      {"prompt_logprobs", [](sampling_params& p) { p.prompt_logprobs = -2; }},
  };
  ASSERT_GE(cases.size(), 20u);
  for (const bad_case& c : cases) {
    sampling_params p;
    c.mutate(p);
    try {
      p.validate(100);
      ADD_FAILURE() << "accepted a bad '" << c.field << "'";
    } catch (const invalid_request& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + c.field + "'"), std::string::npos)
          << "message does not name '" << c.field << "': " << e.what();
    }
  }
}

TEST(SamplingParamsTest, LimitsAreConfigurable) {
  sampling_limits limits;
  limits.max_n = 2;
  limits.max_logprobs = 5;
  sampling_params p;
  p.n = 3;
  EXPECT_THROW(p.validate(10, limits), invalid_request);
  p.n = 2;
  p.logprobs = 6;
  EXPECT_THROW(p.validate(10, limits), invalid_request);
  p.logprobs = 5;
  EXPECT_NO_THROW(p.validate(10, limits));
}

TEST(SamplingParamsTest, FinishReasonNames) {
  EXPECT_EQ(to_string(finish_reason::none), "none");
  EXPECT_EQ(to_string(finish_reason::stop), "stop");
  EXPECT_EQ(to_string(finish_reason::length), "length");
  EXPECT_EQ(to_string(finish_reason::abort), "abort");
  EXPECT_EQ(to_string(finish_reason::error), "error");
}

// ---- greedy -----------------------------------------------------------------------------------

TEST(SamplerTest, GreedyIsArgmaxWithLowestIdOnTies) {
  for (uint32_t trial = 0; trial < 20; ++trial) {
    std::vector<float> logits = random_logits(1000, 2.0f, trial);
    // Plant a tie for the maximum at two ids.
    const auto top = static_cast<size_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    const size_t twin = (top * 7 + 13) % logits.size();
    logits[twin] = logits[top];
    sampling_params p;
    p.temperature = 0.0f;
    sampler s(p, 0, {});
    EXPECT_EQ(s.sample(logits).token, static_cast<token_id>(std::min(top, twin)));
  }
}

TEST(SamplerTest, GreedyIgnoresTheRandomStream) {
  sampling_params p;
  p.temperature = 0.0f;
  sampler a(p, 0, {});
  p.seed = 42;
  sampler b(p, 3, {});
  for (int step = 0; step < 10; ++step) {
    const std::vector<float> logits = random_logits(50, 1.0f, static_cast<uint32_t>(step));
    EXPECT_EQ(a.sample(logits).token, b.sample(logits).token);
  }
}

TEST(SamplerTest, NanLogitsAreNeverChosen) {
  std::vector<float> logits(8, 0.0f);
  logits[2] = std::numeric_limits<float>::quiet_NaN();
  logits[5] = 1.0f;
  sampling_params p = seeded(1);
  sampler s(p, 0, {});
  for (int i = 0; i < 200; ++i) EXPECT_NE(s.sample(logits).token, 2);
  p.temperature = 0.0f;
  sampler g(p, 0, {});
  EXPECT_EQ(g.sample(logits).token, 5);
}

TEST(SamplerTest, UnvalidatedNanParametersStillGiveATokenInRange) {
  // validate() rejects these; a sampler built without it must still not misbehave (sorting NaN
  // would break the ordering the selection algorithms rely on).
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> logits = random_logits(3000, 1.0f, 5);
  const auto top = static_cast<token_id>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  const std::vector<std::function<void(sampling_params&)>> breakers = {
      [nan](sampling_params& p) { p.temperature = nan; },
      [nan](sampling_params& p) {
        p.temperature = nan;
        p.top_k = 500;
      },
      [nan](sampling_params& p) {
        p.temperature = nan;
        p.top_k = 40;
        p.top_p = 0.5f;
      },
      [nan](sampling_params& p) {
        p.logit_bias = {{0, nan}, {1, nan}};
        p.top_p = 0.9f;
      },
      [nan](sampling_params& p) { p.repetition_penalty = nan; },
      [nan](sampling_params& p) {
        p.frequency_penalty = nan;
        p.top_k = 1000;
      },
      [nan](sampling_params& p) {
        p.temperature = 0.0f;
        p.presence_penalty = nan;
      },
  };
  const std::vector<token_id> prompt = {top, 1, 2};
  for (size_t b = 0; b < breakers.size(); ++b) {
    sampling_params p = seeded(b);
    breakers[b](p);
    sampler s(p, 0, prompt);
    s.append_external_token(top);
    for (int i = 0; i < 20; ++i) {
      const token_id t = s.sample(logits).token;
      ASSERT_GE(t, 0) << "case " << b;
      ASSERT_LT(t, 3000) << "case " << b;
    }
  }
}

TEST(SamplerTest, InfiniteAndHugeLogitsStaySampleable) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> logits = {0.0f, inf, 3e38f, -inf, 1e30f};
  sampling_params p = seeded(2);
  p.temperature = 1e-4f;  // scales the huge logits past the float range
  p.repetition_penalty = 0.5f;
  p.top_p = 0.9f;
  p.logprobs = 2;
  const std::vector<token_id> prompt = {2};
  sampler s(p, 0, prompt);
  std::set<token_id> seen;
  for (int i = 0; i < 50; ++i) {
    const sample_result r = s.sample(logits);
    EXPECT_TRUE(r.token == 1 || r.token == 2) << r.token;
    EXPECT_FALSE(std::isnan(r.logprob));
    seen.insert(r.token);
  }
  // Both saturate at the largest float, so they stay equally likely (no fallback to the argmax).
  EXPECT_EQ(seen.size(), 2u);
}

// ---- distributions ----------------------------------------------------------------------------

struct distribution_case {
  float temperature;
  int top_k;
  float top_p;
  float min_p;
};

TEST(SamplerTest, FrequenciesMatchTheReferenceDistribution) {
  const std::vector<distribution_case> cases = {
      {1.0f, -1, 1.0f, 0.0f}, {0.5f, -1, 1.0f, 0.0f},  {2.0f, 0, 1.0f, 0.0f},  {1.0f, 3, 1.0f, 0.0f},
      {1.0f, -1, 0.7f, 0.0f}, {1.0f, -1, 1.0f, 0.2f},  {0.8f, 6, 0.9f, 0.05f}, {1.5f, 5, 0.5f, 0.0f},
      {1.0f, 1, 1.0f, 0.0f},  {1.0f, -1, 0.01f, 0.0f}, {1.0f, 20, 1.0f, 0.0f},
  };
  const int num_draws = 20000;
  uint64_t seed = 1000;
  for (const distribution_case& c : cases) {
    SCOPED_TRACE(testing::Message() << "T=" << c.temperature << " k=" << c.top_k << " p=" << c.top_p
                                    << " min_p=" << c.min_p);
    sampling_params p = seeded(seed++);
    p.temperature = c.temperature;
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    ASSERT_NO_THROW(p.validate(static_cast<int32_t>(k_logits.size())));
    const std::vector<double> expected = reference_distribution(k_logits, c.temperature, c.top_k, c.top_p, c.min_p);
    expect_matches_distribution(draw_counts(p, k_logits, num_draws), expected, num_draws);
  }
}

TEST(SamplerTest, TruncationKeepsExactlyTheReferenceSupport) {
  // Cases whose supports differ, so a wrong cut shows up as a token outside (or missing from) it.
  const std::vector<distribution_case> cases = {
      {1.0f, 3, 1.0f, 0.0f},
      {1.0f, -1, 0.7f, 0.0f},
      {1.0f, -1, 1.0f, 0.3f},
      {1.0f, -1, 0.9f, 0.0f},
  };
  for (const distribution_case& c : cases) {
    sampling_params p = seeded(7);
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    const std::vector<double> expected = reference_distribution(k_logits, c.temperature, c.top_k, c.top_p, c.min_p);
    const std::vector<int> counts = draw_counts(p, k_logits, 5000);
    for (size_t i = 0; i < k_logits.size(); ++i) {
      EXPECT_EQ(counts[i] > 0, expected[i] > 0.0)
          << "token " << i << " top_k=" << c.top_k << " top_p=" << c.top_p << " min_p=" << c.min_p;
    }
  }
}

TEST(SamplerTest, TopPCutsInsideRunsOfEqualAndNearlyEqualTokens) {
  // Equal logits (ties go to the lower id) and logits within a few percent of each other, so the
  // top-p cut falls among tokens of similar weight rather than between well-separated ones.
  const std::vector<std::vector<float>> rows = {
      {0.0f, 1.0f, 2.0f, 1.0f, 1.0f, 0.0f, 1.0f, 0.0f, 1.0f, 0.0f},
      {1.000f, 1.002f, 1.004f, 1.006f, 1.008f, 1.010f, 1.012f, 1.014f, 0.0f, 0.0f},
  };
  for (size_t row = 0; row < rows.size(); ++row) {
    for (float top_p : {0.3f, 0.45f, 0.6f, 0.75f, 0.9f}) {
      sampling_params p = seeded(11);
      p.top_p = top_p;
      const std::vector<double> expected = reference_distribution(rows[row], 1.0, -1, top_p, 0.0);
      const std::vector<int> counts = draw_counts(p, rows[row], 4000);
      for (size_t i = 0; i < rows[row].size(); ++i) {
        EXPECT_EQ(counts[i] > 0, expected[i] > 0.0) << "row " << row << " top_p=" << top_p << " token " << i;
      }
    }
  }
}

TEST(SamplerTest, LargeTopKBreaksTiesTowardsLowerIds) {
  // Four logit levels, so the cut at k falls inside a run of equal logits; k > 256 also takes the
  // histogram selection path. Levels are close, so 12000 draws reach every kept token.
  const size_t vocab = 1000;
  std::vector<float> logits(vocab);
  std::mt19937 rng(31);
  std::uniform_int_distribution<int> level(0, 3);
  for (float& x : logits) x = 0.05f * static_cast<float>(level(rng));
  for (int k : {300, 600}) {
    sampling_params p = seeded(static_cast<uint64_t>(k));
    p.top_k = k;
    const std::vector<double> expected = reference_distribution(logits, 1.0, k, 1.0, 0.0);
    const std::vector<int> counts = draw_counts(p, logits, 12000);
    for (size_t i = 0; i < vocab; ++i) { ASSERT_EQ(counts[i] > 0, expected[i] > 0.0) << "k=" << k << " token " << i; }
  }
}

TEST(SamplerTest, LargeVocabularyNucleusMatchesReferenceByProbabilityBins) {
  // Flat logits make the nucleus thousands of tokens wide, beyond the first sorted chunk.
  const std::vector<float> logits = random_logits(20000, 0.5f, 99);
  sampling_params p = seeded(5);
  p.top_p = 0.6f;
  p.top_k = 16000;
  p.temperature = 0.9f;
  const std::vector<double> expected = reference_distribution(logits, 0.9, 16000, 0.6, 0.0);
  size_t support = 0;
  for (double x : expected) support += x > 0.0;
  ASSERT_GT(support, 2000u);

  // Bin tokens by reference rank into 10 bins of equal reference mass; compare bin frequencies.
  std::vector<size_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return expected[a] > expected[b]; });
  std::vector<int> bin_of(logits.size(), -1);
  std::vector<double> bin_mass(10, 0.0);
  double cumulative = 0.0;
  for (size_t i : order) {
    if (expected[i] == 0.0) break;
    const int bin = std::min(9, static_cast<int>(cumulative * 10.0));
    bin_of[i] = bin;
    bin_mass[static_cast<size_t>(bin)] += expected[i];
    cumulative += expected[i];
  }
  const int num_draws = 1500;
  sampler s(p, 0, {});
  std::vector<int> bin_counts(10, 0);
  for (int d = 0; d < num_draws; ++d) {
    const token_id t = s.sample(logits).token;
    ASSERT_GE(bin_of[static_cast<size_t>(t)], 0) << "token " << t << " is outside the nucleus";
    ++bin_counts[static_cast<size_t>(bin_of[static_cast<size_t>(t)])];
  }
  expect_matches_distribution(bin_counts, bin_mass, num_draws);
}

// ---- logit processors -------------------------------------------------------------------------

TEST(SamplerTest, RepetitionPenaltyDividesPositiveAndMultipliesNegativeSeenLogits) {
  sampling_params p;
  p.repetition_penalty = 2.0f;
  const std::vector<token_id> prompt = {0, 1, 1};
  sampler s(p, 0, prompt);
  s.append_external_token(2);
  std::vector<float> logits = {2.0f, -1.0f, 0.5f, 3.0f, -4.0f};
  s.process_logits(logits);
  EXPECT_EQ(logits, (std::vector<float>{1.0f, -2.0f, 0.25f, 3.0f, -4.0f}));

  // Penalized once per distinct token, however often it appeared.
  s.append_external_token(2);
  s.append_external_token(0);
  std::vector<float> again = {2.0f, -1.0f, 0.5f, 3.0f, -4.0f};
  s.process_logits(again);
  EXPECT_EQ(again, (std::vector<float>{1.0f, -2.0f, 0.25f, 3.0f, -4.0f}));
}

TEST(SamplerTest, PresenceAndFrequencyPenaltiesCountGeneratedTokensOnly) {
  sampling_params p;
  p.presence_penalty = 1.0f;
  p.frequency_penalty = 0.5f;
  const std::vector<token_id> prompt = {3, 3, 3};
  sampler s(p, 0, prompt);
  for (token_id t : {1, 1, 2}) s.append_external_token(t);
  std::vector<float> logits(4, 0.0f);
  s.process_logits(logits);
  // token 1: -(0.5 * 2) - 1; token 2: -(0.5 * 1) - 1; token 3 only in the prompt.
  EXPECT_EQ(logits, (std::vector<float>{0.0f, -2.0f, -1.5f, 0.0f}));

  p.presence_penalty = -0.5f;
  p.frequency_penalty = 0.0f;
  sampler encourage(p, 0, prompt);
  encourage.append_external_token(0);
  std::vector<float> boosted(4, 1.0f);
  encourage.process_logits(boosted);
  EXPECT_EQ(boosted, (std::vector<float>{1.5f, 1.0f, 1.0f, 1.0f}));
}

TEST(SamplerTest, ProcessingOrderIsBiasThenPenaltiesThenTemperature) {
  sampling_params p;
  p.logit_bias = {{0, 1.0f}};
  p.repetition_penalty = 2.0f;
  p.frequency_penalty = 1.0f;
  p.temperature = 0.5f;
  const std::vector<token_id> prompt = {0};
  sampler s(p, 0, prompt);
  s.append_external_token(0);
  std::vector<float> logits = {1.0f, 1.0f};
  s.process_logits(logits);
  // token 0: bias 1 + 1 = 2; repetition 2 / 2 = 1; frequency 1 - 1 = 0; temperature 0 / 0.5 = 0.
  // token 1: untouched but for temperature: 1 / 0.5.
  EXPECT_EQ(logits, (std::vector<float>{0.0f, 2.0f}));
}

TEST(SamplerTest, LogitBiasForcesAndForbidsTokens) {
  const std::vector<float> logits = random_logits(200, 3.0f, 11);
  sampling_params p = seeded(3);
  p.logit_bias = {{7, 100.0f}};
  sampler forced(p, 0, {});
  for (int i = 0; i < 100; ++i) EXPECT_EQ(forced.sample(logits).token, 7);

  const auto top = static_cast<token_id>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  p.temperature = 0.0f;
  p.logit_bias = {{top, -100.0f}};
  sampler banned(p, 0, {});
  EXPECT_NE(banned.sample(logits).token, top);
}

TEST(SamplerTest, MinTokensMasksEosAndStopTokensUntilReached) {
  // EOS (id 4) and stop token 2 dominate the logits.
  const std::vector<float> logits = {0.0f, 0.0f, 30.0f, 0.0f, 40.0f};
  const std::vector<token_id> eos = {4};
  sampling_params p = seeded(9);
  p.min_tokens = 3;
  p.stop_token_ids = {2};
  sampler s(p, 0, {}, eos);
  for (int i = 0; i < 3; ++i) {
    const token_id t = s.sample(logits).token;
    EXPECT_TRUE(t != 4 && t != 2) << "step " << i << " drew " << t;
  }
  EXPECT_EQ(s.sample(logits).token, 4);

  // With ignore_eos, EOS is an ordinary token; the stop tokens are still masked.
  p.ignore_eos = true;
  sampler ignoring(p, 0, {}, eos);
  EXPECT_EQ(ignoring.sample(logits).token, 4);
  std::vector<float> processed = logits;
  ignoring.process_logits(processed);
  EXPECT_EQ(processed[2], neg_inf);
}

TEST(SamplerTest, EverythingMaskedFallsBackToRawArgmax) {
  const std::vector<float> logits = {1.0f, 5.0f};
  const std::vector<token_id> eos = {0, 1};
  sampling_params p = seeded(1);
  p.min_tokens = 1;
  sampler s(p, 0, {}, eos);
  EXPECT_EQ(s.sample(logits).token, 1);
  p.temperature = 0.0f;
  sampler g(p, 0, {}, eos);
  EXPECT_EQ(g.sample(logits).token, 1);
}

TEST(SamplerTest, PenaltiesChangeTheSampledDistribution) {
  // After drawing token 0 once, a frequency penalty of 2 makes it e^2 times less likely.
  const std::vector<float> logits = {0.0f, 0.0f};
  sampling_params p = seeded(77);
  p.frequency_penalty = 2.0f;
  int zeros = 0;
  const int trials = 4000;
  for (int t = 0; t < trials; ++t) {
    p.seed = static_cast<uint64_t>(t);
    sampler s(p, 0, {});
    s.append_external_token(0);
    zeros += s.sample(logits).token == 0;
  }
  const double expected = 1.0 / (1.0 + std::exp(2.0));
  EXPECT_NEAR(zeros / static_cast<double>(trials), expected, 4.0 * std::sqrt(expected / trials));
}

// ---- determinism ------------------------------------------------------------------------------

std::vector<token_id> run(sampler& s, int steps, uint32_t logits_seed) {
  std::vector<token_id> out;
  for (int i = 0; i < steps; ++i) {
    out.push_back(s.sample(random_logits(300, 1.0f, logits_seed + static_cast<uint32_t>(i))).token);
  }
  return out;
}

TEST(SamplerTest, SameSeedSameTokensWhateverElseIsSampled) {
  sampling_params p = seeded(1234);
  p.top_p = 0.95f;
  sampler alone(p, 0, {});
  const std::vector<token_id> expected = run(alone, 40, 0);

  // Interleave with other sequences (other params, other vocabulary sizes) step by step.
  sampler again(p, 0, {});
  sampling_params other_params = seeded(5);
  other_params.top_k = 3;
  sampler other(other_params, 1, {});
  sampling_params unseeded;
  sampler noise(unseeded, 0, {});
  std::vector<token_id> got;
  for (int i = 0; i < 40; ++i) {
    other.sample(random_logits(1000, 2.0f, 500 + static_cast<uint32_t>(i)));
    got.push_back(again.sample(random_logits(300, 1.0f, static_cast<uint32_t>(i))).token);
    noise.sample(random_logits(77, 1.0f, 900 + static_cast<uint32_t>(i)));
  }
  EXPECT_EQ(got, expected);
}

TEST(SamplerTest, DifferentSeedsDiffer) {
  sampler a(seeded(1), 0, {});
  sampler b(seeded(2), 0, {});
  EXPECT_NE(run(a, 40, 0), run(b, 40, 0));
  sampler c(sampling_params{}, 0, {});
  sampler d(sampling_params{}, 0, {});
  EXPECT_NE(run(c, 40, 0), run(d, 40, 0));  // unseeded: fresh random seeds
}

TEST(SamplerTest, ForksDifferButAreReproducible) {
  const sampling_params p = seeded(42);
  std::set<std::vector<token_id>> distinct;
  for (uint64_t fork = 0; fork < 4; ++fork) {
    sampler first(p, fork, {});
    sampler second(p, fork, {});
    const std::vector<token_id> tokens = run(first, 30, 0);
    EXPECT_EQ(tokens, run(second, 30, 0)) << "fork " << fork;
    distinct.insert(tokens);
    EXPECT_EQ(first.stream_key(), sampler::derive_stream_key(42, fork));
  }
  EXPECT_EQ(distinct.size(), 4u);
}

TEST(SamplerTest, OneDrawPerOutputPositionKeyedByStreamAndPosition) {
  // Two equally likely tokens, no truncation: candidates in id order, so the token is 0 exactly
  // when the position's uniform draw is below 1/2.
  const std::vector<float> logits = {0.0f, 0.0f};
  sampler s(seeded(8), 2, {});
  s.append_external_token(1);  // a forced token still advances the position
  for (uint64_t position = 1; position < 50; ++position) {
    const double u = sampler::uniform_draw(s.stream_key(), position);
    EXPECT_EQ(s.sample(logits).token, u < 0.5 ? 0 : 1) << "position " << position;
  }
  EXPECT_EQ(s.num_generated(), 50);
}

TEST(SamplerTest, UniformDrawsLookUniform) {
  const int n = 100000;
  std::vector<int> bins(20, 0);
  for (int i = 0; i < n; ++i) {
    const double u = sampler::uniform_draw(sampler::derive_stream_key(3, 0), static_cast<uint64_t>(i));
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    ++bins[static_cast<size_t>(u * 20)];
  }
  double chi2 = 0.0;
  const double e = n / 20.0;
  for (int b : bins) chi2 += (b - e) * (b - e) / e;
  EXPECT_LT(chi2, chi_square_critical(19));
}

// ---- logprobs ---------------------------------------------------------------------------------

std::vector<double> naive_log_softmax(const std::vector<float>& logits) {
  double z = 0.0;
  for (float x : logits) z += std::exp(static_cast<double>(x));
  std::vector<double> out;
  for (float x : logits) out.push_back(std::log(std::exp(static_cast<double>(x)) / z));
  return out;
}

TEST(SamplerTest, LogprobsAreThoseOfTheRawDistribution) {
  sampling_params p = seeded(17);
  p.logprobs = 5;
  p.temperature = 0.5f;  // processing must not leak into the reported logprobs
  p.top_k = 10;
  p.repetition_penalty = 1.5f;
  const std::vector<token_id> prompt = {1, 2, 3};
  sampler s(p, 0, prompt);
  for (uint32_t step = 0; step < 10; ++step) {
    const std::vector<float> logits = random_logits(500, 2.0f, 300 + step);
    const std::vector<double> reference = naive_log_softmax(logits);
    const sample_result r = s.sample(logits);
    EXPECT_NEAR(r.logprob, reference[static_cast<size_t>(r.token)], 1e-4);

    std::vector<size_t> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return logits[a] > logits[b]; });
    ASSERT_EQ(r.top_logprobs.size(), 5u);
    for (size_t i = 0; i < 5; ++i) {
      EXPECT_EQ(r.top_logprobs[i].first, static_cast<token_id>(order[i]));
      EXPECT_NEAR(r.top_logprobs[i].second, reference[order[i]], 1e-4);
    }
  }
}

TEST(SamplerTest, LogprobsTiesListLowerIdsFirstAndZeroMeansSampledOnly) {
  sampling_params p = seeded(4);
  p.logprobs = 3;
  const std::vector<float> logits = {1.0f, 2.0f, 2.0f, 0.0f, 2.0f};
  sampler s(p, 0, {});
  const sample_result r = s.sample(logits);
  ASSERT_EQ(r.top_logprobs.size(), 3u);
  EXPECT_EQ(r.top_logprobs[0].first, 1);
  EXPECT_EQ(r.top_logprobs[1].first, 2);
  EXPECT_EQ(r.top_logprobs[2].first, 4);

  p.logprobs = 0;
  sampler only(p, 0, {});
  const sample_result sampled_only = only.sample(logits);
  EXPECT_TRUE(sampled_only.top_logprobs.empty());
  EXPECT_NEAR(sampled_only.logprob, naive_log_softmax(logits)[static_cast<size_t>(sampled_only.token)], 1e-5);

  sampler none(seeded(4), 0, {});
  const sample_result no_logprobs = none.sample(logits);
  EXPECT_TRUE(no_logprobs.top_logprobs.empty());
  EXPECT_EQ(no_logprobs.logprob, 0.0f);
}

TEST(SamplerTest, LogprobsRequestedBeyondTheVocabularyListEveryToken) {
  sampling_params p = seeded(4);
  p.logprobs = 20;
  const std::vector<float> logits = {0.5f, -0.5f, 1.5f};
  sampler s(p, 0, {});
  const sample_result r = s.sample(logits);
  ASSERT_EQ(r.top_logprobs.size(), 3u);
  EXPECT_EQ(r.top_logprobs[0].first, 2);
  EXPECT_EQ(r.top_logprobs[2].first, 1);
}

}  // namespace
}  // namespace tessera
