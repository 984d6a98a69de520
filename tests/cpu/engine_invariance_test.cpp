// Engine-level invariance on the real model (SmolLM2-135M, CPU executor): a request's greedy
// output must not depend on how the engine served it — alone, in a batch of 32 other prompts, with
// its prompt prefilled in small chunks, after being preempted by swap or by recompute, or with its
// prompt prefix served from the prefix cache. Each of those changes only the paging and batching
// around the request, never the math of its own tokens. Every test runs for each KV-cache dtype (fp32,
// fp16, bf16, int8): a token's K and V are rounded once, when written, whichever path wrote them.
// Skipped when models/ has no model.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cpu/cpu_executor.hpp"
#include "engine/llm_engine.hpp"
#include "engine/model/model_loader.hpp"

namespace tessera {
namespace {

constexpr int32_t block_size = 16;
constexpr int32_t num_output_tokens = 32;

struct model_fixture {
  loaded_model model;
  std::unique_ptr<executor> exec;
};

// One executor per KV dtype over one loaded model (null when the model file is missing).
model_fixture* shared_model(cpu_kv_dtype dtype) {
  static std::map<cpu_kv_dtype, std::unique_ptr<model_fixture>> fixtures;
  static const std::optional<loaded_model> model = []() -> std::optional<loaded_model> {
    const std::filesystem::path path = std::filesystem::path(TESSERA_MODEL_DIR) / "SmolLM2-135M-Instruct.Q4_1.gguf";
    if (!std::filesystem::exists(path)) return std::nullopt;
    return load_model(path);
  }();
  if (!model) return nullptr;
  std::unique_ptr<model_fixture>& f = fixtures[dtype];
  if (!f) {
    f = std::make_unique<model_fixture>();
    f->model = *model;
    cpu_executor_options o;
    o.num_threads = 2;
    o.kv.block_size = block_size;
    o.kv.num_device_blocks = 160;
    o.kv.num_host_blocks = 64;
    o.kv_dtype = dtype;
    f->exec = make_cpu_executor(f->model.weights, o);
    EXPECT_STREQ(f->exec->kv_cache_dtype(), to_string(dtype));
  }
  return f.get();
}

const std::vector<std::string>& other_texts() {
  static const std::vector<std::string> texts = {
      "The capital of France is",
      "Write a haiku about the sea.",
      "def fibonacci(n):",
      "List three primary colors:",
      "Once upon a time, in a small village,",
      "The quick brown fox",
      "Explain photosynthesis in one sentence.",
      "1, 2, 3, 4, 5,",
      "My favourite food is",
      "Translate 'good morning' into Spanish:",
      "The best way to learn programming is",
      "In 1969, astronauts",
      "A recipe for pancakes: first,",
      "Water boils at",
      "The largest planet in the solar system",
      "Dear diary, today",
  };
  return texts;
}

class engine_invariance : public ::testing::TestWithParam<cpu_kv_dtype> {
 protected:
  void SetUp() override {
    fixture_ = shared_model(GetParam());
    if (!fixture_) GTEST_SKIP() << "no model in " << TESSERA_MODEL_DIR;
  }

  std::vector<token_id> encode(const std::string& text) const { return fixture_->model.tok->encode(text); }

  static sampling_params greedy() {
    sampling_params p;
    p.temperature = 0;
    p.max_tokens = num_output_tokens;
    p.ignore_eos = true;  // always 32 tokens: the comparison covers the whole output
    return p;
  }

  engine_options options(int32_t num_blocks = 160, int32_t num_host = 64) const {
    engine_options o;
    o.block_size = block_size;
    o.num_kv_blocks = num_blocks;
    o.num_host_blocks = num_host;
    o.watermark = 0;
    return o;
  }

  struct run_result {
    std::map<request_id, std::vector<token_id>> tokens;
    engine_stats stats;
    std::vector<engine_event> events;
    std::map<request_id, int32_t> cached_prompt_tokens;
  };

  run_result run(llm_engine& engine) const {
    run_result r;
    while (engine.has_unfinished()) {
      for (const request_output& o : engine.step()) {
        auto& t = r.tokens[o.id];
        t.insert(t.end(), o.token_ids.begin(), o.token_ids.end());
        if (o.finished) {
          EXPECT_EQ(o.reason, finish_reason::length);
          r.cached_prompt_tokens[o.id] = o.num_cached_prompt_tokens;
        }
      }
      const auto& ev = engine.last_record().events;
      r.events.insert(r.events.end(), ev.begin(), ev.end());
    }
    r.stats = engine.stats();
    return r;
  }

  // The target request's output when it runs alone with default settings (cached per prompt).
  std::vector<token_id> reference(const std::vector<token_id>& prompt) {
    static std::map<std::pair<cpu_kv_dtype, std::vector<token_id>>, std::vector<token_id>> cache;
    const auto key = std::make_pair(GetParam(), prompt);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    llm_engine engine(*fixture_->exec, fixture_->model.tok, options());
    const request_id id = engine.add_request(prompt, greedy());
    return cache[key] = run(engine).tokens[id];
  }

  model_fixture* fixture_ = nullptr;
};

const char* target_text = "The history of the printing press begins";

TEST_P(engine_invariance, in_a_batch_of_32) {
  const std::vector<token_id> target = encode(target_text);
  const std::vector<token_id> alone = reference(target);
  ASSERT_EQ(alone.size(), static_cast<size_t>(num_output_tokens));
  llm_engine engine(*fixture_->exec, fixture_->model.tok, options());
  request_id id;
  for (int i = 0; i < 31; ++i) {
    if (i == 15) id = engine.add_request(target, greedy());  // somewhere in the middle
    engine.add_request(encode(other_texts()[static_cast<size_t>(i) % other_texts().size()] +
                              std::string(static_cast<size_t>(i / 16), '!')),
                       greedy());
  }
  auto r = run(engine);
  EXPECT_EQ(r.tokens[id], alone) << "batch of 32";
}

TEST_P(engine_invariance, with_chunked_prefill) {
  const std::vector<token_id> target = encode(target_text);
  const std::vector<token_id> alone = reference(target);
  for (const int32_t chunk : {3, 5, 16}) {  // the prompt prefilled in pieces of `chunk` tokens
    engine_options o = options();
    o.max_num_batched_tokens = chunk;
    llm_engine engine(*fixture_->exec, fixture_->model.tok, o);
    engine.add_request(encode(other_texts()[0]), greedy());
    const request_id id = engine.add_request(target, greedy());
    auto r = run(engine);
    EXPECT_EQ(r.tokens[id], alone) << "chunk size " << chunk;
  }
}

TEST_P(engine_invariance, with_stall_free_chunks_next_to_decodes) {
  // A long prompt arrives while another request decodes. A step-time target below any step's real
  // time makes every step prefill only min_prefill_tokens (8) of it next to the decode, whatever the
  // cost model learns from this machine: its prompt is computed across many steps, interleaved with
  // the other request's tokens. Both outputs equal their unchunked runs alone.
  std::vector<token_id> target = encode(target_text);
  for (int i = 0; i < 2; ++i)
    for (token_id t : encode(" in the fifteenth century, when Johannes Gutenberg, a goldsmith from Mainz, combined "
                             "movable metal type with an oil-based ink and a screw press"))
      target.push_back(t);
  const std::vector<token_id> other = encode(other_texts()[1]);
  const std::vector<token_id> target_alone = reference(target), other_alone = reference(other);
  engine_options o = options();
  o.target_step_seconds = 1e-6;
  o.min_prefill_tokens = 8;
  llm_engine engine(*fixture_->exec, fixture_->model.tok, o);
  std::map<request_id, std::vector<token_id>> tokens;
  const auto step = [&] {
    for (const request_output& out : engine.step()) {
      auto& t = tokens[out.id];
      t.insert(t.end(), out.token_ids.begin(), out.token_ids.end());
    }
  };
  const request_id first = engine.add_request(other, greedy());
  step();  // its whole prompt: nobody decodes yet, so no target applies
  EXPECT_EQ(engine.last_record().num_prefill_tokens, static_cast<int32_t>(other.size()));
  const request_id id = engine.add_request(target, greedy());
  int mixed_steps = 0;
  while (engine.has_unfinished()) {
    step();
    const step_record& r = engine.last_record();
    if (r.num_decode_tokens > 0 && r.num_prefill_tokens > 0) {
      ++mixed_steps;
      EXPECT_LE(r.num_prefill_tokens, 8) << "step " << r.step;
      EXPECT_EQ(r.prefill_budget, 8);
    }
  }
  EXPECT_GE(mixed_steps, static_cast<int>(target.size()) / 8) << target.size() << " prompt tokens";
  EXPECT_EQ(tokens[id], target_alone) << "the prompt chunked next to a decode";
  EXPECT_EQ(tokens[first], other_alone) << "the decode next to the chunks";
  const engine_stats st = engine.stats();
  EXPECT_GT(st.num_steps_prefill_limited, 0u);
  EXPECT_GT(st.measured_step_seconds, 0.0);
  EXPECT_GT(st.predicted_step_seconds, 0.0);
}

TEST_P(engine_invariance, after_preemption_by_swap_and_by_recompute) {
  const std::vector<token_id> target = encode(target_text);
  const std::vector<token_id> alone = reference(target);
  for (const preemption_mode mode : {preemption_mode::swap, preemption_mode::recompute}) {
    // 8 blocks = 128 slots for 4 requests of ~10 + 32 tokens: preemption is unavoidable. The
    // target arrives last, so it is the first victim.
    engine_options o = options(8, 32);
    o.preemption = mode;
    o.enable_prefix_caching = false;  // recompute really recomputes
    llm_engine engine(*fixture_->exec, fixture_->model.tok, o);
    for (int i = 0; i < 3; ++i) engine.add_request(encode(other_texts()[static_cast<size_t>(i) + 1]), greedy());
    const request_id id = engine.add_request(target, greedy());
    auto r = run(engine);
    const event_kind expected =
        mode == preemption_mode::swap ? event_kind::preempted_swap : event_kind::preempted_recompute;
    int target_preempted = 0;
    for (const auto& e : r.events) target_preempted += e.kind == expected && e.request == id;
    EXPECT_GT(target_preempted, 0) << "the target was never preempted (" << to_string(mode) << ")";
    EXPECT_EQ(r.tokens[id], alone) << "after preemption by " << to_string(mode);
  }
}

TEST_P(engine_invariance, in_forked_parallel_samples) {
  // n = 3 greedy: the prompt is prefilled once and forked; every choice writes its first token into
  // the shared partial last block, so each gets a copy-on-write copy. All must equal the reference.
  const std::vector<token_id> target = encode(target_text);
  ASSERT_NE(target.size() % block_size, 0u);
  const std::vector<token_id> alone = reference(target);
  llm_engine engine(*fixture_->exec, fixture_->model.tok, options());
  sampling_params p = greedy();
  p.n = 3;
  std::map<int32_t, std::vector<token_id>> choices;
  const request_id id = engine.add_request(target, p);
  while (engine.has_unfinished())
    for (const request_output& o : engine.step()) {
      ASSERT_EQ(o.id, id);
      choices[o.index].insert(choices[o.index].end(), o.token_ids.begin(), o.token_ids.end());
    }
  ASSERT_EQ(choices.size(), 3u);
  for (const auto& [index, tokens] : choices) EXPECT_EQ(tokens, alone) << "choice " << index;
}

TEST_P(engine_invariance, with_the_prefix_from_the_cache) {
  std::vector<token_id> target = encode(target_text);
  for (token_id t : encode(" in the fifteenth century, when Johannes Gutenberg, a goldsmith from Mainz, combined "
                           "movable metal type with an oil-based ink and a screw press"))
    target.push_back(t);
  const std::vector<token_id> alone = reference(target);
  llm_engine engine(*fixture_->exec, fixture_->model.tok, options());
  std::vector<token_id> warm = target;
  warm.back() = encode(" lever")[0];  // same prefix, different last token
  engine.add_request(warm, greedy());
  run(engine);
  const request_id id = engine.add_request(target, greedy());
  auto r = run(engine);
  EXPECT_GE(r.cached_prompt_tokens[id], block_size) << "no prefix-cache hit";
  EXPECT_EQ(r.tokens[id], alone) << "with the prefix from the cache";
}

INSTANTIATE_TEST_SUITE_P(kv_dtypes, engine_invariance,
                         ::testing::Values(cpu_kv_dtype::fp32, cpu_kv_dtype::fp16, cpu_kv_dtype::bf16,
                                           cpu_kv_dtype::int8),
                         [](const ::testing::TestParamInfo<cpu_kv_dtype>& i) {
                           return std::string(to_string(i.param));
                         });

}  // namespace
}  // namespace tessera
