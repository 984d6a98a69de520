// The web UI's static file route: URL-to-file mapping, traversal refusal, content types, ETags, and the
// Debian browser libraries at /vendor/ (resolved at startup; a missing one is reported and answers 404).
#include "server/static_files.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <set>

namespace tessera::server {
namespace {

namespace fs = std::filesystem;
namespace http = boost::beast::http;

TEST(static_files, maps_ui_paths_and_refuses_everything_else) {
  EXPECT_EQ(ui_relative_path("/"), "index.html");
  EXPECT_EQ(ui_relative_path("/dashboard"), "dashboard.html");
  EXPECT_EQ(ui_relative_path("/dashboard.html"), "dashboard.html");
  EXPECT_EQ(ui_relative_path("/docs"), "docs.html");
  EXPECT_EQ(ui_relative_path("/js/chat.js"), "js/chat.js");
  EXPECT_EQ(ui_relative_path("/css/app.css"), "css/app.css");
  for (const char* bad : {"", "js/chat.js", "/..", "/../etc/passwd", "/js/../../x.js", "/%2e%2e/x.js", "/.git/config",
                          "/js/.hidden.js", "/js//chat.js", "/js/chat.js/", "/README.md", "/js\\..\\x.js", "/a b.js",
                          "/js/chat.js?x=1", "/~root.js", "/x.JS.exe"}) {
    EXPECT_FALSE(ui_relative_path(bad).has_value()) << bad;
  }
  EXPECT_FALSE(ui_relative_path(std::string("/x\0.js", 6)).has_value());
  EXPECT_FALSE(ui_relative_path("/" + std::string(300, 'a') + ".js").has_value());
  EXPECT_EQ(ui_content_type("a/b.js"), "text/javascript; charset=utf-8");
  EXPECT_EQ(ui_content_type("x.html"), "text/html; charset=utf-8");
  EXPECT_EQ(ui_content_type("x.svg"), "image/svg+xml");
  EXPECT_EQ(ui_content_type("x.md"), "");
  EXPECT_EQ(ui_content_type("dir.js/x"), "");
}

class static_files_dir : public ::testing::Test {
 protected:
  void SetUp() override {
    std::random_device rd;
    base_ = fs::temp_directory_path() / ("tessera_static_" + std::to_string(rd()));
    root_ = base_ / "webui";
    fs::create_directories(root_ / "js");
    write(root_ / "index.html", "<!doctype html><p>chat</p>");
    write(root_ / "js" / "app.js", "export const x = 1;\n");
    write(base_ / "secret.js", "secret");
    fs::create_symlink(base_ / "secret.js", root_ / "js" / "leak.js");
  }
  void TearDown() override { fs::remove_all(base_); }
  static void write(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }
  static http::request<http::string_body> get(const std::string& target) {
    return http::request<http::string_body>{http::verb::get, target, 11};
  }
  fs::path base_, root_;
};

TEST_F(static_files_dir, serves_files_with_types_and_etags) {
  static_files ui(root_);
  auto res = ui.respond(get("/"), "/");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->result(), http::status::ok);
  EXPECT_EQ(res->body(), "<!doctype html><p>chat</p>");
  EXPECT_EQ(res->at(http::field::content_type), "text/html; charset=utf-8");
  EXPECT_NE(res->find("Content-Security-Policy"), res->end());
  const std::string etag(res->at(http::field::etag));
  auto js = ui.respond(get("/js/app.js"), "/js/app.js");
  ASSERT_TRUE(js);
  EXPECT_EQ(js->at(http::field::content_type), "text/javascript; charset=utf-8");
  EXPECT_EQ(js->at("X-Content-Type-Options"), "nosniff");
  EXPECT_NE(std::string(js->at(http::field::etag)), etag);

  auto conditional = get("/");
  conditional.set(http::field::if_none_match, etag);
  auto again = ui.respond(conditional, "/");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->result(), http::status::not_modified);
  EXPECT_TRUE(again->body().empty());
  write(root_ / "index.html", "changed");
  auto changed = ui.respond(conditional, "/");
  ASSERT_TRUE(changed);
  EXPECT_EQ(changed->result(), http::status::ok) << "a changed file gets a new ETag";
  EXPECT_EQ(changed->body(), "changed");
}

TEST_F(static_files_dir, never_reads_outside_the_directory) {
  static_files ui(root_);
  EXPECT_FALSE(ui.respond(get("/js/leak.js"), "/js/leak.js")) << "a symlink leading out of the UI directory";
  EXPECT_FALSE(ui.respond(get("/../secret.js"), "/../secret.js"));
  EXPECT_FALSE(ui.respond(get("/js/missing.js"), "/js/missing.js"));
  EXPECT_FALSE(ui.respond(get("/js"), "/js"));
  fs::create_directories(root_ / "dir.js");
  EXPECT_FALSE(ui.respond(get("/dir.js"), "/dir.js")) << "directories are not files";
}

TEST_F(static_files_dir, finds_the_configured_directory) {
  EXPECT_EQ(find_webui_dir(root_.string()), root_);
  EXPECT_TRUE(find_webui_dir((root_ / "js").string()).empty()) << "no index.html";
  EXPECT_TRUE(find_webui_dir("none").empty());
  const fs::path built_in = find_webui_dir("");
  ASSERT_FALSE(built_in.empty()) << "the source tree's webui/ is compiled in";
  EXPECT_TRUE(fs::exists(built_in / "dashboard.html"));
  EXPECT_TRUE(fs::exists(built_in / "docs.html"));
}

TEST(vendor_libraries, names_only_single_safe_segments_under_vendor) {
  EXPECT_EQ(vendor_name("/vendor/marked.js"), "marked.js");
  EXPECT_EQ(vendor_name("/vendor/chart.js"), "chart.js");
  for (const char* bad :
       {"/vendor/", "/vendor", "/vendors/marked.js", "/js/marked.js", "/vendor/../marked.js", "/vendor/.marked.js",
        "/vendor/x/marked.js", "/vendor/Marked.js", "/vendor/%2e.js", "/vendor/marked.js?x"}) {
    EXPECT_EQ(vendor_name(bad), "") << bad;
  }
}

TEST(vendor_libraries, the_table_names_debian_paths_served_as_javascript) {
  std::set<std::string_view> names;
  for (const vendor_library& lib : debian_vendor_libraries()) {
    EXPECT_TRUE(names.insert(lib.name).second) << lib.name;
    EXPECT_EQ(vendor_name("/vendor/" + std::string(lib.name)), lib.name);
    EXPECT_EQ(ui_content_type(lib.name), "text/javascript; charset=utf-8");
    EXPECT_TRUE(lib.path.starts_with("/usr/share/")) << lib.path;
    EXPECT_FALSE(lib.package.empty());
    EXPECT_FALSE(lib.without.empty());
  }
  EXPECT_EQ(names, (std::set<std::string_view>{"marked.js", "purify.js", "highlight.js", "chart.js"}));
}

class vendor_tree : public static_files_dir {
 protected:
  void SetUp() override {
    static_files_dir::SetUp();
    system_ = base_ / "system";
    // Every library but Chart.js, marked through a symlink as Debian installs it.
    for (const vendor_library& lib : debian_vendor_libraries()) {
      if (lib.name == "chart.js") continue;
      const fs::path file = system_ / fs::path(lib.path).relative_path();
      fs::create_directories(file.parent_path());
      if (lib.name == "marked.js") {
        write(file.parent_path() / "marked.umd.min.js", "/* marked */");
        fs::create_symlink("marked.umd.min.js", file);
      } else {
        write(file, "/* " + std::string(lib.name) + " */");
      }
    }
  }
  fs::path system_;
};

TEST_F(vendor_tree, resolves_present_files_and_reports_missing_ones) {
  const vendor_files v = resolve_vendor_files(system_);
  EXPECT_EQ(v.found.size(), 3u);
  ASSERT_TRUE(v.found.contains("marked.js"));
  EXPECT_EQ(v.found.at("marked.js").filename(), "marked.umd.min.js") << "the symlink is followed";
  EXPECT_FALSE(v.found.contains("chart.js"));
  ASSERT_EQ(v.missing.size(), 1u);
  EXPECT_NE(v.missing[0].find("/vendor/chart.js"), std::string::npos) << v.missing[0];
  EXPECT_NE(v.missing[0].find("apt-get install libjs-chart.js"), std::string::npos) << v.missing[0];
  EXPECT_NE(v.missing[0].find((system_ / "usr/share/javascript/chart.js/chart.min.js").string()), std::string::npos)
      << v.missing[0];

  // A directory where the file should be is missing too.
  fs::create_directories(system_ / "usr/share/javascript/chart.js/chart.min.js");
  EXPECT_FALSE(resolve_vendor_files(system_).found.contains("chart.js"));
  EXPECT_EQ(resolve_vendor_files(base_ / "nothing").missing.size(), debian_vendor_libraries().size());
}

TEST_F(vendor_tree, serves_resolved_libraries_and_nothing_else_under_vendor) {
  static_files ui(root_, resolve_vendor_files(system_));
  auto marked = ui.respond(get("/vendor/marked.js"), "/vendor/marked.js");
  ASSERT_TRUE(marked);
  EXPECT_EQ(marked->result(), http::status::ok);
  EXPECT_EQ(marked->body(), "/* marked */");
  EXPECT_EQ(marked->at(http::field::content_type), "text/javascript; charset=utf-8");
  EXPECT_EQ(marked->at("X-Content-Type-Options"), "nosniff");
  auto conditional = get("/vendor/marked.js");
  conditional.set(http::field::if_none_match, marked->at(http::field::etag));
  auto again = ui.respond(conditional, "/vendor/marked.js");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->result(), http::status::not_modified);

  EXPECT_FALSE(ui.respond(get("/vendor/chart.js"), "/vendor/chart.js")) << "missing library: 404";
  // A file of that name in the UI directory is not served in its place, nor anything else there.
  fs::create_directories(root_ / "vendor");
  write(root_ / "vendor" / "chart.js", "not the library");
  write(root_ / "vendor" / "other.js", "x");
  EXPECT_FALSE(ui.respond(get("/vendor/chart.js"), "/vendor/chart.js"));
  EXPECT_FALSE(ui.respond(get("/vendor/other.js"), "/vendor/other.js"));
  EXPECT_FALSE(ui.respond(get("/vendor/x/other.js"), "/vendor/x/other.js"));
  EXPECT_FALSE(ui.respond(get("/vendor/../js/app.js"), "/vendor/../js/app.js"));
  EXPECT_TRUE(ui.respond(get("/js/app.js"), "/js/app.js")) << "the UI's own files are unaffected";

  static_files bare(root_);
  EXPECT_FALSE(bare.respond(get("/vendor/marked.js"), "/vendor/marked.js")) << "no libraries given: none served";
}

}  // namespace
}  // namespace tessera::server
