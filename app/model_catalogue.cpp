#include "app/model_catalogue.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <utility>

#include "app/model_catalogue_toml.hpp"  // generated from config/models.toml (app/CMakeLists.txt)
#include "engine/base/error.hpp"

namespace tessera::app {

namespace {

std::string where(const std::string& source, const toml::node& node) {
  const toml::source_region& region = node.source();
  if (region.begin.line == 0) return source;
  return source + ":" + std::to_string(region.begin.line);
}

[[noreturn]] void bad(const std::string& source, const toml::node& node, const std::string& key,
                      const std::string& what) {
  throw invalid_request(where(source, node) + ": '" + key + "' " + what);
}

// Names, packages and versions: letters, digits and . _ - (a name begins with a letter or digit, so
// that none can pass for a command-line option of pip or of tessera).
bool is_plain_word(std::string_view s) {
  if (s.empty() || !std::isalnum(static_cast<unsigned char>(s.front()))) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

std::string get_string(const toml::table& t, const std::string& source, const std::string& key, const std::string& at) {
  const toml::node* n = t.get(key);
  if (!n) bad(source, t, at + "." + key, "is missing");
  const auto* s = n->as_string();
  if (!s) bad(source, *n, at + "." + key, "must be a string");
  return s->get();
}

catalogue_part parse_part(const toml::node& node, const std::string& source, const std::string& at) {
  const toml::table* t = node.as_table();
  if (!t) bad(source, node, at, "must be a table {package, version, member}");
  catalogue_part p;
  p.package = get_string(*t, source, "package", at);
  p.version = get_string(*t, source, "version", at);
  p.member = get_string(*t, source, "member", at);
  if (!is_plain_word(p.package)) bad(source, *t, at + ".package", "must be a PyPI project name");
  if (!is_plain_word(p.version)) bad(source, *t, at + ".version", "must be a version such as 1.0.0");
  if (p.member.empty() || p.member.front() == '/' || p.member.find("..") != std::string::npos)
    bad(source, *t, at + ".member", "must be a relative path inside the wheel");
  for (const auto& [key, value] : *t) {
    if (key != "package" && key != "version" && key != "member")
      bad(source, value, at + "." + std::string(key.str()), "is not a catalogue key");
  }
  return p;
}

catalogue_entry parse_entry(std::string name, const toml::node& node, const std::string& source) {
  const std::string at = "models." + name;
  const toml::table* t = node.as_table();
  if (!t) bad(source, node, at, "must be a table");
  if (!is_plain_word(name)) bad(source, *t, at, "is not a valid name (letters, digits, '.', '_', '-')");
  catalogue_entry e;
  e.name = std::move(name);
  e.description = t->contains("description") ? get_string(*t, source, "description", at) : std::string();
  e.file = get_string(*t, source, "file", at);
  if (!is_plain_word(e.file)) bad(source, *t, at + ".file", "must be a plain file name");
  e.sha256 = get_string(*t, source, "sha256", at);
  if (e.sha256.size() != 64 || !std::all_of(e.sha256.begin(), e.sha256.end(),
                                            [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }))
    bad(source, *t, at + ".sha256", "must be 64 lower-case hex digits");
  const toml::node* size = t->get("size");
  if (!size || !size->as_integer() || size->as_integer()->get() <= 0)
    bad(source, size ? *size : node, at + ".size", "must be the file's size in bytes (a positive integer)");
  e.size = size->as_integer()->get();
  if (const toml::node* aliases = t->get("aliases")) {
    const toml::array* list = aliases->as_array();
    if (!list) bad(source, *aliases, at + ".aliases", "must be an array of names");
    for (const toml::node& a : *list) {
      const auto* s = a.as_string();
      if (!s || !is_plain_word(s->get())) bad(source, a, at + ".aliases", "must hold names");
      e.aliases.push_back(s->get());
    }
  }
  const toml::node* parts = t->get("parts");
  const toml::array* list = parts ? parts->as_array() : nullptr;
  if (!list || list->empty()) bad(source, parts ? *parts : node, at + ".parts", "must list the wheels ([[...parts]])");
  for (size_t i = 0; i < list->size(); ++i)
    e.parts.push_back(parse_part(*list->get(i), source, at + ".parts[" + std::to_string(i) + "]"));
  for (const auto& [key, value] : *t) {
    const std::string_view k = key.str();
    if (k != "description" && k != "file" && k != "sha256" && k != "size" && k != "aliases" && k != "parts")
      bad(source, value, at + "." + std::string(k), "is not a catalogue key");
  }
  return e;
}

}  // namespace

bool catalogue_entry::answers_to(std::string_view n) const {
  return n == name || std::find(aliases.begin(), aliases.end(), n) != aliases.end();
}

std::vector<catalogue_entry> parse_catalogue(std::string_view toml_text, const std::string& source) {
  toml::table root;
  try {
    root = toml::parse(toml_text, source);
  } catch (const toml::parse_error& e) {
    throw invalid_request(source + ":" + std::to_string(e.source().begin.line) + ": " + std::string(e.description()));
  }
  std::vector<catalogue_entry> out;
  for (const auto& [key, value] : root) {
    if (key.str() != "models")
      bad(source, value, std::string(key.str()), "is not a catalogue table (only [models.NAME])");
  }
  const toml::table* models = root["models"].as_table();
  if (!models) throw invalid_request(source + ": no [models.NAME] tables");
  // In the file's order (toml++ keeps a table's keys sorted): the first entry is listed first.
  std::vector<std::pair<const toml::key*, const toml::node*>> in_order;
  for (const auto& [key, value] : *models) in_order.emplace_back(&key, &value);
  std::stable_sort(in_order.begin(), in_order.end(), [](const auto& a, const auto& b) {
    return a.second->source().begin.line < b.second->source().begin.line;
  });
  for (const auto& [key_ptr, value_ptr] : in_order) {
    const toml::node& value = *value_ptr;
    catalogue_entry e = parse_entry(std::string(key_ptr->str()), value, source);
    for (const catalogue_entry& other : out) {
      for (const std::string& n : e.aliases) {
        if (other.answers_to(n)) bad(source, value, "models." + e.name + ".aliases", "repeats the name " + n);
      }
      if (other.answers_to(e.name)) bad(source, value, "models." + e.name, "is already a name of " + other.name);
    }
    out.push_back(std::move(e));
  }
  return out;
}

const std::vector<catalogue_entry>& model_catalogue() {
  // Read once: the environment does not change while a command runs.
  static const std::vector<catalogue_entry> catalogue = [] {
    const char* path = std::getenv("TESSERA_MODEL_CATALOGUE");
    if (!path || !*path) return parse_catalogue(k_model_catalogue_toml, "config/models.toml");
    std::ifstream in(path, std::ios::binary);
    if (!in) throw invalid_request(std::string("TESSERA_MODEL_CATALOGUE: cannot read ") + path);
    std::ostringstream text;
    text << in.rdbuf();
    return parse_catalogue(text.str(), path);
  }();
  return catalogue;
}

const catalogue_entry* find_catalogue_entry(std::string_view name) {
  for (const catalogue_entry& e : model_catalogue()) {
    if (e.answers_to(name)) return &e;
  }
  return nullptr;
}

std::string known_model_names() {
  std::string out;
  for (const catalogue_entry& e : model_catalogue()) {
    if (!out.empty()) out += ", ";
    out += e.name;
    for (const std::string& a : e.aliases) out += (a == e.aliases.front() ? " (" : ", ") + a;
    if (!e.aliases.empty()) out += ")";
  }
  return out;
}

}  // namespace tessera::app
