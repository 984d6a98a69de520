#include "engine/model/hf_json.hpp"

#include <cmath>
#include <limits>

#include "engine/base/regular_file.hpp"

namespace tessera::hf_json {

namespace fs = std::filesystem;

namespace {

// simdjson 3.0 refuses integers beyond 64 bits, which transformers writes (tokenizer_config.json's
// "model_max_length": 1000000000000000019884624838656). Such integers become decimals ("...656.0"),
// which parse as doubles; everything inside strings is left alone.
std::string widen_big_integers(std::string_view json) {
  std::string out;
  out.reserve(json.size());
  bool in_string = false;
  for (size_t i = 0; i < json.size();) {
    const char c = json[i];
    if (in_string) {
      out.push_back(c);
      if (c == '\\' && i + 1 < json.size()) {
        out.push_back(json[i + 1]);
        i += 2;
        continue;
      }
      in_string = c != '"';
      ++i;
      continue;
    }
    if (c == '"') in_string = true;
    if (c != '-' && (c < '0' || c > '9')) {
      out.push_back(c);
      ++i;
      continue;
    }
    size_t end = i;
    size_t digits = 0;
    bool integer = true;
    while (end < json.size()) {
      const char d = json[end];
      if (d >= '0' && d <= '9') {
        ++digits;
      } else if (d == '.' || d == 'e' || d == 'E') {
        integer = false;
      } else if (d != '-' && d != '+') {
        break;
      }
      ++end;
    }
    out.append(json.substr(i, end - i));
    if (integer && digits > 19) out.append(".0");
    i = end;
  }
  return out;
}

}  // namespace

std::unique_ptr<json_file> load_json(const fs::path& path) {
  auto f = std::make_unique<json_file>();
  f->name = path.string();
  // A FIFO, a device or a directory is refused here without blocking; the size is bounded before
  // anything is allocated. The errors name the path.
  const std::string raw = read_regular_file(path, k_max_json_bytes);
  const sj::padded_string text(widen_big_integers(raw));
  if (const auto err = f->parser.parse(text).get(f->root); err) {
    f->fail(std::string("invalid JSON: ") + sj::error_message(err));
  }
  return f;
}

std::optional<sj::dom::element> field(sj::dom::object o, std::string_view key) {
  sj::dom::element e;
  if (o.at_key(key).get(e) || e.is_null()) return std::nullopt;
  return e;
}

std::optional<std::string> string_field(const json_file& f, sj::dom::object o, std::string_view key) {
  const auto e = field(o, key);
  if (!e) return std::nullopt;
  std::string_view s;
  if (e->get_string().get(s)) f.fail("'" + std::string(key) + "' is not a string");
  return std::string(s);
}

std::optional<bool> bool_field(const json_file& f, sj::dom::object o, std::string_view key) {
  const auto e = field(o, key);
  if (!e) return std::nullopt;
  bool b = false;
  if (e->get_bool().get(b)) f.fail("'" + std::string(key) + "' is not a boolean");
  return b;
}

std::optional<int64_t> int_value(sj::dom::element e) {
  int64_t v = 0;
  if (!e.get_int64().get(v)) return v;
  double d = 0;  // some writers emit 8192.0
  if (!e.get_double().get(d) && std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) {
    return static_cast<int64_t>(d);
  }
  return std::nullopt;
}

std::optional<int64_t> int_field(const json_file& f, sj::dom::object o, std::string_view key) {
  const auto e = field(o, key);
  if (!e) return std::nullopt;
  const auto v = int_value(*e);
  if (!v) f.fail("'" + std::string(key) + "' is not an integer");
  return v;
}

int32_t positive_int32(const json_file& f, std::string_view key, int64_t v) {
  if (v <= 0 || v > std::numeric_limits<int32_t>::max()) {
    f.fail("'" + std::string(key) + "' = " + std::to_string(v) + " is out of range (1..2^31-1)");
  }
  return static_cast<int32_t>(v);
}

int32_t required_int32(const json_file& f, sj::dom::object o, std::string_view key) {
  const auto v = int_field(f, o, key);
  if (!v) f.fail("required key '" + std::string(key) + "' is missing");
  return positive_int32(f, key, *v);
}

std::optional<double> float_field(const json_file& f, sj::dom::object o, std::string_view key) {
  const auto e = field(o, key);
  if (!e) return std::nullopt;
  double d = 0;
  if (e->get_double().get(d)) {
    const auto i = int_value(*e);
    if (!i) f.fail("'" + std::string(key) + "' is not a number");
    d = static_cast<double>(*i);
  }
  if (!std::isfinite(d) || std::fabs(d) > std::numeric_limits<float>::max()) {
    f.fail("'" + std::string(key) + "' is not a finite float");
  }
  return d;
}

std::optional<int64_t> first_int_field(const json_file& f, sj::dom::object o, std::string_view key) {
  const auto e = field(o, key);
  if (!e) return std::nullopt;
  if (e->is_array()) {
    for (auto v : e->get_array()) {
      if (const auto i = int_value(v)) return i;
      f.fail("'" + std::string(key) + "' holds a non-integer");
    }
    return std::nullopt;
  }
  return int_field(f, o, key);
}

void note(std::vector<std::string>* warnings, std::string text) {
  if (warnings != nullptr) warnings->push_back(std::move(text));
}

}  // namespace tessera::hf_json
