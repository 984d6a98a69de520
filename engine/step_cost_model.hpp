// The step cost model: how long an engine step will take, predicted from the shape of its batch and
// fitted online from the measured times of the engine's own steps. The scheduler sizes each step's
// prefill share with it so that decoding streams are not stalled behind long prompt chunks
// (stall-free batching: Agrawal et al., "Taming Throughput-Latency Tradeoff in LLM Inference with
// Sarathi-Serve", OSDI'24; scheduler.cpp).
//
//   seconds = base + decode_token * D + prefill_token * P + attention * A
//
// D: rows of decoding sequences (draft tokens included), P: prompt / recompute rows, A: attention work,
// the positions each row attends to summed over the rows (a decode at position p reads p + 1 keys; a
// chunk of n rows after c computed tokens reads n·c + n(n+1)/2), in millions. Linear in what the
// executor does per step: reading the weights once (base), a GEMM row per token, and the KV each row
// reads. The fit is exponentially weighted least squares on relative errors (each observation's weight
// decays by `forgetting` per later step, so the model follows a machine whose speed changes) with a ridge
// toward the prior: a direction the recent steps never exercised (no prefill for a while) falls back
// to the prior instead of drifting, and before any data the prior alone predicts.
#pragma once
#include <array>
#include <cstdint>

namespace tessera {

struct step_shape {
  int32_t decode_tokens = 0;
  int32_t prefill_tokens = 0;
  int64_t attention_positions = 0;  // sum over rows of the keys each row attends to

  step_shape& operator+=(const step_shape& o) {
    decode_tokens += o.decode_tokens;
    prefill_tokens += o.prefill_tokens;
    attention_positions += o.attention_positions;
    return *this;
  }
};

// Keys read by the rows of a chunk of `num_new` tokens after `num_computed` ones (row i, at position
// num_computed + i, attends to num_computed + i + 1 keys, at most `window` of them when window > 0).
int64_t chunk_attention_positions(int32_t num_computed, int32_t num_new, int32_t window = 0);

// Coefficients in seconds: per step, per decode row, per prefill row, per million attended positions.
struct step_cost_coefficients {
  double base = 0;
  double decode_token = 0;
  double prefill_token = 0;
  double attention_mpos = 0;
};

struct step_cost_options {
  // Before any measurement: about what the 2-core CPU of docs/benchmarks.md measures with SmolLM2-135M
  // (~8 ms a single-stream decode step, ~2.4 ms a prompt token, ~1 s a million fp16 keys read), the slow
  // end of what the engine runs on, so that the first steps err towards small prefill chunks rather
  // than a stall; a few measured steps replace it (tests/engine/step_cost_model_test.cpp).
  step_cost_coefficients prior{0.006, 0.002, 0.002, 0.5};
  // How many steps' worth of evidence the prior is: a deviation from it by a fraction f costs what
  // prior_weight steps mispredicted by f cost. Small, so that the steps decide wherever they say
  // anything (the base cost is only seen in short steps), yet nonzero: what they never exercise keeps
  // its prior.
  double prior_weight = 0.01;
  // Weight decay per observation: 0.98 remembers about the last 50 steps.
  double forgetting = 0.98;
};

class step_cost_model {
 public:
  explicit step_cost_model(const step_cost_options& options = {});

  // Predicted seconds of a step of this shape (never negative; every coefficient is clamped at 0, the
  // prefill one at a small positive floor so that a budget solved from it stays finite).
  double predict(const step_shape& shape) const;
  // A measured step. Steps with nothing scheduled teach nothing and are ignored. Once the model has
  // seen a few steps, a measurement more than 3x off its prediction is clipped to 3x (one step that
  // hit a page fault or a busy machine must not swing the fit; a real change gets there in a few).
  void observe(const step_shape& shape, double seconds);

  step_cost_coefficients coefficients() const;
  int64_t num_observations() const { return num_observations_; }
  // Exponentially weighted mean of |predicted - measured| / measured, each prediction made before its
  // step was observed (out of sample); 0 before any observation.
  double mean_relative_error() const { return mean_relative_error_; }
  const step_cost_options& options() const { return options_; }

 private:
  static constexpr int k = 4;
  using vec = std::array<double, k>;
  vec features(const step_shape& shape) const;  // normalized: each of order 1 in a typical step
  void solve();

  step_cost_options options_;
  vec prior_;  // in normalized feature units
  std::array<vec, k> xtx_{};
  vec xty_{};
  vec theta_{};  // in normalized feature units
  int64_t num_observations_ = 0;
  double mean_relative_error_ = 0;
};

}  // namespace tessera
