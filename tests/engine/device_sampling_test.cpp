// The engine with an executor that samples on its device (executor::samples_on_device(), as the CUDA
// executor): the engine must send each sampling sequence's sampler state (position, stream key,
// masks, penalty lists), record the token the executor returns so later steps' penalties and draws
// are right, keep the fork step of an n > 1 request on the host, and so generate exactly what the
// host sampler generates. The "device" here is the simulated executor plus a direct implementation
// of the descriptor's semantics for the parameters used (no top-k/top-p: the GPU kernels themselves
// are compared with the host sampler in tests/gpu/sampling_test.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>

#include "engine/llm_engine.hpp"
#include "engine/sampling_math.hpp"
#include "engine/sim_executor.hpp"
#include "tests/support/char_tokenizer.hpp"

namespace tessera {
namespace {

using testing::sim_executor;

constexpr int32_t vocab = test_support::char_vocab;

using test_support::char_tokenizer;

// device_sampling applied to one row: logit processors, then greedy or the whole-vocabulary draw
// with min-p (docs/sampling.md), the draw at the descriptor's position of its stream.
token_id sample_descriptor(const device_sampling& d, std::vector<float> l) {
  namespace sm = sampling_math;
  const auto n = static_cast<token_id>(l.size());
  for (float& x : l) x = sm::sanitize_logit(x);
  for (const auto& [t, b] : d.logit_bias) l[static_cast<size_t>(t)] += b;
  for (token_id t : d.masked) l[static_cast<size_t>(t)] = -std::numeric_limits<float>::infinity();
  for (token_id t : d.penalized) {
    float& x = l[static_cast<size_t>(t)];
    x = x > 0 ? std::min(x / d.repetition_penalty, std::numeric_limits<float>::max()) : x * d.repetition_penalty;
  }
  for (const auto& [t, c] : d.output_counts) {
    l[static_cast<size_t>(t)] -= d.frequency_penalty * static_cast<float>(c) + d.presence_penalty;
  }
  token_id best = 0;
  for (token_id i = 1; i < n; ++i)
    if (l[static_cast<size_t>(i)] > l[static_cast<size_t>(best)]) best = i;
  if (d.greedy) return best;
  for (float& x : l) x = std::min(x / d.temperature, std::numeric_limits<float>::max());
  const float max = *std::max_element(l.begin(), l.end());
  double total = 0;
  std::vector<float> w(l.size());
  for (size_t i = 0; i < l.size(); ++i) {
    const float x = sm::candidate_weight(l[i], max);
    w[i] = x >= d.min_p ? x : 0.0f;
    total += w[i];
  }
  const double target = sm::uniform_draw(d.stream_key, d.position) * total;
  double cumulative = 0;
  token_id last = -1;
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i] <= 0) continue;
    cumulative += w[i];
    last = static_cast<token_id>(i);
    if (target < cumulative) return last;
  }
  return last;
}

class device_sim_executor : public sim_executor {
 public:
  using sim_executor::sim_executor;
  bool samples_on_device() const override { return true; }

  void execute(const step_batch& batch, step_output& out) override {
    sim_executor::execute(batch, out);
    out.sampled.assign(batch.seqs.size(), sampled_token{});
    for (size_t i = 0; i < batch.seqs.size(); ++i) {
      const sequence_slice& s = batch.seqs[i];
      if (s.logits == sequence_slice::logits_mode::last && out.num_rows[i] == 1) {
        if (!s.sampling) {
          ++num_host_rows;
          continue;
        }
        const auto first = out.logits.begin() + static_cast<ptrdiff_t>(out.first_row[i]) * vocab;
        out.sampled[i].token = sample_descriptor(*s.sampling, std::vector<float>(first, first + vocab));
        positions[s.seq].push_back(s.sampling->position);
        // The row is not returned: poison it so an engine that read it anyway would go wrong.
        std::fill(first, first + vocab, std::numeric_limits<float>::quiet_NaN());
        out.num_rows[i] = 0;
        ++num_device_rows;
      }
    }
  }

  int num_device_rows = 0;
  int num_host_rows = 0;
  std::map<seq_id, std::vector<uint64_t>> positions;  // per sequence, the positions it was asked
};

engine_options opts() {
  engine_options o;
  o.block_size = 4;
  o.num_kv_blocks = 256;
  o.watermark = 0;
  return o;
}

using outputs = std::map<std::pair<request_id, int32_t>, std::vector<token_id>>;

outputs run(executor& exec, const std::vector<std::pair<std::vector<token_id>, sampling_params>>& requests) {
  llm_engine engine(exec, char_tokenizer(), opts());
  for (const auto& [prompt, params] : requests) engine.add_request(prompt, params);
  outputs out;
  for (int i = 0; i < 10000 && engine.has_unfinished(); ++i) {
    for (const request_output& o : engine.step()) {
      auto& v = out[{o.id, o.index}];
      v.insert(v.end(), o.token_ids.begin(), o.token_ids.end());
    }
  }
  return out;
}

TEST(device_sampling, seeded_generation_equals_host_sampling_token_for_token) {
  std::mt19937 rng(3);
  std::vector<std::pair<std::vector<token_id>, sampling_params>> requests;
  for (int i = 0; i < 8; ++i) {
    std::vector<token_id> prompt;
    for (int j = 0; j < 3 + 4 * i; ++j) prompt.push_back(static_cast<token_id>(1 + rng() % (vocab - 1)));
    sampling_params p;
    p.seed = 100 + i;
    p.max_tokens = 24;
    p.ignore_eos = i % 2 == 0;
    p.temperature = i == 0 ? 0.0f : 0.6f + 0.1f * static_cast<float>(i);
    if (i % 3 == 1) p.repetition_penalty = 1.4f, p.presence_penalty = 0.4f, p.frequency_penalty = 0.7f;
    if (i % 3 == 2) p.min_p = 0.1f, p.logit_bias = {{5, 3.0f}, {6, -50.0f}};
    if (i == 3) p.min_tokens = 6, p.stop_token_ids = {7, 8};
    if (i == 5 || i == 6) p.n = 3;  // the fork step samples 3 tokens from one row on the host
    requests.emplace_back(prompt, p);
  }
  sim_executor host(4, 256, 0, vocab);
  device_sim_executor device(4, 256, 0, vocab);
  const outputs want = run(host, requests);
  const outputs got = run(device, requests);
  ASSERT_TRUE(host.errors().empty()) << host.errors()[0];
  ASSERT_TRUE(device.errors().empty()) << device.errors()[0];
  EXPECT_EQ(got, want);
  EXPECT_EQ(want.size(), 8u + 2u * 2u);
  // Nearly every token came from the device; only the two fork steps stayed on the host.
  EXPECT_EQ(device.num_host_rows, 2);
  EXPECT_GT(device.num_device_rows, 8 * 10);
  // Every sequence was asked for consecutive output positions (the recorded tokens advance them).
  for (const auto& [seq, pos] : device.positions) {
    for (size_t k = 1; k < pos.size(); ++k) EXPECT_EQ(pos[k], pos[k - 1] + 1) << "seq " << seq;
  }
}

}  // namespace
}  // namespace tessera
