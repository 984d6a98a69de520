// TOML configuration files for a subcommand (`tessera serve --config config/tessera.toml`).
//
// A config file sets the same options as the command line, under their long names without dashes:
// `port = 8000` is `--port 8000`, and `max_num_seqs` or `max-num-seqs` is `--max-num-seqs`. Keys sit
// at the top level or in the table named after the option's help group (`[server]`, `[engine]`,
// `[logging]`). The command line wins: a file value only fills an option the command line left unset.
// Values go through the option's own conversion and checks (ranges, choices), so a file cannot set
// what the command line could not. Anything the file says that no option takes is an error naming the
// key, never silently ignored.
#pragma once
#include <CLI/CLI.hpp>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::app {

struct config_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Applies a TOML document (`source` names it in errors) to the options of `cmd` that were not given on
// the command line. Call after `cmd` was parsed. Throws config_error on a syntax error, an unknown key
// or table, a value of the wrong TOML type, or one the option's checks refuse. Returns the long names
// of the options the document mentions (set by it or overridden by the command line).
std::vector<std::string> apply_config(CLI::App& cmd, std::string_view toml_text, const std::string& source);

// Reads `file` and applies it as above; throws config_error when it cannot be read.
std::vector<std::string> apply_config_file(CLI::App& cmd, const std::filesystem::path& file);

// The table a config key of this option lives in: its help group, lower-cased ("Engine" -> "engine").
std::string config_table_of(const CLI::Option& option);

// Whether an option can be set from a config file (named, not --help/--config/--version).
bool configurable(const CLI::Option& option);

}  // namespace tessera::app
