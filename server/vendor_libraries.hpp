// The browser libraries the web UI uses (marked, DOMPurify, highlight.js, Chart.js), taken from the
// Debian packages that install them (libjs-marked, node-dompurify, libjs-highlight.js, libjs-chart.js;
// scripts/setup installs them) and served by `tessera serve` at /vendor/<name>.js. Nothing is fetched
// from a CDN and no copy is kept in the source tree: Debian maintains the files (security updates
// reach the UI with `apt upgrade`). The table of names and paths is fixed; the files are resolved once
// at startup. A library that is missing is reported then (package to install, what the UI loses) and
// its URL answers 404: the pages load each library with its own <script> tag and work without it
// (the chat falls back to its built-in Markdown renderer, the dashboard to its own plain charts).
#pragma once
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::server {

struct vendor_library {
  std::string_view name;     // served at /vendor/<name>
  std::string_view path;     // the file the Debian package installs (absolute)
  std::string_view package;  // the Debian package that installs it
  std::string_view without;  // what the UI does when it is missing
};

// The libraries the pages load, in the order the table lists them.
std::span<const vendor_library> debian_vendor_libraries();

struct vendor_files {
  std::map<std::string, std::filesystem::path, std::less<>> found;  // name -> canonical file
  std::vector<std::string> missing;                                 // one message per library that is not there
};

// Resolves every library of the table under `system_root` ("/" when serving; tests pass a temporary
// tree): the file must exist and be a regular file after symlinks are followed (Debian links
// marked.min.js to marked.umd.min.js).
vendor_files resolve_vendor_files(const std::filesystem::path& system_root = "/");

// "/vendor/marked.js" -> "marked.js"; empty when the path is not under /vendor/ or names a file that
// could not be in the table (anything but [a-z0-9.-] and one segment).
std::string_view vendor_name(std::string_view url_path);

}  // namespace tessera::server
