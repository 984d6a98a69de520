// The JSON files of a Hugging Face directory (config.json, tokenizer.json, tokenizer_config.json,
// model.safetensors.index.json), read with simdjson and with the bounds and error messages both the
// model loader (engine/model/hf_model.cpp) and the tokenizer loader (engine/text/hf_tokenizer.cpp) use.
#pragma once
#include <simdjson.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/base/error.hpp"

namespace tessera::hf_json {

namespace sj = simdjson;

// Larger files are refused before parsing (tokenizer.json files are tens of MB).
inline constexpr uintmax_t k_max_json_bytes = 1ull << 30;

// A parsed JSON file; elements point into the parser, so it travels with them.
struct json_file {
  std::string name;
  sj::dom::parser parser;
  sj::dom::element root;

  [[noreturn]] void fail(const std::string& what) const { throw load_error(name + ": " + what); }

  sj::dom::object object() const {
    sj::dom::object o;
    if (root.get_object().get(o)) fail("not a JSON object");
    return o;
  }
};

// Parses `path` (at most k_max_json_bytes; integers beyond 64 bits are read as doubles).
std::unique_ptr<json_file> load_json(const std::filesystem::path& path);

// Looks up `key`; nullopt when absent or null (HF writes `"head_dim": null` and the like).
std::optional<sj::dom::element> field(sj::dom::object o, std::string_view key);
// The typed lookups fail (json_file::fail) when the key holds another type.
std::optional<std::string> string_field(const json_file& f, sj::dom::object o, std::string_view key);
std::optional<bool> bool_field(const json_file& f, sj::dom::object o, std::string_view key);
std::optional<int64_t> int_value(sj::dom::element e);  // integers, and doubles with an integer value
std::optional<int64_t> int_field(const json_file& f, sj::dom::object o, std::string_view key);
int32_t positive_int32(const json_file& f, std::string_view key, int64_t v);
int32_t required_int32(const json_file& f, sj::dom::object o, std::string_view key);
std::optional<double> float_field(const json_file& f, sj::dom::object o, std::string_view key);
// `bos_token_id` and friends: an integer or (eos in newer configs) a list whose first entry we use.
std::optional<int64_t> first_int_field(const json_file& f, sj::dom::object o, std::string_view key);
// Appends a non-fatal note when the caller collects them.
void note(std::vector<std::string>* warnings, std::string text);

}  // namespace tessera::hf_json
