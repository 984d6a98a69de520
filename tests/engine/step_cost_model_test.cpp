// The step cost model (engine/step_cost_model.hpp) on synthetic step times: no clock anywhere, the
// "measured" seconds come from a known linear cost plus noise, so every expectation is exact arithmetic.
#include "engine/step_cost_model.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace tessera {
namespace {

struct true_cost {
  step_cost_coefficients c;
  double operator()(const step_shape& s) const {
    return c.base + c.decode_token * s.decode_tokens + c.prefill_token * s.prefill_tokens +
           c.attention_mpos * static_cast<double>(s.attention_positions) / 1e6;
  }
};

// A serving-like mix: decode-only steps, mixed steps with prompt chunks of varied size and depth.
step_shape random_step(std::mt19937& rng) {
  std::uniform_int_distribution<int> decodes(0, 32), chunk(0, 512), depth(0, 4000), kind(0, 2);
  step_shape s;
  s.decode_tokens = decodes(rng);
  for (int i = 0; i < s.decode_tokens; ++i) s.attention_positions += chunk_attention_positions(depth(rng), 1);
  if (kind(rng) != 0 || s.decode_tokens == 0) {
    const int n = 1 + chunk(rng);
    s.prefill_tokens = n;
    s.attention_positions += chunk_attention_positions(depth(rng), n);
  }
  return s;
}

TEST(step_cost_model, attention_positions_of_a_chunk) {
  EXPECT_EQ(chunk_attention_positions(0, 1), 1);
  EXPECT_EQ(chunk_attention_positions(0, 4), 1 + 2 + 3 + 4);
  EXPECT_EQ(chunk_attention_positions(10, 3), 11 + 12 + 13);
  EXPECT_EQ(chunk_attention_positions(10, 0), 0);
  // With a window of 12: rows see 11, 12, 12 keys.
  EXPECT_EQ(chunk_attention_positions(10, 3, 12), 11 + 12 + 12);
  EXPECT_EQ(chunk_attention_positions(100, 3, 12), 3 * 12);
  EXPECT_EQ(chunk_attention_positions(0, 5, 3), 1 + 2 + 3 + 3 + 3);
  int64_t brute = 0;
  for (int64_t p = 777; p < 777 + 300; ++p) brute += std::min<int64_t>(p + 1, 1000);
  EXPECT_EQ(chunk_attention_positions(777, 300, 1000), brute);
}

TEST(step_cost_model, predicts_from_the_prior_before_any_data) {
  step_cost_options o;
  o.prior = {0.01, 0.001, 0.002, 0.5};
  const step_cost_model m(o);
  EXPECT_EQ(m.num_observations(), 0);
  EXPECT_DOUBLE_EQ(m.predict({4, 100, 2'000'000}), 0.01 + 0.004 + 0.2 + 1.0);
  EXPECT_DOUBLE_EQ(m.mean_relative_error(), 0.0);
}

TEST(step_cost_model, converges_on_synthetic_steps) {
  // A machine 2-5x faster than the prior, 1% multiplicative noise. About 50 steps count (forgetting
  // 0.98): the terms that only short steps show (base, per decode token) are the least certain.
  const true_cost truth{{0.0031, 0.00042, 0.00155, 0.21}};
  step_cost_model m;
  std::mt19937 rng(3);
  std::normal_distribution<double> noise(0.0, 0.01);
  for (int i = 0; i < 400; ++i) {
    const step_shape s = random_step(rng);
    m.observe(s, truth(s) * (1 + noise(rng)));
  }
  const step_cost_coefficients c = m.coefficients();
  EXPECT_NEAR(c.base, truth.c.base, 0.2 * truth.c.base);
  EXPECT_NEAR(c.decode_token, truth.c.decode_token, 0.2 * truth.c.decode_token);
  EXPECT_NEAR(c.prefill_token, truth.c.prefill_token, 0.05 * truth.c.prefill_token);
  EXPECT_NEAR(c.attention_mpos, truth.c.attention_mpos, 0.2 * truth.c.attention_mpos);
  EXPECT_LT(m.mean_relative_error(), 0.05) << "out-of-sample error near the 1% noise";
  for (int i = 0; i < 20; ++i) {
    const step_shape s = random_step(rng);
    EXPECT_NEAR(m.predict(s), truth(s), 0.06 * truth(s));
  }
}

TEST(step_cost_model, follows_a_machine_that_slows_down) {
  const true_cost fast{{0.002, 0.0005, 0.001, 0.2}};
  const true_cost slow{{0.006, 0.0015, 0.003, 0.6}};  // 3x: a neighbour took a core
  step_cost_model m;
  std::mt19937 rng(5);
  for (int i = 0; i < 200; ++i) {
    const step_shape s = random_step(rng);
    m.observe(s, fast(s));
  }
  const step_shape probe{8, 256, 500'000};
  EXPECT_NEAR(m.predict(probe), fast(probe), 0.02 * fast(probe));
  for (int i = 0; i < 200; ++i) {
    const step_shape s = random_step(rng);
    m.observe(s, slow(s));
  }
  EXPECT_NEAR(m.predict(probe), slow(probe), 0.03 * slow(probe)) << "the forgetting factor lets old steps go";
}

TEST(step_cost_model, an_unexercised_term_stays_at_its_prior) {
  // Hours of decode-only steps say nothing about prefill: its coefficient must not drift away.
  step_cost_options o;
  step_cost_model m(o);
  const true_cost truth{{0.004, 0.0007, 0.0, 0.3}};
  std::mt19937 rng(9);
  std::uniform_int_distribution<int> decodes(1, 32), depth(0, 2000);
  for (int i = 0; i < 5000; ++i) {
    step_shape s;
    s.decode_tokens = decodes(rng);
    for (int j = 0; j < s.decode_tokens; ++j) s.attention_positions += depth(rng) + 1;
    m.observe(s, truth(s));
  }
  EXPECT_NEAR(m.coefficients().prefill_token, o.prior.prefill_token, 1e-9);
  EXPECT_NEAR(m.predict({16, 0, 16'000}), truth({16, 0, 16'000}), 0.02 * truth({16, 0, 16'000}));
}

TEST(step_cost_model, one_outlier_does_not_swing_the_fit) {
  const true_cost truth{{0.003, 0.0005, 0.001, 0.3}};
  step_cost_model m;
  std::mt19937 rng(11);
  for (int i = 0; i < 100; ++i) {
    const step_shape s = random_step(rng);
    m.observe(s, truth(s));
  }
  const step_shape probe{16, 128, 300'000};
  const double before = m.predict(probe);
  m.observe(probe, 100 * truth(probe));  // a page fault storm, a suspended process
  EXPECT_LT(m.predict(probe), 1.3 * before) << "clipped to 3x its prediction, then one of ~33 weights";
  EXPECT_GT(m.predict(probe), before);
  // Ignored: nothing scheduled, or no usable time.
  const double p = m.predict(probe);
  m.observe({}, 1.0);
  m.observe(probe, 0.0);
  m.observe(probe, std::nan(""));
  EXPECT_DOUBLE_EQ(m.predict(probe), p);
}

}  // namespace
}  // namespace tessera
