// Random step batches (a seeded stand-in for the scheduler: several sequences over scattered blocks,
// prefill chunks of random sizes, decodes, mixed batches, every logits mode) through the CUDA
// executor under the CPU emulation of CUDA (tests/cuda_emu) and through the CPU executor: the logits must
// agree at every step, with and without CUDA graphs. Batch shapes the hand-written executor tests do
// not reach (graph buckets with several padding rows, block-table widths crossing a power of two,
// split-KV plans for mixed contexts) come up here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>

#include "cpu/cpu_executor.hpp"
#include "engine/model/dummy_weights.hpp"
#include "gpu/cuda_executor.hpp"
#include "gpu/gemv.hpp"
#include "tests/support/tiny_model.hpp"

namespace tessera {
namespace {

model_config tiny_config() {
  model_config c;
  c.num_layers = 2;
  c.hidden_size = 256;
  c.intermediate_size = 256;
  c.num_heads = 4;
  c.num_kv_heads = 1;  // GQA group of 4
  c.head_dim = 64;
  c.vocab_size = 300;
  c.context_length = 4096;
  c.rope_dims = 64;
  c.rope = rope_style::interleaved;
  return c;
}

struct fuzz_sequence {
  uint64_t id = 0;
  std::vector<token_id> prompt;
  int32_t target = 0;  // total length when done
  int32_t computed = 0;
  token_id next = 0;  // the token a decode step feeds
  std::vector<block_id> table;
};

void fuzz(bool graphs, uint32_t seed, bool small_batch_gemm = false) {
  const auto w = test_support::f32_dummy_weights(tiny_config(), seed);
  const kv_cache_spec kv = test_support::kv_pool(256);
  const auto cpu = test_support::cpu_reference_executor(w, kv, 1);
  cuda_executor_options go;
  go.kv = kv;
  go.dtype = cuda_dtype::f32;
  go.cuda_graphs = graphs;
  go.small_batch_gemm_rows = small_batch_gemm ? gpu::kMaxGemvRows : 0;  // steps of <= 8 rows: gpu/gemv.hpp
  go.max_num_batched_tokens = 32;                                       // small: larger steps grow the buffers
  const auto gpu = make_cuda_executor(w, go);

  std::mt19937 rng(seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<block_id> free_blocks(static_cast<size_t>(kv.num_device_blocks));
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
  std::vector<fuzz_sequence> seqs;
  for (int s = 0; s < 9; ++s) {
    fuzz_sequence q;
    q.id = static_cast<uint64_t>(s + 1);
    q.prompt.resize(static_cast<size_t>(uniform(1, s == 0 ? 1300 : 90)));  // one long enough for split-KV
    for (auto& t : q.prompt) t = uniform(0, 299);
    q.target = static_cast<int32_t>(q.prompt.size()) + uniform(5, 30);
    for (int32_t b = 0; b < (q.target + 15) / 16; ++b) {
      q.table.push_back(free_blocks.back());
      free_blocks.pop_back();
    }
    seqs.push_back(std::move(q));
  }
  int steps = 0;
  for (; steps < 400; ++steps) {
    std::vector<fuzz_sequence*> live;
    for (auto& q : seqs)
      if (q.computed < q.target) live.push_back(&q);
    if (live.empty()) break;
    std::shuffle(live.begin(), live.end(), rng);
    live.resize(static_cast<size_t>(uniform(1, static_cast<int>(live.size()))));
    step_batch b;
    for (fuzz_sequence* q : live) {
      const auto prompt_len = static_cast<int32_t>(q->prompt.size());
      sequence_slice sl;
      sl.seq = seq_id{q->id};
      sl.num_computed = q->computed;
      sl.block_table = q->table;
      if (q->computed < prompt_len) {
        const int32_t n = std::min(prompt_len - q->computed, uniform(1, 70));
        sl.tokens.assign(q->prompt.begin() + q->computed, q->prompt.begin() + q->computed + n);
        const bool last_chunk = q->computed + n == prompt_len;
        sl.logits = last_chunk
                        ? (uniform(0, 3) == 0 ? sequence_slice::logits_mode::all : sequence_slice::logits_mode::last)
                        : (uniform(0, 4) == 0 ? sequence_slice::logits_mode::all : sequence_slice::logits_mode::none);
      } else {
        sl.tokens = {q->next};
        sl.logits = sequence_slice::logits_mode::last;
      }
      b.seqs.push_back(std::move(sl));
    }
    step_output oc, og;
    cpu->execute(b, oc);
    gpu->execute(b, og);
    ASSERT_EQ(oc.first_row, og.first_row) << "step " << steps;
    ASSERT_EQ(oc.num_rows, og.num_rows) << "step " << steps;
    ASSERT_EQ(oc.logits.size(), og.logits.size()) << "step " << steps;
    float scale = 1.0f;
    for (float v : oc.logits) scale = std::max(scale, std::fabs(v));
    for (size_t i = 0; i < oc.logits.size(); ++i) {
      ASSERT_NEAR(oc.logits[i], og.logits[i], 1e-3f * scale)
          << "step " << steps << ", logit " << i << " of a batch of " << b.seqs.size() << " sequences";
    }
    for (size_t s = 0; s < live.size(); ++s) {
      fuzz_sequence* q = live[s];
      q->computed += static_cast<int32_t>(b.seqs[s].tokens.size());
      if (oc.num_rows[s] > 0) {
        const auto row = oc.row(oc.first_row[s] + oc.num_rows[s] - 1);
        q->next = static_cast<token_id>(std::max_element(row.begin(), row.end()) - row.begin());
      }
    }
  }
  std::printf("  %d steps (graphs %s, small-batch GEMM %s)\n", steps, graphs ? "on" : "off",
              small_batch_gemm ? "on" : "off");
}

TEST(CudaExecutorFuzz, RandomStepBatchesGiveTheCpuExecutorsLogits) { fuzz(false, 11); }
TEST(CudaExecutorFuzz, RandomStepBatchesGiveTheCpuExecutorsLogitsWithGraphs) { fuzz(true, 13); }
TEST(CudaExecutorFuzz, RandomStepBatchesGiveTheCpuExecutorsLogitsWithTheSmallBatchGemm) { fuzz(true, 17, true); }

}  // namespace
}  // namespace tessera
