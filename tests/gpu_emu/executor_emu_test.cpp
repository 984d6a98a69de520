// The CUDA executor under the CPU emulation of CUDA (tests/cuda_emu), for what only the emulator can see:
// every byte of device and pinned memory it allocates is freed again, and with --cuda-graphs a decode
// graph captured before the activation buffers grow is not replayed with the freed buffers' pointers
// (the emulator checks kernel and cuBLAS pointers at every replay) and still gives the CPU's logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "cpu/cpu_executor.hpp"
#include "engine/model/dummy_weights.hpp"
#include "gpu/cuda_executor.hpp"
#include "tests/cuda_emu/emulator.hpp"
#include "tests/support/step_slices.hpp"
#include "tests/support/tiny_model.hpp"

namespace tessera {
namespace {

model_config tiny_config() { return test_support::tiny_executor_config(); }

kv_cache_spec pool() { return test_support::kv_pool(64, 4); }

sequence_slice slice(uint64_t id, std::vector<token_id> tokens, int32_t num_computed, std::vector<block_id> table,
                     sequence_slice::logits_mode mode = sequence_slice::logits_mode::last) {
  return test_support::make_slice(id, std::move(tokens), num_computed, std::move(table), mode);
}

std::vector<token_id> tokens(int32_t n, int32_t seed) { return test_support::pseudo_tokens(n, seed); }

void expect_close(const step_output& cpu, const step_output& gpu, const char* what) {
  ASSERT_EQ(cpu.logits.size(), gpu.logits.size()) << what;
  float scale = 1.0f;
  for (float v : cpu.logits) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < cpu.logits.size(); ++i) {
    ASSERT_NEAR(cpu.logits[i], gpu.logits[i], 1e-3f * scale) << what << ": logit " << i;
  }
}

TEST(CudaExecutorEmulated, EveryAllocationIsFreedWithTheExecutor) {
  const gpu::emu::memory_stats before = gpu::emu::memory();
  {
    const auto w = test_support::f32_dummy_weights(tiny_config(), 0);
    for (const cuda_dtype dtype : {cuda_dtype::f32, cuda_dtype::bf16}) {
      cuda_executor_options o;
      o.kv = pool();
      o.dtype = dtype;
      o.cuda_graphs = true;
      const auto exec = make_cuda_executor(w, o);
      step_output out;
      step_batch prefill;
      prefill.seqs.push_back(slice(1, tokens(20, 1), 0, {3, 5}));
      exec->execute(prefill, out);
      step_batch decode;  // replayed from a graph
      decode.seqs.push_back(slice(1, {7}, 20, {3, 5}));
      exec->execute(decode, out);
      step_batch swap;
      swap.swap_out = {{3, 0}};
      exec->execute(swap, out);
      EXPECT_GT(gpu::emu::memory().device_bytes, before.device_bytes);
      EXPECT_GT(gpu::emu::memory().host_bytes, before.host_bytes);  // pinned swap pool, staging buffers
    }
  }
  const gpu::emu::memory_stats after = gpu::emu::memory();
  EXPECT_EQ(after.device_bytes, before.device_bytes);
  EXPECT_EQ(after.device_allocations, before.device_allocations);
  EXPECT_EQ(after.host_bytes, before.host_bytes);
  EXPECT_EQ(after.host_allocations, before.host_allocations);
}

TEST(CudaExecutorEmulated, GraphsCapturedBeforeTheBuffersGrowAreNotReplayedWithStalePointers) {
  const auto w = test_support::f32_dummy_weights(tiny_config(), 5);
  const auto cpu = test_support::cpu_reference_executor(w, pool(), 1);
  cuda_executor_options go;
  go.kv = pool();
  go.dtype = cuda_dtype::f32;
  go.cuda_graphs = true;
  go.max_num_batched_tokens = 4;  // small buffers, so a later prefill reallocates them
  const auto gpu = make_cuda_executor(w, go);
  auto both = [&](const step_batch& b, const char* what) {
    step_output oc, og;
    cpu->execute(b, oc);
    gpu->execute(b, og);
    expect_close(oc, og, what);
    return static_cast<token_id>(std::max_element(oc.logits.begin(), oc.logits.end()) - oc.logits.begin());
  };
  step_batch a0;
  a0.seqs.push_back(slice(1, tokens(4, 1), 0, {2}));
  token_id next = both(a0, "prefill A");
  for (int32_t i = 0; i < 2; ++i) {  // captured, then replayed
    step_batch d;
    d.seqs.push_back(slice(1, {next}, 4 + i, {2}));
    next = both(d, "decode A (graph)");
  }
  // 40 tokens with every row's logits: the token and logit buffers are reallocated (the old ones freed).
  step_batch b0;
  b0.seqs.push_back(slice(2, tokens(40, 2), 0, {9, 10, 11}, sequence_slice::logits_mode::all));
  both(b0, "prefill B (buffers grow)");
  for (int32_t i = 0; i < 2; ++i) {
    step_batch d;
    d.seqs.push_back(slice(1, {next}, 6 + i, {2}));
    next = both(d, "decode A after growth (graph)");
  }
}

}  // namespace
}  // namespace tessera
