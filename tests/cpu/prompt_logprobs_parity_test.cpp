// Prompt logprobs (sampling_params::prompt_logprobs on the CPU executor) against an independent
// reference: tests/data/prompt_logprobs/smollm_prompt_logprobs.json, every prompt position's
// log-softmax of SmolLM2-135M-Instruct's logits, which scripts/make_prompt_logprob_fixtures.py
// computes with numpy in float64 over the GGUF's dequantized weights (a forward pass it first checks
// against the transformers logits of tests/data/logits, to 1e-4).
//   - Tessera on those same float weights (dequantize_weights, f32 KV) must agree to float rounding:
//     the logprob of every prompt token, its rank, and the top-5 tokens where they are not near-ties.
//   - Tessera's serving path on the Q4_1 GGUF (Q8 activations, fp16 KV): a lower, measured bound.
// The three prompts go through the real step loop at once with a 64-token budget, so the 520-token
// prompt is scored in 9 chunks batched with the other two, with max_tokens 0 (scoring only) and with
// a generation after the prompt.
#include <gtest/gtest.h>
#include <simdjson.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "cpu/cpu_executor.hpp"
#include "engine/llm_engine.hpp"
#include "engine/model/model_loader.hpp"

namespace tessera {
namespace {

namespace fs = std::filesystem;

const fs::path gguf_path = fs::path(TESSERA_MODEL_DIR) / "SmolLM2-135M-Instruct.Q4_1.gguf";
const fs::path fixture = fs::path(TESSERA_TEST_DATA_DIR) / "prompt_logprobs" / "smollm_prompt_logprobs.json";

struct reference_position {
  token_id token = 0;
  double logprob = 0;
  int32_t rank = 0;
  std::vector<std::pair<token_id, double>> top;
};

struct reference {
  std::string name;
  std::vector<token_id> ids;
  std::vector<reference_position> positions;  // positions 1 .. ids.size() - 1
};

std::vector<reference> load_references() {
  simdjson::dom::parser parser;
  simdjson::dom::element doc = parser.load(fixture.string());
  std::vector<reference> out;
  for (simdjson::dom::element e : doc["prompts"].get_array()) {
    reference r;
    r.name = std::string(e["name"].get_string().value());
    for (int64_t id : e["ids"].get_array()) r.ids.push_back(static_cast<token_id>(id));
    for (simdjson::dom::element p : e["positions"].get_array()) {
      reference_position rp;
      rp.token = static_cast<token_id>(p["token"].get_int64().value());
      rp.logprob = p["logprob"].get_double().value();
      rp.rank = static_cast<int32_t>(p["rank"].get_int64().value());
      for (simdjson::dom::array t : p["top"].get_array()) {
        auto it = t.begin();
        const auto id = static_cast<token_id>((*it).get_int64().value());
        ++it;
        rp.top.emplace_back(id, (*it).get_double().value());
      }
      r.positions.push_back(std::move(rp));
    }
    out.push_back(std::move(r));
  }
  return out;
}

// Every reference prompt's prompt logprobs (top 5), all three requests in one engine (64-token steps).
std::vector<std::vector<prompt_logprob>> score_all(const loaded_model& m, const std::vector<reference>& refs,
                                                   cpu_kv_dtype kv, bool dequantize, int32_t max_tokens) {
  cpu_executor_options o;
  o.dequantize_weights = dequantize;
  o.num_threads = 2;
  o.kv.block_size = 16;
  o.kv.num_device_blocks = 64;
  o.kv_dtype = kv;
  auto exec = make_cpu_executor(m.weights, o);
  engine_options eo;
  eo.block_size = 16;
  eo.max_num_batched_tokens = 64;
  llm_engine engine(*exec, m.tok, eo);
  std::map<request_id, size_t> which;
  sampling_params p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.prompt_logprobs = 5;
  for (size_t i = 0; i < refs.size(); ++i) which[engine.add_request(refs[i].ids, p)] = i;
  std::vector<std::vector<prompt_logprob>> out(refs.size());
  while (engine.has_unfinished()) {
    for (request_output& r : engine.step()) {
      EXPECT_TRUE(r.error.empty()) << r.error;
      if (!r.prompt_logprobs.empty()) out[which.at(r.id)] = std::move(r.prompt_logprobs);
    }
  }
  const auto& bm = engine.get_scheduler().blocks();
  EXPECT_EQ(bm.num_free_blocks(), bm.num_device_blocks());
  return out;
}

struct agreement {
  double max_error = 0, mean_error = 0;
  int32_t rank_mismatches = 0, top_mismatches = 0, top_compared = 0;
};

// got against ref: |logprob error| of every position, ranks, and the top-5 ids wherever the reference's
// neighbouring logprobs are more than `tie` apart (closer ones may swap under rounding).
agreement compare(const std::vector<prompt_logprob>& got, const reference& ref, double tie) {
  agreement a;
  EXPECT_EQ(got.size(), ref.ids.size()) << ref.name;
  if (got.size() != ref.ids.size()) return a;
  EXPECT_FALSE(got[0].has_logprob()) << ref.name;
  EXPECT_EQ(got[0].token, ref.ids[0]);
  for (size_t i = 1; i < got.size(); ++i) {
    const reference_position& want = ref.positions[i - 1];
    EXPECT_EQ(got[i].token, want.token) << ref.name << " position " << i;
    EXPECT_TRUE(got[i].has_logprob());
    const double e = std::fabs(double(got[i].logprob) - want.logprob);
    a.max_error = std::max(a.max_error, e);
    a.mean_error += e / double(got.size() - 1);
    a.rank_mismatches += got[i].rank != want.rank;
    EXPECT_EQ(got[i].top.size(), 5u);
    for (size_t k = 0; k < got[i].top.size() && k < want.top.size(); ++k) {
      const bool clear = (k == 0 || want.top[k - 1].second - want.top[k].second > tie) &&
                         (k + 1 >= want.top.size() || want.top[k].second - want.top[k + 1].second > tie);
      if (!clear) continue;
      ++a.top_compared;
      a.top_mismatches += got[i].top[k].first != want.top[k].first;
    }
  }
  return a;
}

#define SKIP_WITHOUT(path) \
  if (!fs::exists(path)) GTEST_SKIP() << "needs " << (path) << " (scripts/setup)"

TEST(prompt_logprobs_parity, float_weights_match_the_reference_to_float_rounding) {
  SKIP_WITHOUT(gguf_path);
  const std::vector<reference> refs = load_references();
  ASSERT_EQ(refs.size(), 3u);
  const loaded_model m = load_model(gguf_path);
  for (const int32_t max_tokens : {0, 3}) {
    const auto got = score_all(m, refs, cpu_kv_dtype::fp32, /*dequantize=*/true, max_tokens);
    for (size_t i = 0; i < refs.size(); ++i) {
      const agreement a = compare(got[i], refs[i], 1e-3);
      std::printf(
          "float weights, max_tokens %d, %-5s (%3zu tokens): max |logprob error| %.2e, mean %.2e, "
          "rank mismatches %d, top-5 mismatches %d of %d\n",
          max_tokens, refs[i].name.c_str(), refs[i].ids.size(), a.max_error, a.mean_error, a.rank_mismatches,
          a.top_mismatches, a.top_compared);
      // Measured: max error <= 2.4e-5, mean <= 5.1e-6, no rank or top-5 mismatch (float32 against float64).
      EXPECT_LT(a.max_error, 1e-4) << refs[i].name;
      EXPECT_EQ(a.top_mismatches, 0) << refs[i].name;
      EXPECT_GT(a.top_compared, 3 * int32_t(refs[i].ids.size())) << refs[i].name;
      EXPECT_LE(a.rank_mismatches, 2) << refs[i].name << ": ranks may differ only at near-ties";
    }
  }
}

TEST(prompt_logprobs_parity, q4_1_serving_path_stays_close_to_the_reference) {
  SKIP_WITHOUT(gguf_path);
  const std::vector<reference> refs = load_references();
  const loaded_model m = load_model(gguf_path);
  const auto got = score_all(m, refs, cpu_kv_dtype::automatic, /*dequantize=*/false, 1);
  for (size_t i = 0; i < refs.size(); ++i) {
    const agreement a = compare(got[i], refs[i], 0.25);
    std::printf(
        "Q4_1 serving path, %-5s (%3zu tokens): max |logprob error| %.3f, mean %.4f, rank mismatches %d, "
        "top-5 mismatches %d of %d (gaps > 0.25)\n",
        refs[i].name.c_str(), refs[i].ids.size(), a.max_error, a.mean_error, a.rank_mismatches, a.top_mismatches,
        a.top_compared);
    // Measured (Q4_1 weights and Q8 activations against the float weights): mean |error| 0.118 (short),
    // 0.049 (long), 0.091 (chat); max 0.23, 1.01, 0.75. An off-by-one scores a mean of 2.1 (below).
    EXPECT_LT(a.mean_error, 0.2) << refs[i].name;
    EXPECT_LT(a.max_error, 1.5) << refs[i].name;
  }
  // An off-by-one (position i scored from row i instead of i - 1) is far off: the long prompt's logprobs
  // shifted by one position.
  const reference& longest = refs[1];
  double shifted = 0;
  for (size_t i = 1; i + 1 < longest.ids.size(); ++i)
    shifted += std::fabs(double(got[1][i].logprob) - longest.positions[i].logprob) / double(longest.ids.size() - 2);
  std::printf("shifted by one position: mean |logprob error| %.3f\n", shifted);
  EXPECT_GT(shifted, 1.0);
}

}  // namespace
}  // namespace tessera
