#include "server/static_files.hpp"

#include <unistd.h>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <system_error>

namespace tessera::server {

namespace http = boost::beast::http;
namespace fs = std::filesystem;

namespace {

constexpr size_t max_ui_file_bytes = 8 * 1024 * 1024;

bool safe_segment_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
}

// FNV-1a: the ETag only has to change when the content does.
uint64_t content_hash(std::string_view data) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : data) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

bool has_index(const fs::path& dir) {
  std::error_code ec;
  return !dir.empty() && fs::is_regular_file(dir / "index.html", ec);
}

}  // namespace

std::optional<std::string> ui_relative_path(std::string_view url_path) {
  if (url_path.empty() || url_path.front() != '/' || url_path.size() > 256) return std::nullopt;
  if (url_path == "/") return std::string("index.html");
  if (url_path == "/dashboard") return std::string("dashboard.html");
  if (url_path == "/docs") return std::string("docs.html");  // the API docs page, as FastAPI's /docs
  std::string out;
  size_t pos = 1;
  while (pos <= url_path.size()) {
    const size_t end = std::min(url_path.find('/', pos), url_path.size());
    const std::string_view seg = url_path.substr(pos, end - pos);
    // No empty or dot-leading segments ("..", ".git", "//"), only [A-Za-z0-9._-]: '%', '\\', NUL and
    // everything else that could be decoded or interpreted into a traversal is refused as is.
    if (seg.empty() || seg.front() == '.') return std::nullopt;
    for (char c : seg) {
      if (!safe_segment_char(c)) return std::nullopt;
    }
    if (!out.empty()) out += '/';
    out.append(seg);
    pos = end + 1;
  }
  if (ui_content_type(out).empty()) return std::nullopt;
  return out;
}

std::string_view ui_content_type(std::string_view name) {
  const size_t dot = name.rfind('.');
  if (dot == std::string_view::npos || name.find('/', dot) != std::string_view::npos) return {};
  const std::string_view ext = name.substr(dot + 1);
  if (ext == "html") return "text/html; charset=utf-8";
  if (ext == "js" || ext == "mjs") return "text/javascript; charset=utf-8";
  if (ext == "css") return "text/css; charset=utf-8";
  if (ext == "svg") return "image/svg+xml";
  if (ext == "png") return "image/png";
  if (ext == "ico") return "image/x-icon";
  if (ext == "json") return "application/json";
  if (ext == "txt") return "text/plain; charset=utf-8";
  if (ext == "woff2") return "font/woff2";
  return {};
}

fs::path find_webui_dir(const std::string& configured) {
  if (configured == "none") return {};
  if (!configured.empty()) return has_index(configured) ? fs::path(configured) : fs::path();
#ifdef TESSERA_WEBUI_SOURCE_DIR
  if (has_index(TESSERA_WEBUI_SOURCE_DIR)) return TESSERA_WEBUI_SOURCE_DIR;
#endif
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (const fs::path& p :
         {exe.parent_path().parent_path() / "share" / "tessera" / "webui", exe.parent_path() / "webui"}) {
      if (has_index(p)) return p;
    }
  }
  return {};
}

static_files::static_files(fs::path root, vendor_files vendor)
    : root_(fs::canonical(root)), vendor_(std::move(vendor.found)) {}

std::optional<http::response<http::string_body>> static_files::respond(const http::request<http::string_body>& req,
                                                                       std::string_view url_path) const {
  // /vendor/...: only the table's libraries, at the paths resolved at startup, never the UI directory.
  if (url_path.starts_with("/vendor/")) {
    const auto it = vendor_.find(vendor_name(url_path));
    if (it == vendor_.end()) return std::nullopt;
    return file_response(req, it->second, ui_content_type(it->first));
  }
  const std::optional<std::string> rel = ui_relative_path(url_path);
  if (!rel) return std::nullopt;
  std::error_code ec;
  const fs::path file = fs::canonical(root_ / *rel, ec);
  if (ec || !fs::is_regular_file(file, ec)) return std::nullopt;
  // A symlink inside the UI directory must not lead outside it.
  const auto [root_end, file_it] = std::mismatch(root_.begin(), root_.end(), file.begin(), file.end());
  if (root_end != root_.end()) return std::nullopt;
  return file_response(req, file, ui_content_type(*rel));
}

std::optional<http::response<http::string_body>> static_files::file_response(
    const http::request<http::string_body>& req, const fs::path& file, std::string_view type) {
  std::error_code ec;
  const auto size = fs::file_size(file, ec);
  if (ec || size > max_ui_file_bytes) return std::nullopt;
  std::ifstream in(file, std::ios::binary);
  if (!in) return std::nullopt;
  std::string body((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

  char etag[32];
  std::snprintf(etag, sizeof etag, "\"%016llx\"", static_cast<unsigned long long>(content_hash(body)));
  const auto inm = req.find(http::field::if_none_match);
  const bool not_modified = inm != req.end() && std::string_view(inm->value().data(), inm->value().size()) == etag;

  http::response<http::string_body> res{not_modified ? http::status::not_modified : http::status::ok, 11};
  res.set(http::field::etag, etag);
  res.set(http::field::cache_control, "no-cache");
  res.set("X-Content-Type-Options", "nosniff");
  if (!not_modified) {
    res.set(http::field::content_type, type);
    res.body() = std::move(body);
  }
  if (type.substr(0, 9) == "text/html") {
    // Defence in depth for the chat page: even if model text ever reached innerHTML, no inline script,
    // no foreign origin could run or be contacted.
    res.set("Content-Security-Policy",
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
            "connect-src 'self' ws: wss:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'");
    res.set("Referrer-Policy", "no-referrer");
  }
  return res;
}

}  // namespace tessera::server
