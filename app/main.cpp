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
  try {
    app.parse(static_cast<int>(arg_pointers.size()), arg_pointers.data());
  } catch (const CLI::ExtrasError& e) {
    // CLI11's own statuses (105, 109, ...) become the usage error's 2; --help and --version stay 0.
    const int code = app.exit(e) == 0 ? tessera::app::exit_ok : tessera::app::exit_usage;
    const CLI::App& cmd = selected_command(app);
    for (const std::string& extra : app.remaining(true)) {
      if (extra.size() < 2 || extra[0] != '-') continue;
      const std::string suggestion = tessera::app::suggest_option(cmd, extra);
      if (!suggestion.empty())
        std::fprintf(stderr, "tessera: unknown option %s: did you mean %s?\n", extra.c_str(), suggestion.c_str());
    }
    return code;
  } catch (const CLI::ParseError& e) { return app.exit(e) == 0 ? tessera::app::exit_ok : tessera::app::exit_usage; }
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
