// `tessera`: the command line. Subcommands:
//   generate   one prompt (streamed to stdout) or a JSONL file of requests run concurrently
//   bench      latency (single stream) and throughput (offline workload) measurements as JSON
//   inspect    a model file's metadata and tensors
//   serve      the OpenAI-compatible HTTP + WebSocket server
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <iostream>

#include "app/commands.hpp"
#include "engine/base/error.hpp"

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

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (generate.selected()) return generate.run();
    if (bench.selected()) return bench.run();
    if (inspect.selected()) return inspect.run();
    if (serve.selected()) return serve.run();
  } catch (const tessera::load_error& e) {
    std::fprintf(stderr, "tessera: cannot load model: %s\n", e.what());
    return 1;
  } catch (const tessera::invalid_request& e) {
    std::fprintf(stderr, "tessera: invalid request: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
