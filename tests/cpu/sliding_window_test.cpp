// Sliding-window attention in the paged cache, on a real model: the tiny Mistral fixture
// (tests/data/models/mistral: 2 layers, both with a window of 8) on the CPU executor, through the engine,
// with a prompt many times the window and 16 greedy tokens. With block freeing (the default) and without
// it the engine must produce the same tokens from bit-identical logits, and with it no sequence holds
// more than window / block_size + 2 blocks; the executor is handed tables whose freed entries are
// no_block, which it never touches (it aborts if it does). The counts are in docs/models.md.
// The interleaved fixtures (tiny Gemma 2 and Gemma 3: a sliding layer with window 8 and a global one)
// run the same way with KV layer groups (a table per group, engine/model/kv_layer_groups.hpp) against
// one table for both layers: same logits bit for bit, and the sliding layer's old blocks freed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cpu/cpu_executor.hpp"
#include "engine/base/error.hpp"
#include "engine/llm_engine.hpp"
#include "engine/model/kv_layer_groups.hpp"
#include "engine/model/model_loader.hpp"

namespace tessera {
namespace {

namespace fs = std::filesystem;

const loaded_model& fixture(const std::string& name) {
  static std::map<std::string, loaded_model> models;
  auto it = models.find(name);
  if (it == models.end())
    it = models.emplace(name, load_model(fs::path(TESSERA_TEST_DATA_DIR) / "models" / name)).first;
  return it->second;
}
const loaded_model& mistral() { return fixture("mistral"); }

// A long prompt: the fixture's own sentence and a few pangrams, about 15 windows of the tiny vocabulary.
std::vector<token_id> long_prompt(const loaded_model& model = mistral()) {
  return model.tok->encode(
      "The quick brown fox jumps over the lazy dog. Pack my box. Sphinx of black quartz, judge my vow. How "
      "razorback-jumping frogs can level six piqued gymnasts! The five boxing wizards jump quickly over the "
      "lazy dog's back. The quick brown fox jumps over the lazy dog.",
      {.add_special = false, .parse_special = false});
}

// Passes steps to the CPU executor and records, per sequence, every logits row and the most blocks a
// step's table held; checks that freed (no_block) entries lie before the slice's window.
class recording_executor final : public executor {
 public:
  explicit recording_executor(executor& inner) : inner_(inner) {}
  const model_config& config() const override { return inner_.config(); }
  const kv_cache_spec& kv_spec() const override { return inner_.kv_spec(); }
  int64_t kv_block_bytes() const override { return inner_.kv_block_bytes(); }
  const char* name() const override { return "recording"; }
  bool reads_only_window() const override { return inner_.reads_only_window(); }
  kv_layer_groups kv_groups() const override { return inner_.kv_groups(); }

  void execute(const step_batch& batch, step_output& out) override {
    const int32_t bs = kv_spec().block_size;
    const kv_layer_groups groups = kv_groups();
    for (const sequence_slice& s : batch.seqs) {
      const int32_t end = s.num_computed + static_cast<int32_t>(s.tokens.size());
      int32_t held = 0;
      for (int32_t g = 0; g < groups.num_groups(); ++g) {
        const int32_t w = groups.windows[static_cast<size_t>(g)];
        const int32_t first_read = w > 0 ? std::max(0, s.num_computed - w + 1) / bs : 0;
        for (int32_t b = 0; b < (end + bs - 1) / bs; ++b) {
          const block_id id = s.table(g)[static_cast<size_t>(b)];
          if (id == no_block) {
            ++freed_entries;
            EXPECT_LT(b, first_read) << "a freed entry inside the window, seq " << s.seq << " group " << g;
          } else {
            ++held;
          }
        }
      }
      int32_t& peak = peak_held[s.seq];
      peak = std::max(peak, held);
      if (s.tokens.size() == 1) decode_peak = std::max(decode_peak, held);
    }
    inner_.execute(batch, out);
    for (size_t i = 0; i < batch.seqs.size(); ++i) {
      for (int32_t r = 0; r < out.num_rows[i]; ++r) {
        const auto row = out.row(out.first_row[i] + r);
        rows[batch.seqs[i].seq].emplace_back(row.begin(), row.end());
      }
    }
  }

  std::map<seq_id, std::vector<std::vector<float>>> rows;
  std::map<seq_id, int32_t> peak_held;
  int32_t decode_peak = 0;
  int64_t freed_entries = 0;

 private:
  executor& inner_;
};

struct run_result {
  std::vector<token_id> tokens;
  std::map<seq_id, std::vector<std::vector<float>>> rows;
  int32_t peak_in_step = 0;  // most blocks one step's table held
  int32_t decode_peak = 0;   // the same over decode steps
  int32_t peak_between = 0;  // most blocks held after a step (the step records)
  int32_t held_at_end = 0;   // blocks held after the last computed token
  int64_t freed_entries = 0;
  uint64_t window_freed = 0;
  int64_t block_bytes = 0;
};

run_result serve(const std::vector<token_id>& prompt, bool free_window_blocks, int32_t chunk,
                 const loaded_model& model = mistral(), bool layer_groups = false) {
  cpu_executor_options o;
  o.num_threads = 2;
  o.kv.block_size = 16;
  o.kv.num_device_blocks = 32 * (layer_groups ? group_kv_layers(model.weights->config).num_groups() : 1);
  o.kv_layer_groups = layer_groups;
  auto cpu = make_cpu_executor(model.weights, o);
  recording_executor rec(*cpu);
  engine_options eo;
  eo.block_size = 16;
  eo.num_kv_blocks = o.kv.num_device_blocks;
  eo.max_num_batched_tokens = chunk;
  eo.free_window_blocks = free_window_blocks;
  llm_engine engine(rec, model.tok, eo);
  sampling_params greedy;
  greedy.temperature = 0;
  greedy.max_tokens = 16;
  greedy.ignore_eos = true;
  engine.add_request(prompt, greedy);
  run_result r;
  while (engine.has_unfinished()) {
    for (const request_output& out : engine.step())
      r.tokens.insert(r.tokens.end(), out.token_ids.begin(), out.token_ids.end());
    for (const sequence_blocks& b : engine.last_record().running) {
      r.peak_between = std::max(r.peak_between, b.num_blocks);
      r.held_at_end = b.num_blocks;
    }
    EXPECT_EQ(engine.get_scheduler().check_invariants(), "");
  }
  for (const auto& [seq, peak] : rec.peak_held) r.peak_in_step = std::max(r.peak_in_step, peak);
  r.decode_peak = rec.decode_peak;
  r.rows = std::move(rec.rows);
  r.freed_entries = rec.freed_entries;
  r.window_freed = engine.stats().num_window_freed_blocks;
  r.block_bytes = cpu->kv_block_bytes();
  return r;
}

// Gemma 2 and 3 (tiny fixtures: layer 0 slides with window 8, layer 1 is global): with a table per
// layer group the sliding layer's blocks before its window are freed, while one table for both layers
// keeps everything; the logits are the same bit for bit, and at the end the grouped cache holds the
// global layer's whole length but only the sliding layer's window.
TEST(SlidingWindow, InterleavedLayerGroupsFreeTheSlidingLayersBlocksWithIdenticalLogits) {
  for (const std::string name : {"gemma2", "gemma3"}) {
    const loaded_model& model = fixture(name);
    const model_config& c = model.weights->config;
    ASSERT_EQ(c.kv_window(), 0) << name << ": its global layer keeps every position";
    const kv_layer_groups groups = group_kv_layers(c);
    ASSERT_EQ(groups.num_groups(), 2) << name;
    ASSERT_EQ(groups.layers_per_block, 1);
    ASSERT_EQ(groups.windows, (std::vector<int32_t>{8, 0}));
    const std::vector<token_id> prompt = long_prompt(model);
    ASSERT_GE(prompt.size(), 8u * 8u) << "several times the window";
    ASSERT_LE(prompt.size() + 16, static_cast<size_t>(c.context_length));
    for (const int32_t chunk : {8, 2048}) {
      const run_result grouped = serve(prompt, true, chunk, model, true);
      const run_result single = serve(prompt, true, chunk, model, false);
      ASSERT_EQ(grouped.tokens.size(), 16u);
      EXPECT_EQ(grouped.tokens, single.tokens) << name << " chunk " << chunk;
      EXPECT_TRUE(grouped.rows == single.rows) << name << " chunk " << chunk << ": logits differ bit for bit";
      EXPECT_EQ(single.window_freed, 0u) << "one table for both layers frees nothing";
      EXPECT_EQ(grouped.block_bytes * 2, single.block_bytes) << "a grouped block holds one of the two layers";
      const int32_t total = static_cast<int32_t>(prompt.size()) + 16 - 1;
      EXPECT_EQ(grouped.window_freed, static_cast<uint64_t>((total - 8 + 1) / 16)) << name << " chunk " << chunk;
      // At the end (the record of the step before the last, at total - 1 computed): the global group's
      // ceil((total - 1) / 16) blocks plus at most window / block_size + 2 of the sliding group.
      const int32_t global_blocks = (total - 1 + 15) / 16;
      EXPECT_EQ(single.held_at_end, global_blocks);
      EXPECT_LE(grouped.held_at_end, global_blocks + 8 / 16 + 2);
      const int64_t bytes_grouped = grouped.held_at_end * grouped.block_bytes;
      const int64_t bytes_single = single.held_at_end * single.block_bytes;
      EXPECT_LT(bytes_grouped * 10, bytes_single * 6) << "the sliding layer's half is mostly freed";
      std::printf(
          "  %s tiny (layers: window 8 + global; block 16), %zu-token prompt + 16 greedy, prefill chunks of %d: KV "
          "held at the end %lld bytes with layer groups vs %lld with one table; %llu blocks freed early; logits "
          "bit-identical\n",
          name.c_str(), prompt.size(), chunk, static_cast<long long>(bytes_grouped),
          static_cast<long long>(bytes_single), static_cast<unsigned long long>(grouped.window_freed));
    }
  }
}

TEST(SlidingWindow, MistralFreesBlocksWithIdenticalLogitsAndTokens) {
  const model_config& c = mistral().weights->config;
  ASSERT_EQ(c.kv_window(), 8) << "both layers of the fixture have the window";
  const std::vector<token_id> prompt = long_prompt();
  ASSERT_GE(prompt.size(), 12u * 8u) << "several times the window";
  ASSERT_LE(prompt.size() + 16, static_cast<size_t>(c.context_length));
  const int32_t bound = c.kv_window() / 16 + 2;  // window / block_size + 2
  for (const int32_t chunk : {8, 2048}) {
    const run_result on = serve(prompt, true, chunk);
    const run_result off = serve(prompt, false, chunk);
    ASSERT_EQ(on.tokens.size(), 16u);
    EXPECT_EQ(on.tokens, off.tokens) << "chunk " << chunk;
    EXPECT_TRUE(on.rows == off.rows) << "chunk " << chunk << ": logits differ bit for bit";
    EXPECT_GT(on.freed_entries, 0);
    EXPECT_EQ(off.freed_entries, 0);
    EXPECT_EQ(off.window_freed, 0u);
    EXPECT_LE(on.peak_between, bound) << "chunk " << chunk;
    EXPECT_LE(on.decode_peak, bound) << "chunk " << chunk;
    // A prefill chunk of 8 spans at most 8 + 7 positions: two blocks, within the bound too; the whole
    // prompt in one step holds all its blocks during that step (freed at its commit).
    if (chunk == 8) { EXPECT_LE(on.peak_in_step, bound); }
    // The last step computes position L + 14 (the 16th token is sampled, never computed): L + 15
    // computed, of which the first (L + 15 - 8 + 1) / 16 blocks are dead. The last record that still
    // lists the sequence is the step before, at L + 14 computed.
    const int32_t total = static_cast<int32_t>(prompt.size()) + 16 - 1;
    EXPECT_EQ(on.window_freed, static_cast<uint64_t>((total - 8 + 1) / 16));
    EXPECT_EQ(off.held_at_end, (total - 1 + 15) / 16) << "without freeing it holds its whole length";
    std::printf(
        "  mistral tiny (window 8, block 16), %zu-token prompt + 16 greedy, prefill chunks of %d: blocks held "
        "at the end %d with freeing vs %d without; most in one step %d vs %d; %llu blocks freed early; "
        "logits bit-identical\n",
        prompt.size(), chunk, on.held_at_end, off.held_at_end, on.peak_in_step, off.peak_in_step,
        static_cast<unsigned long long>(on.window_freed));
  }
}

// The executor itself: a table whose entries before the window are no_block gives the same logits as
// the full table (it never looks at them), and a freed entry inside the window is refused before any
// KV is touched.
TEST(SlidingWindow, CpuExecutorNeverReadsFreedEntries) {
  const std::vector<token_id> prompt = long_prompt();
  cpu_executor_options o;
  o.num_threads = 2;
  o.kv.block_size = 16;
  o.kv.num_device_blocks = 16;
  auto ex = make_cpu_executor(mistral().weights, o);
  ASSERT_TRUE(ex->reads_only_window());
  std::vector<block_id> table(16);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<block_id>(i);
  step_output out;
  step_batch prefill;
  sequence_slice s;
  s.seq = seq_id{1};
  s.tokens = prompt;
  s.block_table = table;
  s.logits = sequence_slice::logits_mode::none;
  prefill.seqs.push_back(s);
  ex->execute(prefill, out);
  const int32_t n = static_cast<int32_t>(prompt.size());
  auto decode = [&](std::vector<block_id> t) {
    step_batch d;
    sequence_slice one;
    one.seq = seq_id{1};
    one.tokens = {prompt.front()};
    one.num_computed = n;
    one.block_table = std::move(t);
    d.seqs.push_back(one);
    ex->execute(d, out);
    auto row = out.row(0);
    return std::vector<float>(row.begin(), row.end());
  };
  const std::vector<float> full = decode(table);
  std::vector<block_id> freed = table;
  const int32_t first_read = (n - 8 + 1) / 16;  // the query at n reads keys n - 7 .. n
  for (int32_t b = 0; b < first_read; ++b) freed[static_cast<size_t>(b)] = no_block;
  EXPECT_EQ(decode(freed), full);
  std::vector<block_id> inside = freed;
  inside[static_cast<size_t>(first_read)] = no_block;
  EXPECT_THROW(decode(inside), invalid_request);
}

}  // namespace
}  // namespace tessera
