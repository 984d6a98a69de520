// CORS (server/cors.hpp): which Origins may call the API, the --allowed-origins forms, and the
// preflight's answer. The browser's side of it runs in tests/e2e/conventions_test.py.
#include "server/cors.hpp"

#include <gtest/gtest.h>

namespace tessera::server {
namespace {

namespace http = boost::beast::http;

TEST(cors, same_origin_listed_or_any) {
  EXPECT_TRUE(origin_allowed("http://127.0.0.1:8000", "127.0.0.1:8000", {}));
  EXPECT_TRUE(origin_allowed("https://api.example", "api.example", {}));
  EXPECT_FALSE(origin_allowed("http://127.0.0.1:9000", "127.0.0.1:8000", {})) << "another port is another origin";
  EXPECT_FALSE(origin_allowed("http://evil.example", "", {}));
  EXPECT_TRUE(origin_allowed("http://app.example:3000", "127.0.0.1:8000", {"http://app.example:3000"}));
  EXPECT_FALSE(origin_allowed("http://app.example:3001", "127.0.0.1:8000", {"http://app.example:3000"}));
  EXPECT_TRUE(origin_allowed("http://anything", "127.0.0.1:8000", {"*"}));
}

TEST(cors, origin_lists_in_every_form) {
  EXPECT_EQ(parse_origin_list({"http://a:1,http://b/", "http://c"}),
            (std::vector<std::string>{"http://a:1", "http://b", "http://c"}));
  EXPECT_EQ(parse_origin_list({R"(["http://a", "*"])"}), (std::vector<std::string>{"http://a", "*"}));
  EXPECT_EQ(parse_origin_list({"*"}), (std::vector<std::string>{"*"}));
  EXPECT_TRUE(parse_origin_list({"", " , ", "[]"}).empty());
}

TEST(cors, preflight_is_options_with_a_requested_method_and_an_origin) {
  http::request_header<> req;
  req.method(http::verb::options);
  req.target("/v1/completions");
  EXPECT_FALSE(is_preflight(req));
  req.set(http::field::origin, "http://app.example");
  EXPECT_FALSE(is_preflight(req));
  req.set(http::field::access_control_request_method, "POST");
  EXPECT_TRUE(is_preflight(req));
  req.set(http::field::access_control_request_headers, "authorization,content-type,x-trace");
  const auto res = preflight_response(req, "http://app.example");
  EXPECT_EQ(res.result(), http::status::no_content);
  EXPECT_EQ(res[http::field::access_control_allow_origin], "http://app.example");
  EXPECT_EQ(res[http::field::vary], "Origin");
  EXPECT_NE(res[http::field::access_control_allow_methods].find("POST"), std::string::npos);
  const std::string headers(res[http::field::access_control_allow_headers]);
  for (const char* h : {"Authorization", "Content-Type", "x-trace"}) EXPECT_NE(headers.find(h), std::string::npos) << h;
  req.method(http::verb::post);
  EXPECT_FALSE(is_preflight(req));
}

}  // namespace
}  // namespace tessera::server
