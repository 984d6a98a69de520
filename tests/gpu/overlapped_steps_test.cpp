// Overlapped steps (docs/engine.md#overlapped-steps): the CUDA executor's submit()/wait() with tokens
// that stay on the device from one step to the next, and the engine that plans step n+1 while step n
// runs, against the CPU executor's synchronous steps. Under the CUDA emulation the streams are
// deferred (work runs only when something waits for it), so a pinned buffer the host rewrites before
// the device has read it, or a result read before it was written, shows as a wrong token here.
#include <cuda_runtime.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "engine/base/error.hpp"
#include "engine/llm_engine.hpp"
#include "gpu/cuda_executor.hpp"
#include "tests/support/scripted_constraints.hpp"
#include "tests/support/step_slices.hpp"
#include "tests/support/tiny_model.hpp"

namespace tessera {
namespace {

using logits_mode = sequence_slice::logits_mode;

token_id argmax(std::span<const float> row) {
  return static_cast<token_id>(std::max_element(row.begin(), row.end()) - row.begin());
}

device_sampling greedy_on_device() {
  device_sampling d;
  d.greedy = true;
  return d;
}

// The tiny synthetic model every test here runs, and its CUDA executor in fp32 (the CPU executor's
// exact math) over `kv`.
std::shared_ptr<const model_weights> tiny_weights() {
  return test_support::f32_dummy_weights(test_support::tiny_executor_config(rope_style::half, 8192), 5);
}

std::unique_ptr<executor> f32_cuda(std::shared_ptr<const model_weights> weights, const kv_cache_spec& kv, bool graphs) {
  cuda_executor_options o;
  o.kv = kv;
  o.dtype = cuda_dtype::f32;
  o.cuda_graphs = graphs;
  return make_cuda_executor(std::move(weights), o);
}

class OverlappedSteps : public ::testing::TestWithParam<bool> {  // param: CUDA graphs for decode steps
 protected:
  void SetUp() override {
    if (!cuda_executor_available()) GTEST_SKIP() << "no CUDA device (real or emulated)";
    weights_ = tiny_weights();
    cpu_ = test_support::cpu_reference_executor(weights_, test_support::kv_pool(64, 16), 2);
    gpu_ = f32_cuda(weights_, test_support::kv_pool(64, 16), GetParam());
  }

  std::shared_ptr<const model_weights> weights_;
  std::unique_ptr<executor> cpu_, gpu_;
};

// Step 2 is submitted before step 1's results are taken: its two decode slices name their rows of
// step 1, whose greedy tokens the device put there. One returns its logits row, one samples again;
// both must equal the CPU executor's synchronous steps with the tokens known.
TEST_P(OverlappedSteps, ASubmittedStepTakesItsTokensFromThePreviousStepOnTheDevice) {
  ASSERT_TRUE(gpu_->overlaps_steps());
  ASSERT_FALSE(cpu_->overlaps_steps());
  const int32_t vocab = weights_->config.vocab_size;
  const std::vector<token_id> a = test_support::pseudo_tokens(7, 3, vocab),
                              b = test_support::pseudo_tokens(18, 4, vocab);
  step_batch first;
  first.seqs.push_back(test_support::make_slice(1, a, 0, {3}, logits_mode::last));
  first.seqs.push_back(test_support::make_slice(2, b, 0, {5, 6}, logits_mode::last));
  for (sequence_slice& s : first.seqs) s.sampling = greedy_on_device();

  step_batch second;  // placeholders (0) where the device's tokens go
  second.seqs.push_back(test_support::make_slice(1, {0}, 7, {3}, logits_mode::last));
  second.seqs.push_back(test_support::make_slice(2, {0}, 18, {5, 6}, logits_mode::last));
  second.seqs[0].last_token_from = 0;
  second.seqs[1].last_token_from = 1;
  second.seqs[1].sampling = greedy_on_device();

  gpu_->submit(first);
  gpu_->submit(second);
  EXPECT_THROW(gpu_->submit(second), std::logic_error) << "two steps are in flight already";
  step_output o1, o2;
  gpu_->wait(o1);
  gpu_->wait(o2);

  step_output c1, c2;
  cpu_->execute(first, c1);  // ignores `sampling`: both rows
  const token_id ta = argmax(c1.row(c1.first_row[0])), tb = argmax(c1.row(c1.first_row[1]));
  ASSERT_EQ(o1.sampled.size(), 2u);
  EXPECT_EQ(o1.sampled[0].token, ta);
  EXPECT_EQ(o1.sampled[1].token, tb);
  step_batch known = second;
  known.seqs[0].tokens = {ta};
  known.seqs[1].tokens = {tb};
  for (sequence_slice& s : known.seqs) s.last_token_from = -1;
  cpu_->execute(known, c2);
  ASSERT_EQ(o2.num_rows, (std::vector<int32_t>{1, 0}));
  const auto got = o2.row(o2.first_row[0]), want = c2.row(c2.first_row[0]);
  for (int32_t i = 0; i < vocab; ++i) EXPECT_NEAR(got[i], want[i], 1e-3f * (1.0f + std::fabs(want[i]))) << i;
  EXPECT_EQ(o2.sampled[1].token, argmax(c2.row(c2.first_row[1])));

  // A slice may name only a row the previous step sampled on the device: row 0 of `second` returned
  // logits. Refused before anything is queued, and the executor goes on.
  step_batch bad;
  bad.seqs.push_back(test_support::make_slice(1, {0}, 8, {3}, logits_mode::last));
  bad.seqs[0].last_token_from = 0;
  EXPECT_THROW(gpu_->submit(bad), invalid_request);
  bad.seqs[0].last_token_from = 7;
  EXPECT_THROW(gpu_->submit(bad), invalid_request);
  EXPECT_THROW(gpu_->wait(o1), std::logic_error) << "nothing is in flight";
  known.seqs[0].num_computed = 8, known.seqs[1].num_computed = 19;
  step_output again;
  gpu_->execute(known, again);
  EXPECT_EQ(again.num_rows, (std::vector<int32_t>{1, 0}));
}

struct choice_result {
  std::vector<token_id> tokens;
  std::vector<float> logprobs;
  finish_reason reason = finish_reason::none;
  bool operator==(const choice_result& o) const { return tokens == o.tokens && reason == o.reason; }
};

struct engine_run {
  std::map<std::pair<request_id, int32_t>, choice_result> choices;
  engine_stats stats;
};

// Steps `engine` until every request is done, collecting each choice's tokens, logprobs and finish
// reason; aborts `aborted` once its first choice has `abort_after` tokens. The scheduler's invariants
// hold after every step, and no block is left at the end.
engine_run drive(llm_engine& engine, request_id aborted, size_t abort_after) {
  engine_run r;
  bool abort_sent = false;
  for (int32_t step = 0; step < 3000 && engine.has_unfinished(); ++step) {
    for (const request_output& o : engine.step()) {
      EXPECT_TRUE(o.error.empty()) << o.error;
      choice_result& c = r.choices[{o.id, o.index}];
      c.tokens.insert(c.tokens.end(), o.token_ids.begin(), o.token_ids.end());
      for (const token_logprob& lp : o.logprobs) c.logprobs.push_back(lp.logprob);
      if (o.finished) c.reason = o.reason;
    }
    EXPECT_EQ(engine.get_scheduler().check_invariants(), "");
    if (!abort_sent && r.choices[{aborted, 0}].tokens.size() >= abort_after) {
      engine.abort(aborted);
      abort_sent = true;
    }
  }
  EXPECT_FALSE(engine.has_unfinished());
  EXPECT_EQ(engine.get_scheduler().blocks().device_usage().num_used, 0) << "a finished request kept its blocks";
  r.stats = engine.stats();
  return r;
}

// The engine of both workloads: 16-token blocks, a device pool of `kv_blocks` small enough to preempt
// (by swap into 16 host blocks, or recompute), and a token budget that chunks the prompts.
engine_options workload_options(int32_t kv_blocks, int32_t max_batched_tokens, bool overlap) {
  engine_options eo;
  eo.block_size = 16;
  eo.num_kv_blocks = kv_blocks;
  eo.num_host_blocks = 16;
  eo.max_num_batched_tokens = max_batched_tokens;
  eo.watermark = 0;
  eo.overlap_steps = overlap;
  return eo;
}

// Requests of every kind the engine treats differently when it overlaps: greedy and seeded draws, a
// max_tokens of 1 (its token is its last: no placeholder), min_tokens and a stop id, logprobs, a
// request with penalties (drawn a token ahead, counting the token still on the device), an
// n = 2 fork, prompts long enough to be chunked, and one request aborted after its third token, with
// a KV pool small enough that sequences are preempted (swap and recompute) on the way.
engine_run run_workload(executor& exec, bool overlap) {
  llm_engine engine(exec, nullptr, workload_options(20, 64, overlap));
  const int32_t vocab = exec.config().vocab_size;
  std::vector<request_id> ids;
  for (int32_t i = 0; i < 9; ++i) {
    sampling_params p;
    p.seed = 70 + i;
    p.max_tokens = 24 + 5 * i;
    p.temperature = i % 3 == 0 ? 0.0f : 0.8f;
    if (i == 1) p.max_tokens = 1;
    if (i == 2) p.min_tokens = 3, p.stop_token_ids = {11, 12, 13, 14, 15}, p.logprobs = 2;
    if (i == 4) p.repetition_penalty = 1.2f, p.frequency_penalty = 0.3f;
    if (i == 5) p.n = 2, p.top_k = 50;
    if (i == 7) p.top_p = 0.9f, p.logprobs = 0;
    ids.push_back(engine.add_request(test_support::pseudo_tokens(12 + 17 * i, 20 + i, vocab), p));
  }
  return drive(engine, ids[6], 3);
}

// The CPU executor's synchronous steps are the oracle: the CUDA executor gives the same tokens, finish
// reasons and logprobs with its steps overlapped (eager and with decode graphs; most steps planned
// ahead) and without, sequences preempted on the way.
void expect_cuda_runs_equal_cpu(engine_run (*workload)(executor&, bool), size_t num_choices, const char* label) {
  const auto weights = tiny_weights();
  const auto cpu = test_support::cpu_reference_executor(weights, test_support::kv_pool(64, 16), 2);
  const engine_run want = workload(*cpu, true);  // (the CPU executor does not overlap)
  EXPECT_EQ(want.stats.num_overlapped_steps, 0u);
  ASSERT_EQ(want.choices.size(), num_choices);
  for (const auto& [overlap, graphs] : {std::pair{false, false}, std::pair{true, false}, std::pair{true, true}}) {
    const std::string what =
        std::string(label) + (overlap ? ", overlapped" : ", synchronous") + (graphs ? ", graphs" : "");
    const engine_run got = workload(*f32_cuda(weights, test_support::kv_pool(64, 16), graphs), overlap);
    if (overlap) {
      EXPECT_GT(got.stats.num_overlapped_steps, got.stats.num_steps / 2) << what;
    } else {
      EXPECT_EQ(got.stats.num_overlapped_steps, 0u) << what;
    }
    EXPECT_GT(got.stats.num_preemptions_swap + got.stats.num_preemptions_recompute, 0u) << what;
    ASSERT_EQ(got.choices.size(), want.choices.size()) << what;
    for (const auto& [key, w] : want.choices) {
      const choice_result& g = got.choices.at(key);
      const std::string which =
          what + ": request " + std::to_string(key.first.value()) + " choice " + std::to_string(key.second);
      EXPECT_FALSE(w.tokens.empty()) << which;
      EXPECT_EQ(g.tokens, w.tokens) << which;
      EXPECT_EQ(g.reason, w.reason) << which;
      ASSERT_EQ(g.logprobs.size(), w.logprobs.size()) << which;
      for (size_t i = 0; i < w.logprobs.size(); ++i) EXPECT_NEAR(g.logprobs[i], w.logprobs[i], 1e-3f) << which;
    }
    std::printf("  %s: %llu of %llu steps overlapped; %llu swap and %llu recompute preemptions\n", what.c_str(),
                static_cast<unsigned long long>(got.stats.num_overlapped_steps),
                static_cast<unsigned long long>(got.stats.num_steps),
                static_cast<unsigned long long>(got.stats.num_preemptions_swap),
                static_cast<unsigned long long>(got.stats.num_preemptions_recompute));
  }
}

TEST(OverlappedStepsEngine, TheEngineGivesTheSameOutputsWithAndWithoutOverlap) {
  if (!cuda_executor_available()) GTEST_SKIP() << "no CUDA device (real or emulated)";
  expect_cuda_runs_equal_cpu(run_workload, 10, "plain");
}

// Grammar-constrained requests (step_batch::late_masks): each step's masks are filled only once the
// previous step's tokens reached the grammars, after that step was submitted, and by workers that take
// 3 ms (so the executor waits for them where it should). The script allows 16 tokens per position and
// completes after 12 (then the choice finishes, and the step planned ahead for it computed a token for
// nothing: its mask row allows any token). Constrained and plain requests side by side: seeded draws,
// a greedy one, logprobs, an n = 2 fork, a max_tokens short of the script, penalties, chunked prompts,
// one abort after its second token, and a pool small enough to preempt.
engine_run run_constrained_workload(executor& exec, bool overlap) {
  test_support::token_script script;
  const int32_t vocab = exec.config().vocab_size;
  for (int32_t k = 0; k < 12; ++k) {
    std::vector<token_id> allowed;
    for (int32_t j = 0; j < 16; ++j) allowed.push_back(static_cast<token_id>(1 + (k * 41 + j * 23) % (vocab - 1)));
    script.push_back(allowed);
  }
  auto backend = std::make_shared<test_support::scripted_backend>(
      [&](const structured_output_spec&) {
        return compile_result{std::make_shared<test_support::scripted_compiled>(script, 0)};
      },
      std::chrono::milliseconds(3));
  engine_options eo = workload_options(14, 48, overlap);
  eo.constraints = backend;
  llm_engine engine(exec, nullptr, eo);
  std::vector<request_id> ids;
  for (int32_t i = 0; i < 8; ++i) {
    sampling_params p;
    p.seed = 90 + i;
    p.max_tokens = 20;
    p.temperature = i % 4 == 0 ? 0.0f : 0.9f;
    if (i % 2 == 0) p.structured = structured_output_spec{structured_output_spec::kind::grammar, "scripted"};
    if (i == 2) p.logprobs = 1;
    if (i == 4) p.n = 2, p.top_k = 8;
    if (i == 6) p.max_tokens = 7, p.repetition_penalty = 1.3f;
    ids.push_back(engine.add_request(test_support::pseudo_tokens(20 + 13 * i, 30 + i, vocab), p));
  }
  engine_run r = drive(engine, ids[5], 2);
  for (size_t i = 0; i < ids.size(); i += 2) {  // the constrained ones: inside the script, complete unless cut
    const choice_result& c = r.choices[{ids[i], 0}];
    EXPECT_EQ(c.tokens.size(), i == 6 ? 7u : script.size()) << "request " << i;
    for (size_t k = 0; k < c.tokens.size() && k < script.size(); ++k)
      EXPECT_NE(std::find(script[k].begin(), script[k].end(), c.tokens[k]), script[k].end()) << i << " " << k;
  }
  return r;
}

TEST(OverlappedStepsEngine, GrammarConstrainedStepsOverlapWithTheSameOutputs) {
  if (!cuda_executor_available()) GTEST_SKIP() << "no CUDA device (real or emulated)";
  expect_cuda_runs_equal_cpu(run_constrained_workload, 9, "constrained");
}

// The CUDA executor with a device error found when a chosen step's results are taken: its wait()
// takes them and throws, as a failed synchronisation would.
class fails_at_wait : public executor {
 public:
  fails_at_wait(executor& inner, int32_t at) : inner_(inner), at_(at) {}
  const model_config& config() const override { return inner_.config(); }
  const kv_cache_spec& kv_spec() const override { return inner_.kv_spec(); }
  int64_t kv_block_bytes() const override { return inner_.kv_block_bytes(); }
  const char* name() const override { return inner_.name(); }
  bool samples_on_device() const override { return inner_.samples_on_device(); }
  bool overlaps_steps() const override { return inner_.overlaps_steps(); }
  bool takes_late_masks() const override { return inner_.takes_late_masks(); }
  void execute(const step_batch& batch, step_output& out) override {
    submit(batch);
    wait(out);
  }
  void submit(const step_batch& batch) override { inner_.submit(batch); }
  void wait(step_output& out) override {
    inner_.wait(out);
    if (++waits_ == at_) throw std::runtime_error("device error at step " + std::to_string(at_));
  }

 private:
  executor& inner_;
  int32_t at_ = 0, waits_ = 0;
};

// A step committed ahead of its results (its full blocks entered the prefix cache then) fails when
// they are taken: its request fails, and nothing of its blocks is served from the prefix cache to the
// next request with the same prompt, which is computed again and decodes as the CPU executor does.
TEST(OverlappedStepsEngine, AStepThatFailsAfterItsPlanWasCommittedLeavesNothingInThePrefixCache) {
  if (!cuda_executor_available()) GTEST_SKIP() << "no CUDA device (real or emulated)";
  const auto weights = tiny_weights();
  const auto cpu = test_support::cpu_reference_executor(weights, test_support::kv_pool(64, 0), 2);
  const auto cuda = f32_cuda(weights, test_support::kv_pool(64, 0), true);
  const std::vector<token_id> prompt = test_support::pseudo_tokens(40, 9, weights->config.vocab_size);
  sampling_params greedy;
  greedy.temperature = 0;
  greedy.max_tokens = 12;
  engine_options eo;
  eo.block_size = 16;
  eo.num_host_blocks = 0;
  const auto generate = [&](llm_engine& engine, request_output* last) {
    engine.add_request(prompt, greedy);
    std::vector<token_id> out;
    while (engine.has_unfinished()) {
      for (request_output& r : engine.step()) {
        out.insert(out.end(), r.token_ids.begin(), r.token_ids.end());
        if (r.finished) *last = r;
      }
    }
    return out;
  };
  request_output want_last;
  llm_engine oracle(*cpu, nullptr, eo);
  const std::vector<token_id> want = generate(oracle, &want_last);

  fails_at_wait failing(*cuda, 4);  // the prompt's step, then decodes: the fourth step was committed ahead
  llm_engine engine(failing, nullptr, eo);
  ASSERT_TRUE(engine.overlaps_steps());
  request_output failed;
  generate(engine, &failed);
  EXPECT_EQ(failed.reason, finish_reason::error);
  EXPECT_NE(failed.error.find("device error at step 4"), std::string::npos) << failed.error;
  EXPECT_EQ(engine.stats().num_failed_steps, 1u);
  EXPECT_GT(engine.stats().num_overlapped_steps, 0u);
  request_output again;
  EXPECT_EQ(generate(engine, &again), want);
  EXPECT_EQ(again.reason, finish_reason::length);
  EXPECT_EQ(again.num_cached_prompt_tokens, 0) << "blocks of the failed step's request came from the cache";
  EXPECT_EQ(engine.get_scheduler().check_invariants(), "");
  // Without a failure the same prompt's full blocks are served from the cache (what the check above
  // would see had they stayed).
  request_output cached;
  EXPECT_EQ(generate(engine, &cached), want);
  EXPECT_EQ(cached.num_cached_prompt_tokens, 32);
}

INSTANTIATE_TEST_SUITE_P(Graphs, OverlappedSteps, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "graphs" : "eager"; });

}  // namespace
}  // namespace tessera
