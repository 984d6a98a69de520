// The GPU sampler (gpu/sampling.cu) against the engine's host sampler (engine/sampler.cpp) on the same
// logits rows, parameters and token histories: the chosen token must be the same, token for token,
// and the raw logprobs equal up to float rounding. Skipped without a CUDA device (the *_emu build
// runs it on the CPU emulation of CUDA).
//
// Near ties: the two samplers accumulate probability mass in a different order, so a draw or a top-p
// cut that lands within double rounding (~1e-16 relative) of a boundary may resolve differently. The
// rows below are random normals (or quantized on purpose, where the exact ties are resolved by id on
// both sides and the cut fractions are chosen away from the exact multiples of the tied weight), so
// such a landing has a probability of order 1e-12 per row: any mismatch here is a bug.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/executor.hpp"
#include "engine/sampler.hpp"
#include "engine/sampling_math.hpp"
#include "engine/sampling_params.hpp"
#include "gpu/cuda_check.hpp"
#include "gpu/kernels.hpp"
#include "gpu/sampling.hpp"
#include "gpu/sampling_batch.hpp"

namespace tessera::gpu {
namespace {

constexpr float inf = std::numeric_limits<float>::infinity();

std::vector<float> normal_row(int32_t vocab, uint32_t seed, float sd) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<float> v(static_cast<size_t>(vocab));
  for (float& x : v) x = dist(rng);
  return v;
}

// One case: a sampler (params, fork, prompt, history) and a logits row.
struct sample_case {
  sampling_params params;
  uint64_t fork = 0;
  std::vector<token_id> prompt;
  std::vector<token_id> history;  // tokens already generated (recorded before sampling)
  std::vector<token_id> eos;
  std::vector<float> logits;
  std::vector<uint32_t> allowed;  // a grammar's packed token mask; empty: unconstrained
};

// A named parameter set of the sweep.
struct param_set {
  const char* name;
  sampling_params params;
};

std::vector<param_set> sweep() {
  std::vector<param_set> sets;
  auto add = [&](const char* name, auto&& edit) {
    sampling_params p;
    edit(p);
    sets.push_back({name, p});
  };
  add("plain", [](sampling_params&) {});
  add("greedy", [](sampling_params& p) { p.temperature = 0.0f; });
  add("temperature 0.7", [](sampling_params& p) { p.temperature = 0.7f; });
  add("temperature 1.6", [](sampling_params& p) { p.temperature = 1.6f; });
  add("top_k 1", [](sampling_params& p) { p.top_k = 1; });
  add("top_k 40", [](sampling_params& p) { p.top_k = 40; });
  add("top_k 1000 (radix on the host)", [](sampling_params& p) { p.top_k = 1000; });
  add("top_p 0.9", [](sampling_params& p) { p.top_p = 0.9f; });
  add("top_p 0.37", [](sampling_params& p) { p.top_p = 0.37f; });
  add("min_p 0.05", [](sampling_params& p) { p.min_p = 0.05f; });
  add("top_k 50 + top_p 0.8 + min_p 0.02 + T 0.8",
      [](sampling_params& p) { p.top_k = 50, p.top_p = 0.8f, p.min_p = 0.02f, p.temperature = 0.8f; });
  add("top_p 0.95 + min_p 0.001 + T 1.3",
      [](sampling_params& p) { p.top_p = 0.95f, p.min_p = 0.001f, p.temperature = 1.3f; });
  add("logit_bias", [](sampling_params& p) {
    p.logit_bias = {{7, 100.0f}, {11, -100.0f}, {3000, 5.5f}, {12345, 9.0f}, {40000, -3.25f}};
    p.temperature = 0.9f;
  });
  add("repetition 1.3", [](sampling_params& p) { p.repetition_penalty = 1.3f; });
  add("repetition 0.8 + presence + frequency", [](sampling_params& p) {
    p.repetition_penalty = 0.8f, p.presence_penalty = 0.6f, p.frequency_penalty = 0.45f, p.top_k = 200;
  });
  add("presence -1.5 frequency 1.9 + greedy",
      [](sampling_params& p) { p.presence_penalty = -1.5f, p.frequency_penalty = 1.9f, p.temperature = 0.0f; });
  add("min_tokens with stop ids", [](sampling_params& p) {
    p.min_tokens = 50, p.max_tokens = 100, p.stop_token_ids = {5, 9, 300};
  });
  add("logprobs 5 + top_p 0.7", [](sampling_params& p) { p.logprobs = 5, p.top_p = 0.7f; });
  add("logprobs 0 + greedy", [](sampling_params& p) { p.logprobs = 0, p.temperature = 0.0f; });
  add("everything", [](sampling_params& p) {
    p.temperature = 0.75f, p.top_k = 64, p.top_p = 0.85f, p.min_p = 0.03f, p.repetition_penalty = 1.15f;
    p.presence_penalty = 0.3f, p.frequency_penalty = 0.2f, p.logit_bias = {{100, 2.0f}, {200, -2.0f}};
    p.min_tokens = 4, p.max_tokens = 64, p.stop_token_ids = {1}, p.logprobs = 20;
  });
  return sets;
}

class GpuSampling : public ::testing::Test {
 protected:
  void SetUp() override {
    if (device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine: GPU sampling tests skipped";
  }
  void TearDown() override {
    for (void* p : allocations_) cudaFree(p);
  }
  void* alloc_bytes(size_t n) {
    void* dev = nullptr;
    CUDA_CHECK(cudaMalloc(&dev, std::max<size_t>(n, 16)));
    allocations_.push_back(dev);
    return dev;
  }

  // Runs every case through the GPU sampler in one launch; returns its results in case order. The
  // logits rows are laid out in reverse so that logits_row differs from the batch index.
  // pending: the tokens of the requests that count one more (device_sampling::counts_last_token), by
  // case, in the kernel's pending_tokens.
  std::vector<sampled_token> run_gpu(const std::vector<sample_case>& cases, const std::vector<device_sampling>& reqs,
                                     const std::vector<int32_t>& pending = {}) {
    const auto rows = static_cast<int32_t>(cases.size());
    const auto vocab = static_cast<int32_t>(cases.front().logits.size());
    std::vector<float> logits(static_cast<size_t>(rows) * static_cast<size_t>(vocab));
    sampling_batch batch;
    for (int32_t i = 0; i < rows; ++i) {
      const int32_t slot = rows - 1 - i;
      std::copy(cases[static_cast<size_t>(i)].logits.begin(), cases[static_cast<size_t>(i)].logits.end(),
                logits.begin() + static_cast<ptrdiff_t>(slot) * vocab);
      batch.add(reqs[static_cast<size_t>(i)], slot, reqs[static_cast<size_t>(i)].counts_last_token ? i : -1);
    }
    int32_t* d_pending = nullptr;
    if (!pending.empty()) {
      d_pending = static_cast<int32_t*>(alloc_bytes(pending.size() * sizeof(int32_t)));
      CUDA_CHECK(cudaMemcpy(d_pending, pending.data(), pending.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    }
    auto* d_logits = static_cast<float*>(alloc_bytes(logits.size() * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(d_logits, logits.data(), logits.size() * sizeof(float), cudaMemcpyHostToDevice));
    auto* d_work = static_cast<float*>(alloc_bytes(logits.size() * sizeof(float)));
    std::vector<char> in(batch.input_bytes());
    batch.pack_inputs(in.data());
    void* d_in = alloc_bytes(in.size());
    CUDA_CHECK(cudaMemcpy(d_in, in.data(), in.size(), cudaMemcpyHostToDevice));
    void* d_out = alloc_bytes(batch.output_bytes());
    sample_rows(batch.kernel_args(d_in, d_out, d_logits, vocab, d_work, d_pending), nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<char> out(batch.output_bytes());
    CUDA_CHECK(cudaMemcpy(out.data(), d_out, out.size(), cudaMemcpyDeviceToHost));
    // The logits are left as they were.
    std::vector<float> after(logits.size());
    CUDA_CHECK(cudaMemcpy(after.data(), d_logits, after.size() * sizeof(float), cudaMemcpyDeviceToHost));
    EXPECT_EQ(0, std::memcmp(after.data(), logits.data(), after.size() * sizeof(float)));
    return batch.unpack_outputs(out.data());
  }

  // Host sample() and GPU sample for every case; expects the same tokens and logprobs. ahead
  // (overlapped steps): the device request is made before the history's last token is recorded
  // (sampler::device_request(1)), and the kernel gets that token apart, as the executor's step after a
  // placeholder does.
  void check(const std::vector<sample_case>& cases, const std::string& what, bool ahead = false) {
    std::vector<sampler> samplers;
    std::vector<device_sampling> reqs;
    std::vector<int32_t> pending(ahead ? cases.size() : 0, -1);
    samplers.reserve(cases.size());
    for (size_t i = 0; i < cases.size(); ++i) {
      const sample_case& c = cases[i];
      samplers.emplace_back(c.params, c.fork, c.prompt, c.eos);
      const bool late = ahead && !c.history.empty();
      for (size_t h = 0; h + (late ? 1 : 0) < c.history.size(); ++h)
        samplers.back().append_external_token(c.history[h]);
      auto req = samplers.back().device_request(late ? 1 : 0);
      ASSERT_TRUE(req.has_value()) << what;
      if (late) {
        const sampling_params& p = c.params;
        EXPECT_EQ(req->counts_last_token,
                  p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f)
            << what;
        pending[i] = c.history.back();
        samplers.back().append_external_token(c.history.back());
      }
      req->allowed_tokens = c.allowed;
      reqs.push_back(*req);
    }
    const std::vector<sampled_token> got = run_gpu(cases, reqs, pending);
    ASSERT_EQ(got.size(), cases.size());
    for (size_t i = 0; i < cases.size(); ++i) {
      const sample_result want = samplers[i].sample(cases[i].logits, cases[i].allowed);
      if (!cases[i].allowed.empty()) {
        ASSERT_TRUE((cases[i].allowed[static_cast<size_t>(got[i].token) / 32] >> (got[i].token % 32)) & 1u) << what;
      }
      SCOPED_TRACE(what + ", case " + std::to_string(i));
      ASSERT_EQ(got[i].token, want.token);
      if (cases[i].params.logprobs < 0) continue;
      EXPECT_NEAR(got[i].logprob, want.logprob, 1e-4f * (1.0f + std::fabs(want.logprob)));
      ASSERT_EQ(got[i].top_logprobs.size(), want.top_logprobs.size());
      for (size_t j = 0; j < want.top_logprobs.size(); ++j) {
        EXPECT_EQ(got[i].top_logprobs[j].first, want.top_logprobs[j].first) << j;
        EXPECT_NEAR(got[i].top_logprobs[j].second, want.top_logprobs[j].second,
                    1e-4f * (1.0f + std::fabs(want.top_logprobs[j].second)));
      }
    }
  }

  // Random rows for every parameter set at two vocabulary sizes, with histories that make every
  // penalty bite (prompt and output tokens overlap; some tokens repeat) and seeds that differ per row.
  void run_sweep(int32_t vocab, int32_t rows_per_set, bool ahead = false) {
    uint32_t seed = 1;
    for (const param_set& set : sweep()) {
      std::vector<sample_case> cases;
      for (int32_t r = 0; r < rows_per_set; ++r, ++seed) {
        sample_case c;
        c.params = set.params;
        c.params.seed = 1000 + seed;
        c.fork = static_cast<uint64_t>(r % 3);
        std::mt19937 rng(seed);
        std::uniform_int_distribution<token_id> any(0, vocab - 1), hot(0, 499);
        for (int i = 0; i < 300; ++i) c.prompt.push_back(i % 2 ? any(rng) : hot(rng));
        const int generated = static_cast<int>(rng() % 120);
        for (int i = 0; i < generated; ++i) c.history.push_back(i % 3 ? hot(rng) : any(rng));
        c.eos = {2, 0};
        // Peaked rows (sd 4) and flat ones (sd 1.5); the hot tokens get a boost so penalties change
        // what is likely.
        c.logits = normal_row(vocab, seed * 7919u, r % 2 ? 4.0f : 1.5f);
        for (int i = 0; i < 500; i += 3) c.logits[static_cast<size_t>(i)] += 6.0f;
        cases.push_back(std::move(c));
      }
      check(cases, std::string(set.name) + ", vocab " + std::to_string(vocab) + (ahead ? ", a token ahead" : ""),
            ahead);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }

  std::vector<void*> allocations_;
};

TEST_F(GpuSampling, EveryParameterMatchesTheHostSamplerVocab49152) { run_sweep(49152, 6); }

TEST_F(GpuSampling, EveryParameterMatchesTheHostSamplerVocab128256) { run_sweep(128256, 3); }

// Overlapped steps: the request was made a token ahead (its penalty lists lack the history's last
// token, which the kernel gets from the previous step's samples) and must still draw what the host
// draws with that token recorded, penalties included.
TEST_F(GpuSampling, ARequestMadeATokenAheadMatchesTheHostSamplerWithTheToken) { run_sweep(49152, 4, true); }

// Constrained decoding: a grammar's bitmask composes with every parameter on both samplers, which
// choose the same token, always inside the mask (a mask that excludes the model's favourites, one
// of a few hundred allowed ids, a single allowed id, and rows without a mask in the same launch).
TEST_F(GpuSampling, TheGrammarMaskComposesWithEveryParameterLikeTheHost) {
  const int32_t vocab = 49152;
  uint32_t seed = 500;
  for (const param_set& set : sweep()) {
    std::vector<sample_case> cases;
    for (int32_t r = 0; r < 4; ++r, ++seed) {
      sample_case c;
      c.params = set.params;
      c.params.seed = seed;
      std::mt19937 rng(seed);
      for (int i = 0; i < 40; ++i) c.history.push_back(static_cast<token_id>(rng() % 600));
      c.prompt = {1, 2, 3, 500, 501};
      c.eos = {2, 0};
      c.logits = normal_row(vocab, seed * 31u, r % 2 ? 4.0f : 1.5f);
      for (int i = 0; i < 600; i += 3) c.logits[static_cast<size_t>(i)] += 6.0f;  // favourites, mostly masked
      if (r < 3) {
        c.allowed.assign(static_cast<size_t>((vocab + 31) / 32), 0u);
        const auto allow = [&](token_id t) { c.allowed[static_cast<size_t>(t) / 32] |= 1u << (t % 32); };
        if (r == 0) {
          for (int k = 0; k < 300; ++k) allow(static_cast<token_id>(rng() % vocab));
        } else if (r == 1) {
          allow(static_cast<token_id>(40000 + seed % 100));  // one token: what a forced continuation looks like
        } else {
          for (token_id t = 0; t < 600; t += 7) allow(t);  // some favourites, and tokens the penalties hit
          allow(2), allow(5), allow(9);                    // end and stop ids (min_tokens masks them)
        }
      }
      cases.push_back(std::move(c));
    }
    check(cases, std::string(set.name) + " with a grammar mask");
    if (HasFatalFailure()) return;
  }
}

// Consecutive positions of one seeded stream: the draw depends on the output position.
TEST_F(GpuSampling, SeededStreamMatchesPositionByPosition) {
  const int32_t vocab = 49152;
  sampling_params p;
  p.seed = 42, p.top_p = 0.92f, p.temperature = 0.9f;
  std::vector<sample_case> cases;
  std::vector<token_id> history;
  std::mt19937 rng(5);
  for (int t = 0; t < 24; ++t) {
    sample_case c;
    c.params = p;
    c.history = history;
    c.logits = normal_row(vocab, 77, 2.5f);  // the same row every time: only the draw changes
    cases.push_back(c);
    history.push_back(static_cast<token_id>(rng() % vocab));
  }
  check(cases, "positions 0..23");
  // The draws really differ: more than one distinct token over the positions.
  std::vector<token_id> tokens;
  for (const sample_case& c : cases) {
    sampler smp(c.params, 0, {}, {});
    for (token_id t : c.history) smp.append_external_token(t);
    tokens.push_back(smp.sample(c.logits).token);
  }
  std::sort(tokens.begin(), tokens.end());
  EXPECT_GT(std::unique(tokens.begin(), tokens.end()) - tokens.begin(), 3);
}

// Exact ties: quantized logits make hundreds of equal values, so the top-k and top-p cuts and the
// greedy argmax fall inside runs of equal entries, which both samplers resolve by token id.
TEST_F(GpuSampling, TiesAreResolvedByTokenIdLikeTheHost) {
  const int32_t vocab = 49152;
  std::vector<sample_case> cases;
  const float top_ps[] = {0.37f, 0.61f, 0.83f};
  for (int r = 0; r < 12; ++r) {
    sample_case c;
    c.logits = normal_row(vocab, 300 + r, 2.0f);
    for (float& x : c.logits) x = std::round(x * 2.0f) / 2.0f;  // steps of 0.5: many equal values
    c.params.seed = 9 + r;
    if (r % 4 == 0) c.params.temperature = 0.0f;  // greedy: lowest id among the maxima
    if (r % 4 == 1) c.params.top_k = 1 + 37 * r;
    if (r % 4 == 2) c.params.top_p = top_ps[r % 3];
    if (r % 4 == 3) c.params.top_k = 500, c.params.top_p = top_ps[(r + 1) % 3];
    cases.push_back(std::move(c));
  }
  // All maxima equal at several ids, the lowest not first in memory order of the threads.
  sample_case flat;
  flat.logits.assign(vocab, 1.0f);
  flat.logits[40000] = flat.logits[70] = flat.logits[9000] = 3.0f;
  flat.params.temperature = 0.0f;
  cases.push_back(flat);
  flat.params.temperature = 1.0f, flat.params.top_k = 2, flat.params.seed = 3;  // the ties 70 and 9000
  cases.push_back(flat);
  flat.params.top_k = -1, flat.params.top_p = 0.5f;
  cases.push_back(flat);
  check(cases, "ties");
  sampler greedy(cases[12].params, 0, {}, {});
  EXPECT_EQ(greedy.sample(cases[12].logits).token, 70);
}

// NaN counts as -inf, +inf as the largest float; a row whose every finite entry is masked falls
// back to the raw argmax.
TEST_F(GpuSampling, NonFiniteLogitsAreTreatedAsTheHostTreatsThem) {
  const int32_t vocab = 49152;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<sample_case> cases;
  for (int r = 0; r < 8; ++r) {
    sample_case c;
    c.logits = normal_row(vocab, 500 + r, 3.0f);
    for (int i = r; i < vocab; i += 97) c.logits[static_cast<size_t>(i)] = nan;
    for (int i = r; i < vocab; i += 1013) c.logits[static_cast<size_t>(i)] = -inf;
    if (r >= 4) c.logits[static_cast<size_t>(123 + r)] = inf, c.logits[static_cast<size_t>(30000 + r)] = inf;
    c.params.seed = r;
    c.params.logprobs = 3;
    if (r % 4 == 1) c.params.temperature = 0.0f;
    if (r % 4 == 2) c.params.top_p = 0.5f;
    if (r % 4 == 3) c.params.top_k = 10;
    cases.push_back(std::move(c));
  }
  // Only NaN except three tokens, which min_tokens masks: the raw argmax of the sanitized row.
  sample_case masked;
  masked.logits.assign(vocab, nan);
  masked.logits[5] = 1.0f, masked.logits[6] = 2.0f, masked.logits[700] = 0.5f;
  masked.params.min_tokens = 3, masked.params.max_tokens = 8, masked.params.stop_token_ids = {5, 6, 700};
  masked.params.seed = 1;
  cases.push_back(masked);
  masked.params.temperature = 0.0f;
  cases.push_back(masked);
  masked.params.temperature = 1.0f, masked.params.top_k = 5;
  cases.push_back(masked);
  // Fewer finite entries than top_k: all of them stay candidates.
  sample_case few;
  few.logits.assign(vocab, -inf);
  few.logits[10] = 1.0f, few.logits[20] = 2.0f, few.logits[30000] = 1.5f, few.logits[40000] = nan;
  few.params.seed = 4, few.params.top_k = 10;
  for (int s = 0; s < 4; ++s, ++*few.params.seed) cases.push_back(few);
  few.params.top_k = 2, few.params.top_p = 0.6f;
  cases.push_back(few);
  check(cases, "non-finite");
  sampler s(masked.params, 0, {}, {});
  EXPECT_EQ(s.sample(masked.logits).token, 6);  // the raw argmax, as documented
}

// logit_bias with a repeated id cannot be reproduced in parallel: no device request.
TEST(GpuSamplingRequest, RepeatedLogitBiasIdsStayOnTheHost) {
  sampling_params p;
  p.logit_bias = {{3, 1.0f}, {4, 2.0f}, {3, 0.5f}};
  sampler s(p, 0, {}, {});
  EXPECT_FALSE(s.device_request().has_value());
  p.logit_bias = {{3, 1.0f}, {4, 2.0f}};
  sampler t(p, 0, {}, {});
  ASSERT_TRUE(t.device_request().has_value());
  EXPECT_EQ(t.device_request()->logit_bias.size(), 2u);
}

// The request carries the sampler's state: position, key, masks and penalty lists.
TEST(GpuSamplingRequest, CarriesTheSamplerState) {
  sampling_params p;
  p.seed = 5, p.repetition_penalty = 1.2f, p.presence_penalty = 0.5f, p.min_tokens = 2, p.max_tokens = 9;
  p.stop_token_ids = {8};
  const std::vector<token_id> prompt = {4, 4, 1, 9};
  sampler s(p, 2, prompt, std::vector<token_id>{0});
  auto r = s.device_request();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->stream_key, sampler::derive_stream_key(5, 2));
  EXPECT_EQ(r->position, 0u);
  EXPECT_EQ(r->masked, (std::vector<token_id>{8, 0}));
  EXPECT_EQ(r->penalized, (std::vector<token_id>{1, 4, 9}));
  EXPECT_TRUE(r->output_counts.empty());
  s.append_external_token(9);
  s.append_external_token(7);
  s.append_external_token(7);
  r = s.device_request();
  EXPECT_EQ(r->position, 3u);
  EXPECT_TRUE(r->masked.empty());  // min_tokens reached
  std::vector<token_id> pen = r->penalized;
  std::sort(pen.begin(), pen.end());
  EXPECT_EQ(pen, (std::vector<token_id>{1, 4, 7, 9}));
  auto counts = r->output_counts;
  std::sort(counts.begin(), counts.end());
  EXPECT_EQ(counts, (std::vector<std::pair<token_id, int32_t>>{{7, 2}, {9, 1}}));
  // The draw is the shared SplitMix64 function the device calls.
  EXPECT_EQ(sampler::uniform_draw(r->stream_key, 3), sampling_math::uniform_draw(r->stream_key, 3));
}

}  // namespace
}  // namespace tessera::gpu
