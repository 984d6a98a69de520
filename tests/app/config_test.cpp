// TOML config files (app/config.cpp): precedence (the command line wins), tables, type and range errors
// that name the key, and the shipped config/tessera.toml against `tessera serve`'s real options.
#include "app/config.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <set>

#include "app/commands.hpp"

namespace tessera::app {
namespace {

// A small command shaped like `serve`: options in two groups, a flag, a list, a choice.
struct fake_command {
  CLI::App app{"test"};
  int port = 8000;
  double memory = 1.0;
  std::string mode = "auto";
  std::string name;
  bool quiet = false;
  std::vector<std::string> hosts;

  fake_command() {
    app.option_defaults()->group("Server");
    app.add_option("--port", port)->check(CLI::Range(0, 65535));
    app.add_option("--served-model-name", name);
    app.add_option("--allowed-host", hosts);
    app.option_defaults()->group("Engine");
    app.add_option("--kv-cache-memory", memory)->check(CLI::Range(0.0, 4096.0));
    app.add_option("--preemption-mode", mode)->check(CLI::IsMember({"swap", "recompute", "auto"}));
    app.add_flag("-q,--quiet", quiet);
  }

  void parse(std::vector<std::string> args = {}) {
    std::reverse(args.begin(), args.end());  // CLI11 takes them last-first
    app.parse(args);
  }

  std::vector<std::string> apply(const std::string& toml) { return apply_config(app, toml, "test.toml"); }

  // The message of the config_error applying `toml` throws; "" when it does not throw.
  std::string error_of(const std::string& toml) {
    try {
      apply(toml);
    } catch (const config_error& e) { return e.what(); }
    return "";
  }
};

TEST(config, fills_options_the_command_line_left_unset) {
  fake_command c;
  c.parse();
  const auto keys = c.apply(
      "port = 9000\nkv_cache_memory = 2.5\npreemption_mode = \"swap\"\nquiet = true\n"
      "served_model_name = \"mine\"\nallowed_host = [\"a.example\", \"b.example\"]\n");
  EXPECT_EQ(c.port, 9000);
  EXPECT_DOUBLE_EQ(c.memory, 2.5);
  EXPECT_EQ(c.mode, "swap");
  EXPECT_TRUE(c.quiet);
  EXPECT_EQ(c.name, "mine");
  EXPECT_EQ(c.hosts, (std::vector<std::string>{"a.example", "b.example"}));
  EXPECT_EQ(std::set<std::string>(keys.begin(), keys.end()),
            (std::set<std::string>{"port", "kv-cache-memory", "preemption-mode", "quiet", "served-model-name",
                                   "allowed-host"}));
}

TEST(config, command_line_wins) {
  fake_command c;
  c.parse({"--port", "7000", "--allowed-host", "cli.example", "-q"});
  c.apply("port = 9000\nallowed_host = [\"file.example\"]\nquiet = false\nkv_cache_memory = 3\n");
  EXPECT_EQ(c.port, 7000);
  EXPECT_EQ(c.hosts, (std::vector<std::string>{"cli.example"}));
  EXPECT_TRUE(c.quiet);
  EXPECT_DOUBLE_EQ(c.memory, 3.0);  // not on the command line: from the file (an integer is a number)
}

TEST(config, absent_keys_keep_their_defaults) {
  fake_command c;
  c.parse();
  c.apply("# nothing but a comment\n");
  EXPECT_EQ(c.port, 8000);
  EXPECT_EQ(c.mode, "auto");
  EXPECT_FALSE(c.quiet);
}

TEST(config, tables_are_the_help_groups_and_kebab_case_works) {
  fake_command c;
  c.parse();
  c.apply("[server]\nport = 8100\nserved-model-name = \"x\"\n[engine]\nkv-cache-memory = 0.5\n");
  EXPECT_EQ(c.port, 8100);
  EXPECT_EQ(c.name, "x");
  EXPECT_DOUBLE_EQ(c.memory, 0.5);
}

TEST(config, key_in_the_wrong_table_is_named) {
  fake_command c;
  c.parse();
  const std::string e = c.error_of("[engine]\nport = 1\n");
  EXPECT_NE(e.find("'engine.port'"), std::string::npos) << e;
  EXPECT_NE(e.find("[server]"), std::string::npos) << e;
  EXPECT_NE(e.find("test.toml:2:"), std::string::npos) << e;
}

TEST(config, unknown_key_and_table_are_named) {
  fake_command c;
  c.parse();
  std::string e = c.error_of("port = 1\nprot = 2\n");
  EXPECT_NE(e.find("unknown key 'prot'"), std::string::npos) << e;
  EXPECT_NE(e.find("test.toml:2:"), std::string::npos) << e;
  e = c.error_of("[server]\nmax_bodyy = 5\n");
  EXPECT_NE(e.find("unknown key 'server.max_bodyy'"), std::string::npos) << e;
  e = c.error_of("[srv]\nport = 5\n");
  EXPECT_NE(e.find("unknown table [srv]"), std::string::npos) << e;
  EXPECT_NE(e.find("[engine], [server]"), std::string::npos) << e;
  // --help and --config are not settable from a file.
  e = c.error_of("help = true\n");
  EXPECT_NE(e.find("unknown key 'help'"), std::string::npos) << e;
}

TEST(config, wrong_types_are_named) {
  struct bad {
    const char* toml;
    const char* expected;
  };
  for (const bad& b : std::initializer_list<bad>{
           {"port = \"9000\"", "'port' must be an integer, not a string"},
           {"port = 90.5", "'port' must be an integer, not a float"},
           {"port = true", "'port' must be an integer, not a boolean"},
           {"kv_cache_memory = \"big\"", "'kv_cache_memory' must be a number, not a string"},
           {"quiet = 1", "'quiet' must be a boolean, not an integer"},
           {"served_model_name = 5", "'served_model_name' must be a string, not an integer"},
           {"served_model_name = [\"a\"]", "'served_model_name' must be a string, not an array"},
           {"allowed_host = [1, 2]", "'allowed_host' must be an array of strings, but holds an integer"},
           {"[server]\nport = { a = 1 }", "'server.port' must be an integer, not a table"},
       }) {
    fake_command c;
    c.parse();
    const std::string e = c.error_of(b.toml);
    EXPECT_NE(e.find(b.expected), std::string::npos) << b.toml << " -> " << e;
  }
}

TEST(config, option_checks_apply_to_file_values) {
  fake_command c;
  c.parse();
  std::string e = c.error_of("port = 70000\n");
  EXPECT_NE(e.find("'port'"), std::string::npos) << e;
  EXPECT_NE(e.find("70000"), std::string::npos) << e;
  fake_command d;
  d.parse();
  e = d.error_of("preemption_mode = \"sometimes\"\n");
  EXPECT_NE(e.find("'preemption_mode'"), std::string::npos) << e;
  EXPECT_NE(e.find("sometimes"), std::string::npos) << e;
}

TEST(config, syntax_errors_give_file_line_and_column) {
  fake_command c;
  c.parse();
  const std::string e = c.error_of("port = 1\nhost = \n");
  EXPECT_EQ(e.rfind("test.toml:2:", 0), 0u) << e;
  fake_command d;
  d.parse();
  EXPECT_NE(d.error_of("port = 1\nport = 2\n").find("test.toml:2:"), std::string::npos);  // duplicate key
  fake_command f;
  f.parse();
  const std::string twice = f.error_of("kv_cache_memory = 1\n[engine]\nkv-cache-memory = 2\n");
  EXPECT_NE(twice.find("sets --kv-cache-memory a second time"), std::string::npos) << twice;
}

TEST(config, missing_file_is_an_error) {
  fake_command c;
  c.parse();
  try {
    apply_config_file(c.app, "/nonexistent/tessera.toml");
    FAIL() << "no error";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/tessera.toml"), std::string::npos) << e.what();
  }
}

// The shipped file lists every option of `tessera serve` in its help group's table, with its real
// default: a new flag without an entry, or a default changed in code only, fails here.
TEST(config, shipped_file_lists_every_serve_option_with_its_default) {
  CLI::App root{"tessera"};
  serve_command serve;
  serve.add_to(root);
  std::vector<std::string> args = {"serve"};
  root.parse(args);
  CLI::App& cmd = *root.get_subcommand("serve");
  const std::string path = std::string(TESSERA_TEST_DATA_DIR) + "/../../config/tessera.toml";
  const std::vector<std::string> keys = apply_config_file(cmd, path);
  const std::set<std::string> in_file(keys.begin(), keys.end());
  EXPECT_EQ(in_file.size(), keys.size()) << "a key appears twice";

  auto canonical = [](const std::string& text) {
    if (text == "false" || text == "0" || text.empty() || text == "[]" || text == "\"\"") return std::string();
    char* end = nullptr;
    const double number = std::strtod(text.c_str(), &end);
    if (end && *end == '\0' && end != text.c_str()) return std::to_string(number);
    return text;
  };
  int num_checked = 0;
  for (const CLI::Option* option : cmd.get_options()) {
    if (!configurable(*option)) continue;
    const std::string& name = option->get_lnames().front();
    ++num_checked;
    EXPECT_TRUE(in_file.count(name)) << "config/tessera.toml lacks '" << name << "' (in [" << config_table_of(*option)
                                     << "])";
    std::string set_to;
    for (const std::string& r : option->results()) set_to += r;
    EXPECT_EQ(canonical(set_to), canonical(option->get_default_str()))
        << name << ": the file says '" << set_to << "', the code's default is '" << option->get_default_str() << "'";
  }
  EXPECT_GE(num_checked, 25);
}

}  // namespace
}  // namespace tessera::app
