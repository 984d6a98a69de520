#include "server/vendor_libraries.hpp"

#include <array>
#include <system_error>

namespace tessera::server {

namespace fs = std::filesystem;

namespace {

// The minified builds: what a browser needs, a third of the size. DOMPurify's browser (UMD) build is
// under /usr/share/nodejs (Debian ships it with the Node package only).
constexpr std::array<vendor_library, 4> k_libraries{{
    {"marked.js", "/usr/share/javascript/marked/marked.min.js", "libjs-marked",
     "the chat renders Markdown with its built-in renderer (no tables)"},
    {"purify.js", "/usr/share/nodejs/dompurify/dist/purify.min.js", "node-dompurify",
     "the chat renders Markdown with its built-in renderer (marked's HTML is never used unsanitised)"},
    {"highlight.js", "/usr/share/javascript/highlight.js/highlight.min.js", "libjs-highlight.js",
     "code blocks are shown without syntax highlighting"},
    {"chart.js", "/usr/share/javascript/chart.js/chart.min.js", "libjs-chart.js",
     "the dashboard draws plain line charts without axes or tooltips"},
}};

}  // namespace

std::span<const vendor_library> debian_vendor_libraries() { return k_libraries; }

vendor_files resolve_vendor_files(const fs::path& system_root) {
  vendor_files out;
  for (const vendor_library& lib : k_libraries) {
    // relative_path(): "/usr/share/..." under the given root, not replacing it.
    const fs::path file = system_root / fs::path(lib.path).relative_path();
    std::error_code ec;
    const fs::path real = fs::canonical(file, ec);
    if (!ec && fs::is_regular_file(real, ec)) {
      out.found.emplace(std::string(lib.name), real);
      continue;
    }
    out.missing.push_back("web UI: /vendor/" + std::string(lib.name) + " unavailable: " + file.string() +
                          " is missing (apt-get install " + std::string(lib.package) + "); " +
                          std::string(lib.without));
  }
  return out;
}

std::string_view vendor_name(std::string_view url_path) {
  constexpr std::string_view prefix = "/vendor/";
  if (url_path.substr(0, prefix.size()) != prefix) return {};
  const std::string_view name = url_path.substr(prefix.size());
  if (name.empty() || name.size() > 64 || name.front() == '.') return {};
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-')) return {};
  }
  return name;
}

}  // namespace tessera::server
