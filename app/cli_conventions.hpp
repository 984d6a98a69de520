// The command-line conventions users bring from vLLM and llama-server (issue #19), applied to every
// subcommand in one place:
//  * every flag also from an environment variable: --max-model-len from TESSERA_MAX_MODEL_LEN
//    (the command line wins over the variable, the variable over a --config file);
//  * token counts in vLLM's human-readable form: --max-model-len 4k (4000), 4K (4096), 1m, 1M;
//  * llama-server's spellings: -c / --ctx-size, -np / --parallel, -md / --model-draft, --draft-max,
//    --alias, --chat-template-file are aliases on the options themselves, except -np and -md, which
//    CLI11 cannot name (a one-dash option has one letter) and which are rewritten before parsing;
//  * an unknown flag is answered with the Tessera name: "did you mean --max-model-len?", from a table
//    of other servers' names and, failing that, the closest option name.
#pragma once
#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace tessera::app {

// TESSERA_<LONG_NAME> (dashes as underscores, upper case) for every named option of `cmd`.
void add_env_names(CLI::App& cmd);

// The environment variable of an option's long name: "max-model-len" -> "TESSERA_MAX_MODEL_LEN".
std::string env_name_of(const std::string& long_name);

// CLI11 transform: "4k" -> "4000", "4K" -> "4096" (k/m/g decimal, K/M/G binary, as vLLM); other text
// is left for the option's own conversion to accept or refuse.
CLI::Validator human_token_count();

// argv with the llama-server spellings CLI11 cannot parse replaced ("-np 4" -> "--max-num-seqs 4",
// "-md FILE" -> "--draft-model FILE").
std::vector<std::string> rewrite_foreign_spellings(int argc, char** argv);

// Whether the command line (or TESSERA_LOG_FORMAT) asks for `--log-format json`, read before CLI11
// parses, so that a usage error is written as a JSON line too (a log collector gets one object per line
// whatever went wrong). Only the last --log-format counts, as in CLI11.
bool json_log_format_requested(const std::vector<std::string>& args);

// For an option `cmd` does not know: the Tessera flag it most likely means ("" when nothing is close).
std::string suggest_option(const CLI::App& cmd, const std::string& unknown);

}  // namespace tessera::app
