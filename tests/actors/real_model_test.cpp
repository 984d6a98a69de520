// The facade on the real default model (SmolLM2-135M, CPU executor): 64 concurrent requests, text and
// chat prompts, greedy and seeded sampling; every stream carries exactly the tokens the offline
// llm_engine produces for the same requests, in order, with one final message. Skipped when models/
// has no model.
#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "actor_test_support.hpp"
#include "actors/engine_facade.hpp"
#include "cpu/cpu_executor.hpp"
#include "engine/model/model_loader.hpp"

namespace tessera::actors {
namespace {

using namespace std::chrono_literals;

constexpr int32_t num_requests = 64;
constexpr int32_t num_output_tokens = 16;

std::unique_ptr<executor> make_executor(const loaded_model& model) {
  cpu_executor_options o;
  o.num_threads = 2;
  o.kv.block_size = 16;
  o.kv.num_device_blocks = 200;
  o.kv.num_host_blocks = 0;
  return make_cpu_executor(model.weights, o);
}

TEST(real_model, sixty_four_concurrent_streams_equal_the_offline_engine) {
  const std::filesystem::path path = std::filesystem::path(TESSERA_MODEL_DIR) / "SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no model in " << TESSERA_MODEL_DIR;
  const loaded_model model = load_model(path);
  const std::vector<std::string> texts = {
      "The capital of France is", "def fibonacci(n):",   "List three primary colors:", "The quick brown fox",
      "Water boils at",           "In 1969, astronauts", "My favourite food is",       "1, 2, 3, 4, 5,",
  };

  facade_options options;
  options.engine.block_size = 16;
  options.engine.max_num_seqs = num_requests;
  options.engine.max_num_batched_tokens = 1024;
  options.num_caf_threads = 2;
  options.warm_up = true;  // exercises the start-up path (a 1-token request)
  facade_components components;
  components.exec = make_executor(model);
  components.tok = model.tok;
  std::string warning;
  components.chat = chat_template::from_model_or_fallback(model.chat_template, &warning);
  const chat_template chat = *components.chat;
  engine_facade engine(std::move(components), options);

  // Requests: text prompts and, for one in eight, a one-turn chat (rendered with the model template by a
  // tokenizer actor); greedy or seeded temperature sampling.
  std::vector<prompt_input> prompts;
  std::vector<testing::offline_request> offline;
  for (int32_t i = 0; i < num_requests; ++i) {
    const std::string& text = texts[static_cast<size_t>(i / 2) % texts.size()];
    sampling_params p;
    p.max_tokens = num_output_tokens;
    p.ignore_eos = true;
    if (i % 4 >= 2) {
      p.temperature = 0.9f;
      p.seed = static_cast<uint64_t>(i);
    } else {
      p.temperature = 0;
    }
    std::vector<token_id> ids;
    if (i % 8 != 1) {
      prompts.push_back(prompt_input::from_text(text));
      encode_options o;
      o.add_special = model.tok->add_bos();
      ids = model.tok->encode(text, o);
    } else {
      prompts.push_back(prompt_input::from_chat({{"user", text}}));
      render_options r;
      if (auto bos = model.tok->bos()) r.bos_token = model.tok->token_text(*bos);
      if (auto eos = model.tok->eos()) r.eos_token = model.tok->token_text(*eos);
      const std::string rendered = chat.render({{"user", text}}, r);
      encode_options o;
      o.parse_special = true;
      ids = model.tok->encode(rendered, o);
    }
    offline.push_back({ids, p});
  }

  std::vector<stream_handle> streams;
  for (int32_t i = 0; i < num_requests; ++i) {
    submit_result r = engine.submit(prompts[static_cast<size_t>(i)], offline[static_cast<size_t>(i)].params);
    ASSERT_TRUE(r) << r.message;
    streams.push_back(r.stream);
  }
  std::vector<std::vector<token_id>> got(num_requests);
  std::vector<stream_final> finals(num_requests);
  std::vector<std::thread> readers;
  for (int t = 0; t < 2; ++t)
    readers.emplace_back([&, t] {
      for (int32_t i = t; i < num_requests; i += 2) {
        std::vector<stream_delta> deltas;
        finals[static_cast<size_t>(i)] = streams[static_cast<size_t>(i)].wait(&deltas);
        for (const auto& d : deltas)
          got[static_cast<size_t>(i)].insert(got[static_cast<size_t>(i)].end(), d.output.token_ids.begin(),
                                             d.output.token_ids.end());
      }
    });
  for (auto& r : readers) r.join();
  engine.shutdown();

  auto offline_exec = make_executor(model);
  const auto expected = testing::run_offline(*offline_exec, model.tok, options.engine, offline);
  for (int32_t i = 0; i < num_requests; ++i) {
    const auto k = static_cast<size_t>(i);
    EXPECT_EQ(finals[k].reason, finish_reason::length) << "request " << i << ": " << finals[k].error;
    EXPECT_EQ(finals[k].num_prompt_tokens, static_cast<int32_t>(offline[k].prompt.size())) << "request " << i;
    ASSERT_EQ(expected[k].size(), static_cast<size_t>(num_output_tokens));
    EXPECT_EQ(got[k], expected[k]) << "request " << i;
  }
}

}  // namespace
}  // namespace tessera::actors
