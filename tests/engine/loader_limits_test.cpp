// The loaders' limits that protect the process rather than check the format (docs/security.md,
// "Limits"): every model or JSON file is refused unless it is a regular file (a FIFO used to block
// open() forever, /dev/zero to be read without end), and HF token ids are bounded by the declared
// vocabulary before anything is allocated for them (one added token at id 2^24 - 1 used to cost
// 3.1 GB and 20 s). Each case runs in a forked child with a deadline (tests/support/child_process.hpp),
// so that a regression fails its test instead of hanging or exhausting the suite.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "engine/base/error.hpp"
#include "engine/model/gguf.hpp"
#include "engine/model/hf_model.hpp"
#include "engine/model/model_loader.hpp"
#include "engine/model/safetensors.hpp"
#include "engine/text/hf_tokenizer.hpp"
#include "support/child_process.hpp"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// Far above what any of these cases needs (milliseconds); only a hang or a multi-second allocation
// storm reaches it.
constexpr auto k_deadline = 60s;

struct temp_dir {
  fs::path path;
  explicit temp_dir(const std::string& name)
      : path(fs::temp_directory_path() / ("tessera_limits_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~temp_dir() { fs::remove_all(path); }
};

void write_text(const fs::path& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// ---- a complete tiny HF checkpoint: 1 layer, hidden 8, 2 heads of 4, 1 KV head, FFN 16, vocab 4 ----

constexpr int k_vocab = 4;

std::string config_json(int vocab_size = k_vocab) {
  return R"({"architectures":["LlamaForCausalLM"],"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,)"
         R"("num_attention_heads":2,"num_key_value_heads":1,"rms_norm_eps":1e-05,"rope_theta":10000.0,)"
         R"("max_position_embeddings":64,"tie_word_embeddings":true,"vocab_size":)" +
         std::to_string(vocab_size) + "}";
}

// "a" 0, "b" 1, "ab" 2 (merge "a b"), added special "<|end|>" at `added_id`.
std::string tokenizer_json(int64_t added_id = 3, int64_t vocab_b_id = 1) {
  return R"({"added_tokens":[{"id":)" + std::to_string(added_id) +
         R"(,"content":"<|end|>","special":true}],"pre_tokenizer":{"type":"ByteLevel","use_regex":true},)"
         R"("model":{"type":"BPE","vocab":{"a":0,"b":)" +
         std::to_string(vocab_b_id) + R"(,"ab":2},"merges":["a b"]}})";
}

void write_safetensors(const fs::path& path) {
  struct spec {
    std::string name;
    std::vector<int64_t> shape;
  };
  const std::string l = "model.layers.0.";
  const std::vector<spec> tensors = {
      {"model.embed_tokens.weight", {k_vocab, 8}}, {"model.norm.weight", {8}},
      {l + "input_layernorm.weight", {8}},         {l + "self_attn.q_proj.weight", {8, 8}},
      {l + "self_attn.k_proj.weight", {4, 8}},     {l + "self_attn.v_proj.weight", {4, 8}},
      {l + "self_attn.o_proj.weight", {8, 8}},     {l + "post_attention_layernorm.weight", {8}},
      {l + "mlp.gate_proj.weight", {16, 8}},       {l + "mlp.up_proj.weight", {16, 8}},
      {l + "mlp.down_proj.weight", {8, 16}},
  };
  std::string header = "{";
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    uint64_t n = 4;
    std::string shape;
    for (int64_t d : t.shape) {
      n *= static_cast<uint64_t>(d);
      shape += (shape.empty() ? "" : ",") + std::to_string(d);
    }
    header += (header.size() > 1 ? ",\"" : "\"") + t.name + R"(":{"dtype":"F32","shape":[)" + shape +
              R"(],"data_offsets":[)" + std::to_string(offset) + "," + std::to_string(offset + n) + "]}";
    offset += n;
  }
  header += "}";
  std::ofstream out(path, std::ios::binary);
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  out << header << std::string(offset, '\0');
}

void write_model(const fs::path& dir) {
  write_text(dir / "config.json", config_json());
  write_safetensors(dir / "model.safetensors");
  write_text(dir / "tokenizer.json", tokenizer_json());
  write_text(dir / "tokenizer_config.json", R"({"eos_token":"<|end|>"})");
  write_text(dir / "chat_template.jinja", "{{ messages[0].content }}");
}

// Runs `load` in a child and returns "" when it threw a load_error whose message holds every one of
// `expect`, else what happened instead.
std::string expect_refusal(const std::function<void()>& load, const std::vector<std::string>& expect) {
  const test::child_result r = test::run_in_child(
      [&]() -> std::string {
        try {
          load();
        } catch (const load_error& e) {
          const std::string msg = e.what();
          for (const auto& part : expect) {
            if (msg.find(part) == std::string::npos) return "message lacks '" + part + "': " + msg;
          }
          return "";
        }
        return "loaded without an error";
      },
      k_deadline);
  return r.ok ? "" : r.message;
}

// ---- non-regular files ------------------------------------------------------------------------------

enum class kind { fifo, dev_zero, directory };

const char* kind_name(kind k) { return k == kind::fifo ? "FIFO" : k == kind::dev_zero ? "/dev/zero" : "directory"; }
const char* kind_reason(kind k) {
  return k == kind::fifo ? "(a FIFO)" : k == kind::dev_zero ? "(a character device)" : "(a directory)";
}

// Replaces `path` by a FIFO nobody writes to, a symlink to /dev/zero, or a directory.
void make_special(const fs::path& path, kind k) {
  fs::remove_all(path);
  switch (k) {
    case kind::fifo: ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0) << path; break;
    case kind::dev_zero: fs::create_symlink("/dev/zero", path); break;
    case kind::directory: fs::create_directory(path); break;
  }
}

constexpr kind k_kinds[] = {kind::fifo, kind::dev_zero, kind::directory};

TEST(loader_limits, the_tiny_checkpoint_loads) {
  // The control for the cases below: each replaces one file of this valid checkpoint.
  temp_dir d("valid");
  write_model(d.path);
  const loaded_model m = load_model(d.path);
  EXPECT_EQ(m.tok->vocab_size(), static_cast<size_t>(k_vocab));
  EXPECT_EQ(m.tok->eos(), 3);
  EXPECT_EQ(m.chat_template, "{{ messages[0].content }}");
}

TEST(loader_limits, gguf_and_safetensors_refuse_non_regular_files) {
  if (!fs::exists("/dev/zero")) GTEST_SKIP() << "no /dev/zero";
  for (const kind k : k_kinds) {
    SCOPED_TRACE(kind_name(k));
    temp_dir d("files");
    const fs::path p = d.path / "model.gguf";
    make_special(p, k);
    EXPECT_EQ(expect_refusal([&] { gguf_file::open(p); }, {p.string(), "not a regular file", kind_reason(k)}), "");
    // Through the loader's entry point too (a path that is not a directory is taken for a GGUF file).
    if (k != kind::directory) {
      EXPECT_EQ(expect_refusal([&] { load_model(p); }, {p.string(), "not a regular file"}), "");
    }
    EXPECT_EQ(expect_refusal([&] { safetensors_file::open(p); },
                             {p.string(), "safetensors: not a regular file", kind_reason(k)}),
              "");
  }
  // The device itself, not through a symlink.
  EXPECT_EQ(expect_refusal([] { gguf_file::open("/dev/zero"); }, {"/dev/zero", "(a character device)"}), "");
}

TEST(loader_limits, every_file_of_a_hf_directory_refuses_non_regular_files) {
  if (!fs::exists("/dev/zero")) GTEST_SKIP() << "no /dev/zero";
  // Each file the HF loader opens, replaced in turn: load_model must name it, whichever kind it is.
  const std::vector<std::string> files = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                                          "chat_template.jinja"};
  for (const auto& name : files) {
    for (const kind k : k_kinds) {
      SCOPED_TRACE(name + " as " + kind_name(k));
      temp_dir d("hf");
      write_model(d.path);
      const fs::path p = d.path / name;
      make_special(p, k);
      EXPECT_EQ(expect_refusal([&] { load_model(d.path); }, {p.string(), "not a regular file", kind_reason(k)}), "");
    }
  }
  // The shard index and the shards it names.
  for (const kind k : k_kinds) {
    SCOPED_TRACE(std::string("index / shard as ") + kind_name(k));
    temp_dir d("hf_index");
    write_model(d.path);
    const fs::path index = d.path / "model.safetensors.index.json";
    make_special(index, k);
    EXPECT_EQ(expect_refusal([&] { load_model(d.path); }, {index.string(), "not a regular file"}), "");
    fs::remove_all(index);
    write_text(index, R"({"weight_map":{"model.norm.weight":"shard-1.safetensors"}})");
    const fs::path shard = d.path / "shard-1.safetensors";
    make_special(shard, k);
    EXPECT_EQ(expect_refusal([&] { load_model(d.path); }, {shard.string(), "not a regular file"}), "");
  }
  // The entry points the dummy loader and the tokenizer use on their own.
  temp_dir d("hf_parts");
  write_model(d.path);
  make_special(d.path / "tokenizer_config.json", kind::fifo);
  EXPECT_EQ(expect_refusal([&] { read_hf_chat_template(d.path); }, {"tokenizer_config.json", "(a FIFO)"}), "");
  EXPECT_EQ(expect_refusal([&] { read_hf_vocab(d.path, k_vocab); }, {"tokenizer_config.json", "(a FIFO)"}), "");
  make_special(d.path / "tokenizer.json", kind::fifo);
  EXPECT_EQ(expect_refusal([&] { load_model(d.path, load_format::dummy); }, {"tokenizer.json", "(a FIFO)"}), "");
  make_special(d.path / "config.json", kind::fifo);
  EXPECT_EQ(expect_refusal([&] { read_hf_config(d.path); }, {"config.json", "(a FIFO)"}), "");
}

// ---- sizes and token ids, bounded before anything is allocated ------------------------------------

// Runs `load` in a child and reports its peak memory growth in KiB, or -1 when it did not return or
// throw a load_error in time (the message goes to *what).
int64_t peak_growth_kib(const std::function<void()>& load, std::string* what) {
  const test::child_result r = test::run_in_child(
      [&]() -> std::string {
        const bool reset = test::reset_peak_rss();
        const int64_t before = test::peak_rss_kib();
        std::string msg = "loaded";
        try {
          load();
        } catch (const load_error& e) { msg = e.what(); }
        const int64_t after = test::peak_rss_kib();
        if (before < 0 || after < 0) return "no VmHWM in /proc/self/status";
        // The growth travels in the message (which makes the child "fail"; the caller judges it).
        return "growth " + std::to_string(after - before) + (reset ? "" : " (peak not reset)") + "\n" + msg;
      },
      k_deadline);
  *what = r.message;
  if (r.ok || r.message.rfind("growth ", 0) != 0) return -1;
  return std::stoll(r.message.substr(7));
}

TEST(loader_limits, json_files_beyond_1_gib_are_refused_before_reading) {
  // A sparse file: 1 GiB + 1 byte long, no disk or memory behind it. Refused from its size alone.
  temp_dir d("huge_json");
  write_model(d.path);
  for (const std::string name : {"config.json", "chat_template.jinja"}) {
    SCOPED_TRACE(name);
    const fs::path p = d.path / name;
    fs::resize_file(p, (uint64_t{1} << 30) + 1);
    std::string what;
    const int64_t growth = peak_growth_kib(
        [&] { name == "config.json" ? (void)read_hf_config(d.path) : (void)read_hf_chat_template(d.path); }, &what);
    ASSERT_GE(growth, 0) << what;
    EXPECT_LT(growth, 64 * 1024) << what;
    EXPECT_NE(what.find(p.string() + ": larger than 1073741824 bytes"), std::string::npos) << what;
    write_model(d.path);
  }
}

TEST(loader_limits, an_added_token_id_beyond_the_vocabulary_is_refused_before_allocating) {
  temp_dir d("huge_id");
  write_model(d.path);
  write_text(d.path / "tokenizer.json", tokenizer_json((1 << 24) - 1));
  std::string what;
  // Without the bound this allocated 16M slots and placeholder tokens (about 3 GB) before refusing.
  // 64 MiB leaves room for the allocator and the sanitizers' bookkeeping; it is not a timing check.
  const int64_t growth = peak_growth_kib([&] { read_hf_vocab(d.path, k_vocab); }, &what);
  ASSERT_GE(growth, 0) << what;
  EXPECT_LT(growth, 64 * 1024) << what;
  EXPECT_NE(what.find("added token '<|end|>' has id 16777215"), std::string::npos) << what;
  EXPECT_NE(what.find("ids must be below 4"), std::string::npos) << what;
  EXPECT_NE(what.find("vocab_size, 4"), std::string::npos) << what;
  EXPECT_NE(what.find("tokenizer.json"), std::string::npos) << what;
  // The loader passes config.json's vocab_size: the same refusal end to end.
  EXPECT_EQ(expect_refusal([&] { load_model(d.path); }, {"tokenizer.json", "has id 16777215"}), "");
  // A model.vocab id is bounded the same way.
  write_text(d.path / "tokenizer.json", tokenizer_json(3, (1 << 24) - 1));
  EXPECT_EQ(expect_refusal([&] { read_hf_vocab(d.path, k_vocab); }, {"vocab entry 'b' has id 16777215"}), "");
  // And a declared vocabulary beyond the format's limit is refused rather than padded to.
  write_text(d.path / "tokenizer.json", tokenizer_json());
  EXPECT_EQ(expect_refusal([&] { read_hf_vocab(d.path, (1 << 24) + 1); }, {"exceeds the limit of 2^24"}), "");
}

TEST(loader_limits, token_ids_up_to_the_declared_vocabulary_still_load) {
  temp_dir d("declared");
  write_model(d.path);
  // An added token at the last id of a declared vocabulary of 300: ids 3..298 become placeholders.
  write_text(d.path / "tokenizer.json", tokenizer_json(299));
  const vocab_data v = read_hf_vocab(d.path, 300);
  ASSERT_EQ(v.tokens.size(), 300u);
  EXPECT_EQ(v.tokens[299], "<|end|>");
  EXPECT_EQ(v.types[200], token_type::unused);
  EXPECT_THROW(read_hf_vocab(d.path, 299), load_error);  // one past the declared size
  // Without a declared size the file's own token count (here 4) bounds the ids: 3 loads, 4 does not.
  write_text(d.path / "tokenizer.json", tokenizer_json(3));
  EXPECT_EQ(read_hf_vocab(d.path).tokens.size(), 4u);
  write_text(d.path / "tokenizer.json", tokenizer_json(4));
  try {
    read_hf_vocab(d.path);
    ADD_FAILURE() << "id 4 of a 4-token file without a declared size was accepted";
  } catch (const load_error& e) {
    EXPECT_NE(std::string(e.what()).find("vocab_size, not given"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera
