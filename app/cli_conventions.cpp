#include "app/cli_conventions.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string_view>
#include <utility>

namespace tessera::app {

namespace {

// llama-server's one-dash two-letter flags, which CLI11 cannot name, and the options they mean.
constexpr std::pair<std::string_view, std::string_view> k_two_letter_spellings[] = {
    {"-np", "--max-num-seqs"},
    {"-md", "--draft-model"},
};

// Other servers' flags -> Tessera's (those that are not aliases: a different meaning or shape).
constexpr std::pair<std::string_view, std::string_view> k_foreign_names[] = {
    {"--n-gpu-layers", "--device"},
    {"-ngl", "--device"},
    {"--gpu-layers", "--device"},
    {"--batch-size", "--max-num-batched-tokens"},
    {"--ubatch-size", "--max-num-batched-tokens"},
    {"--threads-batch", "--threads"},
    {"--n-predict", "--max-tokens"},
    {"--predict", "--max-tokens"},
    {"--cache-type-k", "--kv-cache-dtype"},
    {"--cache-type-v", "--kv-cache-dtype"},
    {"--kv-cache-type", "--kv-cache-dtype"},
    {"--api-key-file", "--api-key"},
    {"--model-name", "--served-model-name"},
    {"--name", "--served-model-name"},
    {"--ctx", "--max-model-len"},
    {"--context-length", "--max-model-len"},
    {"--max-seq-len", "--max-model-len"},
    {"--num-ctx", "--max-model-len"},
    {"--cors", "--allowed-origins"},
    {"--cors-allow-origins", "--allowed-origins"},
    {"--metrics", "(/metrics is always served)"},
    {"--no-webui", "--webui-dir none"},
    {"--path", "--webui-dir"},
    {"--speculative-config", "--speculative draft --draft-model PATH"},
    {"--speculative-model", "--speculative draft --draft-model PATH"},
};

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string env_name_of(const std::string& long_name) {
  std::string out = "TESSERA_";
  for (char c : long_name) out += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

void add_env_names(CLI::App& cmd) {
  for (CLI::Option* option : cmd.get_options()) {
    if (!option->nonpositional() || option->get_lnames().empty()) continue;
    const std::string& name = option->get_lnames().front();
    if (name == "help" || name == "version") continue;
    option->envname(env_name_of(name));
  }
}

CLI::Validator human_token_count() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        if (value.size() < 2) return {};
        const char suffix = value.back();
        const std::string_view units = "kmgKMG";
        const size_t unit = units.find(suffix);
        if (unit == std::string_view::npos) return {};
        const std::string number = value.substr(0, value.size() - 1);
        char* end = nullptr;
        const double n = std::strtod(number.c_str(), &end);
        if (end != number.c_str() + number.size() || !(n >= 0)) return {};  // left for the conversion to refuse
        const double scale = std::pow(unit < 3 ? 1000.0 : 1024.0, double(unit % 3 + 1));
        value = std::to_string(static_cast<long long>(std::llround(n * scale)));
        return {};
      },
      "", "human-readable count");
}

std::vector<std::string> rewrite_foreign_spellings(int argc, char** argv) {
  std::vector<std::string> out;
  for (int i = 0; i < argc; ++i) {
    const std::string_view arg = argv[i];
    bool rewritten = false;
    for (const auto& [theirs, ours] : k_two_letter_spellings) {
      if (arg == theirs) {
        out.emplace_back(ours);
      } else if (arg.starts_with(theirs) && arg.substr(theirs.size()).starts_with('=')) {
        out.emplace_back(std::string(ours) + std::string(arg.substr(theirs.size())));
      } else {
        continue;
      }
      rewritten = true;
      break;
    }
    if (!rewritten) out.emplace_back(arg);
  }
  return out;
}

bool json_log_format_requested(const std::vector<std::string>& args) {
  std::optional<std::string_view> format;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string_view arg = args[i];
    if (arg == "--log-format" && i + 1 < args.size()) {
      format = args[++i];
    } else if (arg.starts_with("--log-format=")) {
      format = arg.substr(std::string_view("--log-format=").size());
    }
  }
  if (!format) {
    const char* env = std::getenv("TESSERA_LOG_FORMAT");
    if (env != nullptr) format = env;
  }
  return format == "json";
}

std::string suggest_option(const CLI::App& cmd, const std::string& unknown) {
  const std::string_view name = std::string_view(unknown).substr(0, unknown.find('='));
  for (const auto& [foreign, ours] : k_foreign_names) {
    if (foreign == name) return std::string(ours);
  }
  std::string best;
  size_t best_distance = 4;  // at most 3 edits, else nothing is close enough to suggest
  const std::string_view bare =
      name.substr(name.find_first_not_of('-') == std::string_view::npos ? name.size() : name.find_first_not_of('-'));
  for (const CLI::Option* option : cmd.get_options()) {
    for (const std::string& long_name : option->get_lnames()) {
      const size_t d = edit_distance(bare, long_name);
      if (d < best_distance || (long_name.find(bare) != std::string::npos && bare.size() >= 4 && best.empty())) {
        best_distance = std::min(d, best_distance);
        best = "--" + long_name;
      }
    }
  }
  return best;
}

}  // namespace tessera::app
