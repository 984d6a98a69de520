// The browser UI's files (webui/: plain HTML, CSS and JS modules) served by `tessera serve` for GET
// and HEAD on any path the API does not claim. URL paths are mapped onto the UI directory by a strict
// whitelist (no percent-decoding, no dot segments, no hidden files, known extensions only) and the
// resolved file must still lie under the directory after symlinks are followed, so no request can
// read anything outside it. Responses carry a content hash as ETag (If-None-Match answers 304) and
// `Cache-Control: no-cache` so a browser revalidates after an upgrade instead of running stale JS.
#pragma once
#include <boost/beast/http.hpp>

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "server/vendor_libraries.hpp"

namespace tessera::server {

// /vendor/<name> is not looked up in the UI directory: it serves the Debian packages' browser libraries
// resolved at startup (server/vendor_libraries.hpp), and nothing else under /vendor/.
//
// "/" -> "index.html", "/dashboard" -> "dashboard.html", "/js/app.js" -> "js/app.js"; nullopt for a
// path that is not a safe UI file name (traversal, encoded bytes, hidden files, unknown extension).
std::optional<std::string> ui_relative_path(std::string_view url_path);

// Content type for a file name's extension; empty for extensions the UI does not serve.
std::string_view ui_content_type(std::string_view file_name);

// The UI directory to serve: `configured` if not empty ("none": no UI), else the first of the source
// tree's webui/ (compiled in), <executable dir>/../share/tessera/webui and <executable dir>/webui that
// holds an index.html. Empty when none exists.
std::filesystem::path find_webui_dir(const std::string& configured);

class static_files {
 public:
  // root must exist (see find_webui_dir); vendor: the libraries served at /vendor/ (resolve_vendor_files).
  explicit static_files(std::filesystem::path root, vendor_files vendor = {});

  const std::filesystem::path& root() const { return root_; }

  // The response for a GET/HEAD of `url_path` (query already stripped); nullopt when there is no such
  // UI file (the caller answers 404 like any unknown route).
  std::optional<boost::beast::http::response<boost::beast::http::string_body>> respond(
      const boost::beast::http::request<boost::beast::http::string_body>& req, std::string_view url_path) const;

 private:
  static std::optional<boost::beast::http::response<boost::beast::http::string_body>> file_response(
      const boost::beast::http::request<boost::beast::http::string_body>& req, const std::filesystem::path& file,
      std::string_view content_type);

  std::filesystem::path root_;                                        // canonical
  std::map<std::string, std::filesystem::path, std::less<>> vendor_;  // name -> canonical file
};

}  // namespace tessera::server
