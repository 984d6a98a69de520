// tokenizer.json / tokenizer_config.json / chat_template.jinja of a Hugging Face directory -> vocab_data
// and the chat template source. The tokenizer.json layout is the `tokenizers` library's serialization
// (model, added_tokens, pre_tokenizer, post_processor).
#include "engine/text/hf_tokenizer.hpp"

#include <simdjson.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <map>
#include <set>
#include <unordered_map>

#include "engine/base/error.hpp"
#include "engine/base/regular_file.hpp"
#include "engine/model/hf_json.hpp"

namespace tessera {

namespace fs = std::filesystem;
namespace sj = simdjson;
using namespace hf_json;  // NOLINT: this file reads JSON and nothing else

namespace {

constexpr int64_t k_max_vocab = 1 << 24;

}  // namespace

namespace {

// The split expressions that transformers/tokenizers write for the pre-tokenizers we implement
// (the same ones llama.cpp's convert_hf_to_gguf.py recognises).
constexpr std::string_view k_llama3_regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr std::string_view k_qwen2_regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

struct pre_tokenizer_step {
  std::string type;
  bool individual_digits = false;  // Digits
  bool use_regex = true;           // ByteLevel
  bool add_prefix_space = false;   // ByteLevel
  std::string regex;               // Split: pattern.Regex
};

void collect_steps(const json_file& f, sj::dom::element e, std::vector<pre_tokenizer_step>& out) {
  sj::dom::object o;
  if (e.get_object().get(o)) f.fail("'pre_tokenizer' is not an object");
  pre_tokenizer_step s;
  s.type = string_field(f, o, "type").value_or("");
  if (s.type == "Sequence") {
    const auto list = field(o, "pretokenizers");
    if (!list || !list->is_array()) f.fail("Sequence pre_tokenizer without 'pretokenizers'");
    for (auto child : list->get_array()) collect_steps(f, child, out);
    return;
  }
  s.individual_digits = bool_field(f, o, "individual_digits").value_or(false);
  s.use_regex = bool_field(f, o, "use_regex").value_or(true);
  s.add_prefix_space = bool_field(f, o, "add_prefix_space").value_or(false);
  if (const auto pattern = field(o, "pattern"); pattern && pattern->is_object()) {
    s.regex = string_field(f, pattern->get_object(), "Regex").value_or("");
  }
  out.push_back(std::move(s));
}

// Which of tokenizer.hpp's pre-tokenizers the tokenizer.json describes; "" when none.
std::string detect_pre(const std::vector<pre_tokenizer_step>& steps) {
  auto is_byte_level = [](const pre_tokenizer_step& s, bool regex) {
    return s.type == "ByteLevel" && s.use_regex == regex;
  };
  if (steps.size() == 1 && is_byte_level(steps[0], true)) return "gpt2";
  if (steps.size() == 2 && steps[0].type == "Digits" && steps[0].individual_digits && is_byte_level(steps[1], true)) {
    return "smollm";
  }
  if (steps.size() == 2 && steps[0].type == "Split" && is_byte_level(steps[1], false)) {
    if (steps[0].regex == k_llama3_regex) return "llama3";
    if (steps[0].regex == k_qwen2_regex) return "qwen2";
  }
  return "";
}

// How a SentencePiece-style tokenizer.json turns text into U+2581-separated pieces; only the forms
// transformers writes for SentencePiece models are accepted (anything else would tokenize differently):
//   * LLaMA / Mistral / Phi-3: pre_tokenizer Metaspace(replacement U+2581, prepend_scheme "first" or
//     "always"), or (older files) normalizer Sequence[Prepend(U+2581), Replace(" ", U+2581)];
//   * Gemma: normalizer Replace(" ", U+2581) and no prefix (pre_tokenizer none, or a Split on " ").
void read_spm_text_rules(const json_file& f, sj::dom::object root, vocab_data& v) {
  constexpr std::string_view k_space = "\xe2\x96\x81";  // U+2581
  bool prefix = false, replaces_spaces = false;
  std::vector<sj::dom::object> norms;
  if (const auto n = field(root, "normalizer")) {
    sj::dom::object o;
    if (n->get_object().get(o)) f.fail("'normalizer' is not an object");
    if (string_field(f, o, "type") == "Sequence") {
      if (const auto list = field(o, "normalizers"); list && list->is_array()) {
        for (auto e : list->get_array()) {
          if (e.is_object()) norms.push_back(e.get_object());
        }
      }
    } else {
      norms.push_back(o);
    }
  }
  for (const sj::dom::object& o : norms) {
    const std::string t = string_field(f, o, "type").value_or("");
    if (t == "Prepend" && string_field(f, o, "prepend") == std::string(k_space)) {
      prefix = true;
    } else if (t == "Replace") {
      const auto pattern = field(o, "pattern");
      const auto from =
          pattern && pattern->is_object() ? string_field(f, pattern->get_object(), "String") : std::nullopt;
      if (from != " " || string_field(f, o, "content") != std::string(k_space)) {
        f.fail("SentencePiece-style normalizer Replace other than ' ' -> U+2581 is not supported");
      }
      replaces_spaces = true;
    } else if (t != "NFC") {
      f.fail("SentencePiece-style normalizer '" + t + "' is not supported");
    }
  }
  if (const auto pre = field(root, "pre_tokenizer")) {
    sj::dom::object o;
    if (pre->get_object().get(o)) f.fail("'pre_tokenizer' is not an object");
    const std::string t = string_field(f, o, "type").value_or("");
    if (t == "Metaspace") {
      if (string_field(f, o, "replacement").value_or(std::string(k_space)) != k_space) {
        f.fail("Metaspace replacement other than U+2581 is not supported");
      }
      const std::string scheme =
          string_field(f, o, "prepend_scheme")
              .value_or(bool_field(f, o, "add_prefix_space").value_or(true) ? "always" : "never");
      if (scheme != "first" && scheme != "always" && scheme != "never") {
        f.fail("Metaspace prepend_scheme '" + scheme + "' is not supported");
      }
      prefix = prefix || scheme != "never";
      replaces_spaces = true;
    } else if (t == "Split") {
      // Gemma's Split on " " (after the normalizer replaced every space): splits nothing.
      const auto pattern = field(o, "pattern");
      if (!replaces_spaces || !pattern || !pattern->is_object() ||
          string_field(f, pattern->get_object(), "String") != " ") {
        f.fail("SentencePiece-style pre_tokenizer Split is only supported on ' ' after a ' ' -> U+2581 normalizer");
      }
    } else {
      f.fail("SentencePiece-style pre_tokenizer '" + t + "' is not supported (Metaspace)");
    }
  }
  if (!replaces_spaces) f.fail("SentencePiece-style tokenizer without a ' ' -> U+2581 rule is not supported");
  v.add_space_prefix = prefix;
  v.pre = "default";
}

// tokenizer_config.json's bos_token etc.: a string, or an AddedToken object {"content": ...}.
std::optional<std::string> special_text(const json_file& f, sj::dom::object o, std::string_view key) {
  const auto e = field(o, key);
  if (!e) return std::nullopt;
  if (e->is_string()) return std::string(std::string_view(e->get_string()));
  if (e->is_object()) return string_field(f, e->get_object(), "content");
  f.fail("'" + std::string(key) + "' is neither a string nor an object");
}

}  // namespace

vocab_data read_hf_vocab(const fs::path& dir, int32_t min_vocab_size, std::vector<std::string>* warnings) {
  const auto f = load_json(dir / "tokenizer.json");
  if (min_vocab_size > k_max_vocab) {
    f->fail("the model's vocab_size " + std::to_string(min_vocab_size) + " exceeds the limit of 2^24");
  }
  const sj::dom::object root = f->object();
  const auto model_e = field(root, "model");
  if (!model_e || !model_e->is_object()) f->fail("'model' is missing");
  const sj::dom::object model = model_e->get_object();
  const std::string type = string_field(*f, model, "type").value_or("BPE");
  if (type != "BPE") f->fail("tokenizer model '" + type + "' is not supported (BPE only)");
  // byte_fallback: a SentencePiece BPE model in tokenizers' clothes (LLaMA 1/2, Mistral v0.x, Phi-3, Gemma;
  // transformers' SpmConverter): spaces are U+2581, unknown characters fall back to <0xXX> tokens.
  const bool spm = bool_field(*f, model, "byte_fallback").value_or(false);
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (const auto s = string_field(*f, model, key); s && !s->empty()) {
      f->fail(std::string(key) + " '" + *s + "' is not supported");
    }
  }

  vocab_data v;
  v.kind = spm ? vocab_kind::spm : vocab_kind::bpe;
  // ---- tokens: model.vocab (text -> id), then added_tokens (which may extend it) ----
  const auto vocab_e = field(model, "vocab");
  sj::dom::object vocab;
  if (!vocab_e || vocab_e->get_object().get(vocab)) f->fail("'model.vocab' is missing or not an object");
  const auto added = field(root, "added_tokens");
  if (added && !added->is_array()) f->fail("'added_tokens' is not a list");
  // Ids index the vectors below, which grow to the largest id: one id of 2^24 - 1 in a 50-token
  // file would cost 16M slots and placeholder tokens (3 GB, 20 s) before anything refused it. So
  // ids are bounded, before anything is allocated, by the vocabulary the model declares (config.json
  // vocab_size, passed as min_vocab_size) or, when larger, the number of tokens this file defines:
  // a dense vocabulary never needs an id beyond either.
  size_t num_entries = 0;
  for ([[maybe_unused]] auto e : vocab) ++num_entries;
  if (added) {
    for ([[maybe_unused]] auto a : added->get_array()) ++num_entries;
  }
  const int64_t id_limit =
      std::min<int64_t>(k_max_vocab, std::max<int64_t>(min_vocab_size, static_cast<int64_t>(num_entries)));
  std::vector<std::optional<std::string>> slots;
  std::vector<token_type> types;
  auto place = [&](int64_t id, std::string text, token_type t, bool may_replace) {
    if (id < 0 || id >= id_limit) {
      f->fail((t == token_type::normal ? "vocab entry '" : "added token '") + text.substr(0, 64) + "' has id " +
              std::to_string(id) + ", outside the vocabulary: ids must be below " + std::to_string(id_limit) +
              " (the larger of the model's vocab_size, " +
              (min_vocab_size > 0 ? std::to_string(min_vocab_size) : std::string("not given")) + ", and the " +
              std::to_string(num_entries) + " tokens this file defines)");
    }
    const auto i = static_cast<size_t>(id);
    if (i >= slots.size()) {
      slots.resize(i + 1);
      types.resize(i + 1, token_type::normal);
    }
    if (slots[i] && !(may_replace && *slots[i] == text)) {
      f->fail("token id " + std::to_string(id) + " is used by both '" + *slots[i] + "' and '" + text + "'");
    }
    slots[i] = std::move(text);
    types[i] = t;
  };
  for (auto e : vocab) {
    const auto id = int_value(e.value);
    if (!id) f->fail("vocab entry '" + std::string(e.key) + "' has a non-integer id");
    place(*id, std::string(e.key), token_type::normal, false);
  }
  if (added) {
    for (auto a : added->get_array()) {
      sj::dom::object o;
      if (a.get_object().get(o)) f->fail("an added_tokens entry is not an object");
      const auto id = int_field(*f, o, "id");
      const auto content = string_field(*f, o, "content");
      if (!id || !content) f->fail("an added_tokens entry lacks 'id' or 'content'");
      // special: never produced from plain text (control); otherwise matched in text like llama.cpp's
      // user-defined tokens. Their content is raw text, not GPT-2 byte alphabet.
      const bool special = bool_field(*f, o, "special").value_or(false);
      place(*id, *content, special ? token_type::control : token_type::user_defined, true);
    }
  }
  size_t holes = 0;  // ids inside the tokenizer's own range without a token
  const size_t num_defined = slots.size();
  const size_t wanted = std::max(slots.size(), static_cast<size_t>(std::max<int32_t>(min_vocab_size, 0)));
  slots.resize(wanted);
  types.resize(wanted, token_type::normal);
  v.tokens.reserve(wanted);
  for (size_t i = 0; i < wanted; ++i) {
    if (slots[i]) {
      v.tokens.push_back(std::move(*slots[i]));
    } else {
      // Ids without a token (gaps, or embedding rows beyond the tokenizer): placeholders that plain
      // text can never produce.
      v.tokens.push_back("<|tessera_unused_" + std::to_string(i) + "|>");
      types[i] = token_type::unused;
      holes += i < num_defined;
    }
  }
  v.types = std::move(types);
  if (holes > 0) {
    note(warnings, f->name + ": " + std::to_string(holes) + " token id(s) without a token; filled with placeholders");
  }

  // ---- merges: "left right" strings (tokenizers < 0.20) or [left, right] pairs ----
  if (spm) {
    // <0xXX> are the byte-fallback tokens (SentencePiece's byte pieces).
    for (size_t i = 0; i < v.tokens.size(); ++i) {
      const std::string& t = v.tokens[i];
      if (v.types[i] == token_type::normal && t.size() == 6 && t.starts_with("<0x") && t.ends_with(">") &&
          std::isxdigit(static_cast<unsigned char>(t[3])) && std::isxdigit(static_cast<unsigned char>(t[4]))) {
        v.types[i] = token_type::byte;
      }
    }
  }
  const auto merges_e = field(model, "merges");
  if (!merges_e || !merges_e->is_array()) f->fail("'model.merges' is missing or not a list");
  for (auto m : merges_e->get_array()) {
    if (m.is_string()) {
      v.merges.emplace_back(std::string_view(m.get_string()));
      continue;
    }
    std::vector<std::string_view> parts;
    if (m.is_array()) {
      for (auto p : m.get_array()) {
        std::string_view s;
        if (p.get_string().get(s)) f->fail("a merge pair holds a non-string");
        parts.push_back(s);
      }
    }
    if (parts.size() != 2) f->fail("a merge is neither \"a b\" nor [a, b]");
    if (parts[0].find(' ') != std::string_view::npos || parts[1].find(' ') != std::string_view::npos) {
      f->fail("merge [" + std::string(parts[0]) + ", " + std::string(parts[1]) + "] contains a space");
    }
    v.merges.push_back(std::string(parts[0]) + " " + std::string(parts[1]));
  }
  if (spm) {
    // SentencePiece merges by the score of the merged piece, highest first; transformers' SpmConverter
    // lists a merge for every pair of pieces whose concatenation is a piece, ordered by that score. So
    // score = -rank of the merge that makes a token reproduces the order (tokens no merge makes sit
    // below every merge: a pair can only produce a token through a merge).
    std::unordered_map<std::string_view, size_t> index;
    for (size_t i = 0; i < v.tokens.size(); ++i) index.emplace(v.tokens[i], i);
    v.scores.assign(v.tokens.size(), 0.0f);
    for (size_t i = 0; i < v.tokens.size(); ++i) v.scores[i] = -static_cast<float>(v.merges.size() + i);
    std::vector<bool> scored(v.tokens.size(), false);
    for (size_t rank = 0; rank < v.merges.size(); ++rank) {
      const std::string& m = v.merges[rank];
      const size_t space = m.find(' ');
      const std::string merged = m.substr(0, space) + m.substr(space + 1);
      const auto it = index.find(merged);
      if (it == index.end()) f->fail("merge '" + m + "' makes '" + merged + "', which is not in the vocabulary");
      if (!scored[it->second]) {
        v.scores[it->second] = -static_cast<float>(rank);
        scored[it->second] = true;
      }
    }
    v.merges.clear();
  }

  // ---- pre-tokenizer ----
  std::vector<pre_tokenizer_step> steps;
  if (const auto pre = field(root, "pre_tokenizer")) collect_steps(*f, *pre, steps);
  if (spm) {
    read_spm_text_rules(*f, root, v);
  } else if (std::none_of(steps.begin(), steps.end(), [](const auto& s) { return s.type == "ByteLevel"; })) {
    f->fail("pre_tokenizer is not byte-level (no ByteLevel step); only byte-level BPE is supported");
  }
  if (!spm) v.pre = detect_pre(steps);
  if (!spm && v.pre.empty()) {
    v.pre = "gpt2";
    note(warnings, f->name +
                       ": pre_tokenizer not recognised (not GPT-2, SmolLM digits, LLaMA-3 or Qwen2); "
                       "falling back to the GPT-2 split, so some texts may tokenize differently");
  }
  if (!spm && std::any_of(steps.begin(), steps.end(), [](const auto& s) { return s.add_prefix_space; })) {
    note(warnings, f->name + ": ByteLevel add_prefix_space is ignored");
  }
  if (const auto norm = field(root, "normalizer"); norm && !spm) {
    const auto t = norm->is_object() ? string_field(*f, norm->get_object(), "type") : std::nullopt;
    if (t != "NFC") note(warnings, f->name + ": normalizer '" + t.value_or("?") + "' is ignored");
  }
  if (!spm) v.add_space_prefix = false;

  // ---- special tokens ----
  std::unordered_map<std::string_view, token_id> ids;
  for (size_t i = 0; i < v.tokens.size(); ++i) ids.emplace(v.tokens[i], static_cast<token_id>(i));
  auto id_of = [&](const std::string& text) -> std::optional<token_id> {
    const auto it = ids.find(text);
    if (it == ids.end()) {
      note(warnings, f->name + ": special token '" + text + "' is not in the vocabulary");
      return std::nullopt;
    }
    return it->second;
  };
  // post_processor TemplateProcessing: special tokens around the single sequence $A mean add_bos/eos.
  std::optional<token_id> template_bos, template_eos;
  if (const auto pp = field(root, "post_processor"); pp && pp->is_object()) {
    std::vector<sj::dom::object> processors;
    const sj::dom::object ppo = pp->get_object();
    if (string_field(*f, ppo, "type") == "Sequence") {
      if (const auto list = field(ppo, "processors"); list && list->is_array()) {
        for (auto p : list->get_array()) {
          if (p.is_object()) processors.push_back(p.get_object());
        }
      }
    } else {
      processors.push_back(ppo);
    }
    for (const auto& p : processors) {
      if (string_field(*f, p, "type") != "TemplateProcessing") continue;
      const auto single = field(p, "single");
      if (!single || !single->is_array()) continue;
      std::vector<std::optional<std::string>> items;  // nullopt: the sequence itself
      for (auto item : single->get_array()) {
        sj::dom::element special;
        if (item.is_object() && !item.get_object().at_key("SpecialToken").get(special) && special.is_object()) {
          items.push_back(string_field(*f, special.get_object(), "id"));
        } else {
          items.push_back(std::nullopt);
        }
      }
      if (!items.empty() && items.front()) template_bos = id_of(*items.front());
      if (items.size() > 1 && items.back()) template_eos = id_of(*items.back());
    }
  }
  std::unique_ptr<json_file> tc;
  if (std::error_code ec; fs::exists(dir / "tokenizer_config.json", ec)) tc = load_json(dir / "tokenizer_config.json");
  std::unique_ptr<json_file> cfg;
  if (std::error_code ec; fs::exists(dir / "config.json", ec)) cfg = load_json(dir / "config.json");
  auto special = [&](std::string_view tc_key, std::string_view cfg_key) -> std::optional<token_id> {
    if (tc) {
      if (const auto text = special_text(*tc, tc->object(), tc_key)) return id_of(*text);
    }
    if (cfg) {
      if (const auto id = first_int_field(*cfg, cfg->object(), cfg_key)) {
        if (*id < 0 || *id >= static_cast<int64_t>(v.tokens.size())) {
          cfg->fail(std::string(cfg_key) + " " + std::to_string(*id) + " is outside the vocabulary");
        }
        return static_cast<token_id>(*id);
      }
    }
    return std::nullopt;
  };
  v.bos = special("bos_token", "bos_token_id");
  v.eos = special("eos_token", "eos_token_id");
  v.pad = special("pad_token", "pad_token_id");
  v.unk = special("unk_token", "unk_token_id");
  if (!v.unk) {
    if (const auto unk = string_field(*f, model, "unk_token")) v.unk = id_of(*unk);
  }
  // SentencePiece's <unk> is its own kind (llama.cpp: LLAMA_TOKEN_ATTR_UNKNOWN), not a control token.
  if (spm && v.unk) v.types[static_cast<size_t>(*v.unk)] = token_type::unknown;
  if (!v.bos) v.bos = template_bos;
  if (!v.eos) v.eos = template_eos;
  std::optional<bool> add_bos = tc ? bool_field(*tc, tc->object(), "add_bos_token") : std::nullopt;
  std::optional<bool> add_eos = tc ? bool_field(*tc, tc->object(), "add_eos_token") : std::nullopt;
  v.add_bos = add_bos.value_or(template_bos.has_value());
  v.add_eos = add_eos.value_or(template_eos.has_value());
  if (*v.add_bos && !v.bos) v.add_bos = false;
  if (*v.add_eos && !v.eos) v.add_eos = false;
  return v;
}

std::optional<std::string> read_hf_chat_template(const fs::path& dir) {
  std::error_code ec;
  if (fs::exists(dir / "tokenizer_config.json", ec)) {
    const auto tc = load_json(dir / "tokenizer_config.json");
    if (const auto e = field(tc->object(), "chat_template")) {
      if (e->is_string()) return std::string(std::string_view(e->get_string()));
      if (e->is_array()) {  // [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        for (auto entry : e->get_array()) {
          if (!entry.is_object()) continue;
          if (string_field(*tc, entry.get_object(), "name") == "default") {
            return string_field(*tc, entry.get_object(), "template");
          }
        }
      }
      tc->fail("'chat_template' is neither a string nor a list with a \"default\" entry");
    }
  }
  const fs::path jinja = dir / "chat_template.jinja";  // transformers >= 4.43 may write it separately
  // Present as anything but a regular file (a FIFO, a device, a directory): refused by
  // read_regular_file with the path, instead of blocking on it or silently going without a template.
  if (fs::exists(jinja, ec)) return read_regular_file(jinja, k_max_json_bytes);
  return std::nullopt;
}

}  // namespace tessera
