// `tessera`: the command line. Subcommands:
//   generate   one prompt (streamed to stdout) or a JSONL file of requests run concurrently
//   bench      latency (single stream) and throughput (offline workload) measurements as JSON
//   inspect    a model file's metadata and tensors
//   serve      the OpenAI-compatible HTTP + WebSocket server
//   pull, list, rm   the model library (models by name: app/model_lookup.hpp)
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <iostream>

#include "app/cli_conventions.hpp"
#include "app/commands.hpp"
#include "app/exit_codes.hpp"
#include "engine/base/error.hpp"
#include "server/logging.hpp"

namespace {

// Every subcommand's flags (and its subcommands', as bench's) also from TESSERA_<FLAG>.
void add_env_names_everywhere(CLI::App& app) {
  for (CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    tessera::app::add_env_names(*sub);
    add_env_names_everywhere(*sub);
  }
}

// The innermost subcommand that was parsed (its options are the ones an unknown flag was meant for).
const CLI::App& selected_command(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands()) return selected_command(*sub);
  return app;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Tessera: a paged-KV, continuously batching LLM engine"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tessera 0.1.0");

  tessera::app::generate_command generate;
  generate.add_to(app);
  tessera::app::bench_command bench;
  bench.add_to(app);
  tessera::app::inspect_command inspect;
  inspect.add_to(app);
  tessera::app::serve_command serve;
  serve.add_to(app);
  tessera::app::library_commands library;
  library.add_to(app);

  add_env_names_everywhere(app);

  std::vector<std::string> args = tessera::app::rewrite_foreign_spellings(argc, argv);
  std::vector<char*> arg_pointers;
  for (std::string& a : args) arg_pointers.push_back(a.data());
  const bool json_errors = tessera::app::json_log_format_requested(args);
  // A usage error's text: CLI11's message (plus "did you mean" for an unknown flag) as people read it,
  // or one JSON line under --log-format json. --help and --version are not errors: always text.
  auto usage_error = [&](const CLI::ParseError& e, const std::string& hint) -> int {
    if (!json_errors || e.get_exit_code() == 0) {
      const int code = app.exit(e) == 0 ? tessera::app::exit_ok : tessera::app::exit_usage;
      if (!hint.empty()) std::fprintf(stderr, "tessera: %s\n", hint.c_str());
      return code;
    }
    std::string message = e.what();
    if (!hint.empty()) message += "; " + hint;
    std::fprintf(stderr, "%s\n", tessera::server::early_json_line("critical", message).c_str());
    return tessera::app::exit_usage;
  };
  try {
    app.parse(static_cast<int>(arg_pointers.size()), arg_pointers.data());
  } catch (const CLI::ExtrasError& e) {
    // CLI11's own statuses (105, 109, ...) become the usage error's 2; --help and --version stay 0.
    const CLI::App& cmd = selected_command(app);
    std::string hint;
    for (const std::string& extra : app.remaining(true)) {
      if (extra.size() < 2 || extra[0] != '-') continue;
      const std::string suggestion = tessera::app::suggest_option(cmd, extra);
      if (suggestion.empty()) continue;
      if (!hint.empty()) hint += "; ";
      hint += "unknown option " + extra + ": did you mean " + suggestion + "?";
    }
    return usage_error(e, hint);
  } catch (const CLI::ParseError& e) { return usage_error(e, ""); }
  try {
    if (generate.selected()) return generate.run();
    if (bench.selected()) return bench.run();
    if (inspect.selected()) return inspect.run();
    if (serve.selected()) return serve.run();
    if (library.selected()) return library.run();
  } catch (const tessera::load_error& e) {
    std::fprintf(stderr, "tessera: cannot load model: %s\n", e.what());
    return tessera::app::exit_model_load;
  } catch (const tessera::invalid_request& e) {
    std::fprintf(stderr, "tessera: invalid request: %s\n", e.what());
    return tessera::app::exit_usage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera: error: %s\n", e.what());
    return tessera::app::exit_failure;
  }
  return tessera::app::exit_ok;
}
