#include "app/config.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

namespace tessera::app {

namespace {

// What TOML value an option takes, from the type CLI11 recorded when the option was bound.
enum class value_kind : uint8_t { boolean, integer, number, string };

value_kind kind_of(const CLI::Option& option) {
  if (option.get_expected_max() == 0) return value_kind::boolean;  // a flag takes no value
  std::string type = option.get_type_name();
  type = type.substr(0, type.find(':'));  // "INT:INT in [0 - 65535]" -> "INT"
  if (type == "INT" || type == "UINT") return value_kind::integer;
  if (type == "FLOAT") return value_kind::number;
  if (type == "BOOLEAN") return value_kind::boolean;
  return value_kind::string;
}

bool is_list(const CLI::Option& option) { return option.get_expected_max() > 1; }

const char* kind_name(value_kind kind) {
  switch (kind) {
    case value_kind::boolean: return "a boolean";
    case value_kind::integer: return "an integer";
    case value_kind::number: return "a number";
    case value_kind::string: return "a string";
  }
  return "a value";
}

const char* kind_plural(value_kind kind) {
  switch (kind) {
    case value_kind::boolean: return "booleans";
    case value_kind::integer: return "integers";
    case value_kind::number: return "numbers";
    case value_kind::string: return "strings";
  }
  return "values";
}

const char* toml_type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    default: return "a date/time";
  }
}

std::string where(const std::string& source, const toml::node& node) {
  const toml::source_region& region = node.source();
  if (region.begin.line == 0) return source;
  return source + ":" + std::to_string(region.begin.line) + ":" + std::to_string(region.begin.column);
}

// One TOML scalar as the text the option would have received on the command line; nullopt when the
// TOML type does not fit the option.
std::optional<std::string> scalar_text(const toml::node& node, value_kind kind) {
  switch (kind) {
    case value_kind::boolean:
      if (const auto* b = node.as_boolean()) return b->get() ? "true" : "false";
      return std::nullopt;
    case value_kind::integer:
      if (const auto* i = node.as_integer()) return std::to_string(i->get());
      return std::nullopt;
    case value_kind::number:
      if (const auto* i = node.as_integer()) return std::to_string(i->get());
      if (const auto* f = node.as_floating_point()) {
        char text[64];
        std::snprintf(text, sizeof text, "%.17g", f->get());
        return std::string(text);
      }
      return std::nullopt;
    case value_kind::string:
      if (const auto* s = node.as_string()) return s->get();
      return std::nullopt;
  }
  return std::nullopt;
}

std::string normalized(std::string_view key) {
  std::string out(key);
  for (char& c : out) {
    if (c == '_') c = '-';
  }
  return out;
}

}  // namespace

bool configurable(const CLI::Option& option) {
  if (!option.nonpositional() || option.get_lnames().empty()) return false;
  const std::string& name = option.get_lnames().front();
  return name != "help" && name != "config" && name != "version" && name != "help-all";
}

std::string config_table_of(const CLI::Option& option) {
  std::string group = option.get_group();
  for (char& c : group) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return group;
}

std::vector<std::string> apply_config(CLI::App& cmd, std::string_view toml_text, const std::string& source) {
  toml::table doc;
  try {
    doc = toml::parse(toml_text, source);
  } catch (const toml::parse_error& e) {
    const auto& at = e.source().begin;
    throw config_error(source + ":" + std::to_string(at.line) + ":" + std::to_string(at.column) + ": " +
                       std::string(e.description()));
  }

  // Every long name the command takes, and the tables (help groups) that exist.
  std::map<std::string, CLI::Option*> by_name;
  std::map<std::string, bool> tables;
  for (CLI::Option* option : cmd.get_options()) {
    if (!configurable(*option)) continue;
    for (const std::string& name : option->get_lnames()) by_name[name] = option;
    tables[config_table_of(*option)] = true;
  }
  auto table_list = [&] {
    std::string out;
    for (const auto& [name, _] : tables) out += (out.empty() ? "[" : ", [") + name + "]";
    return out;
  };

  std::vector<std::string> mentioned;
  auto apply_one = [&](const std::string& table, const std::string& key, const toml::node& node) {
    const std::string shown = table.empty() ? key : table + "." + key;
    const auto found = by_name.find(normalized(key));
    if (found == by_name.end()) {
      throw config_error(where(source, node) + ": unknown key '" + shown + "' (no option --" + normalized(key) + ")");
    }
    CLI::Option& option = *found->second;
    if (!table.empty() && config_table_of(option) != table) {
      throw config_error(where(source, node) + ": key '" + shown + "' belongs in [" + config_table_of(option) + "]");
    }
    const std::string& name = option.get_lnames().front();
    if (std::find(mentioned.begin(), mentioned.end(), name) != mentioned.end()) {
      throw config_error(where(source, node) + ": '" + shown + "' sets --" + name + " a second time");
    }
    mentioned.push_back(name);
    const value_kind kind = kind_of(option);
    std::vector<std::string> values;
    if (const toml::array* array = node.as_array(); array && is_list(option)) {
      for (const toml::node& item : *array) {
        std::optional<std::string> text = scalar_text(item, kind);
        if (!text) {
          throw config_error(where(source, item) + ": '" + shown + "' must be an array of " + kind_plural(kind) +
                             ", but holds " + toml_type_name(item));
        }
        values.push_back(std::move(*text));
      }
    } else {
      std::optional<std::string> text = scalar_text(node, kind);
      if (!text) {
        throw config_error(where(source, node) + ": '" + shown + "' must be " + kind_name(kind) +
                           (is_list(option) ? " or an array of them" : "") + ", not " + toml_type_name(node));
      }
      values.push_back(std::move(*text));
    }
    if (option.count() > 0) return;  // given on the command line: it wins
    if (values.empty()) return;      // an empty list: the default (no entries)
    try {
      for (std::string& v : values) option.add_result(std::move(v));
      option.run_callback();  // the option's own conversion and checks (ranges, choices)
    } catch (const CLI::Error& e) { throw config_error(where(source, node) + ": '" + shown + "': " + e.what()); }
  };

  for (const auto& [k, node] : doc) {
    const std::string key(k.str());
    if (const toml::table* table = node.as_table()) {
      if (!tables.count(key)) {
        throw config_error(where(source, node) + ": unknown table [" + key + "] (tables: " + table_list() + ")");
      }
      for (const auto& [inner_key, inner] : *table) apply_one(key, std::string(inner_key.str()), inner);
    } else {
      apply_one("", key, node);
    }
  }
  return mentioned;
}

std::vector<std::string> apply_config_file(CLI::App& cmd, const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw config_error("cannot read config file " + file.string());
  std::ostringstream text;
  text << in.rdbuf();
  return apply_config(cmd, text.str(), file.string());
}

}  // namespace tessera::app
