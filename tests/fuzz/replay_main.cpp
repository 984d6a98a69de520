// The main() of a fuzz target in an ordinary (non-libFuzzer) build: replays every file under the
// directories (or the files) it is given through LLVMFuzzerTestOneInput, in sorted order, so the seed
// corpus and every committed regression input (tests/fuzz/regressions/<name>/) run as a plain ctest on
// each build, with whatever compiler and sanitizers that build uses.
//
//   <name>_fuzz [--require] PATH...    --require: the paths after it must hold at least one input
//
// A finding aborts (as under libFuzzer), and the last "replaying" line names the input. Exit 77 from
// LLVMFuzzerInitialize (a target whose data is missing) is passed through as ctest's "skipped".
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  if (LLVMFuzzerInitialize != nullptr) LLVMFuzzerInitialize(&argc, &argv);
  bool required = false;
  size_t required_found = 0;
  size_t replayed = 0;
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    if (arg == "--require") {
      required = true;
      continue;
    }
    std::vector<fs::path> inputs;
    std::error_code ec;
    if (fs::is_directory(arg, ec)) {
      for (const auto& e : fs::recursive_directory_iterator(arg, ec)) {
        // README.md and dot files document a directory; they are not inputs.
        const std::string name = e.path().filename().string();
        if (e.is_regular_file() && name[0] != '.' && name != "README.md") inputs.push_back(e.path());
      }
    } else if (fs::is_regular_file(arg, ec)) {
      inputs.emplace_back(arg);
    } else if (required) {
      std::fprintf(stderr, "%s: no such file or directory\n", arg.c_str());
      return 1;
    }
    std::sort(inputs.begin(), inputs.end());
    for (const auto& p : inputs) {
      std::ifstream in(p, std::ios::binary);
      const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (!in.eof() && in.fail()) {
        std::fprintf(stderr, "cannot read %s\n", p.c_str());
        return 1;
      }
      std::fprintf(stderr, "replaying %s (%zu bytes)\n", p.c_str(), bytes.size());
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      ++replayed;
      if (required) ++required_found;
    }
  }
  if (required && required_found == 0) {
    std::fprintf(stderr, "no inputs found in the required paths (an empty or misnamed corpus?)\n");
    return 1;
  }
  std::fprintf(stderr, "%zu inputs replayed without a finding\n", replayed);
  return 0;
}
