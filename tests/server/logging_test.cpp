// server/logging: the access-log line (text and JSON), sanitizing of client-supplied paths, levels and
// --no-access-log. The loggers write to stderr, which the tests capture.
#include "server/logging.hpp"

#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <boost/json.hpp>

#include <sstream>

namespace tessera::server {
namespace {

access_entry generation_entry() {
  access_entry e;
  e.method = "POST";
  e.path = "/v1/chat/completions";
  e.status = 200;
  e.seconds = 0.4125;
  e.request_id = "chatcmpl-abc1";
  e.peer = "127.0.0.1:5000";
  e.outcome = "stop";
  e.prompt_tokens = 36;
  e.completion_tokens = 24;
  return e;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

TEST(logging, access_text_has_every_field) {
  EXPECT_EQ(format_access_text(generation_entry()),
            "127.0.0.1:5000 \"POST /v1/chat/completions\" 200 0.412s id=chatcmpl-abc1 prompt_tokens=36 "
            "completion_tokens=24 finish=stop");
  access_entry plain;
  plain.method = "GET";
  plain.path = "/health";
  plain.status = 503;
  EXPECT_EQ(format_access_text(plain), "- \"GET /health\" 503 0.000s id=-");
}

TEST(logging, client_paths_cannot_forge_lines_or_break_utf8) {
  access_entry e;
  e.method = "GET";
  const std::string evil = "/a\"b\nc\x01\x7f\xff" + std::string(400, 'x');
  e.path = evil;
  e.status = 404;
  const std::string line = format_access_text(e);
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  EXPECT_EQ(line.find('\x01'), std::string::npos) << line;
  EXPECT_NE(line.find("\"GET /a?b?c??"), std::string::npos) << line;  // quote and controls replaced
  EXPECT_NE(line.find("...\" 404"), std::string::npos) << line;       // cut at 256 bytes
  EXPECT_LT(line.size(), 340u);
}

TEST(logging, json_lines_carry_the_access_fields) {
  log_options options;
  options.format = log_format::json;
  options.asynchronous = false;
  setup_logging(options);
  testing::internal::CaptureStderr();
  log_access(generation_entry());
  spdlog::warn("plain \"quoted\" message");
  const std::vector<std::string> lines = lines_of(testing::internal::GetCapturedStderr());
  ASSERT_EQ(lines.size(), 2u);
  const boost::json::object a = boost::json::parse(lines[0]).as_object();
  EXPECT_EQ(a.at("logger"), "access");
  EXPECT_EQ(a.at("level"), "info");
  EXPECT_EQ(a.at("method"), "POST");
  EXPECT_EQ(a.at("path"), "/v1/chat/completions");
  EXPECT_EQ(a.at("status"), 200);
  EXPECT_EQ(a.at("request_id"), "chatcmpl-abc1");
  EXPECT_EQ(a.at("prompt_tokens"), 36);
  EXPECT_EQ(a.at("completion_tokens"), 24);
  EXPECT_EQ(a.at("finish_reason"), "stop");
  EXPECT_NEAR(a.at("duration_seconds").as_double(), 0.4125, 1e-9);
  EXPECT_TRUE(a.at("time").as_string().ends_with("Z"));
  const boost::json::object w = boost::json::parse(lines[1]).as_object();
  EXPECT_EQ(w.at("logger"), "tessera");
  EXPECT_EQ(w.at("level"), "warning");
  EXPECT_EQ(w.at("msg"), "plain \"quoted\" message");
  EXPECT_FALSE(w.contains("method"));  // access fields only on access lines
}

TEST(logging, level_and_no_access_log_filter) {
  // Captured before the loggers exist, so the text sink sees a file, not a terminal: no colour codes.
  testing::internal::CaptureStderr();
  log_options options;
  options.level = "warn";
  options.asynchronous = false;
  setup_logging(options);
  log_access(generation_entry());  // info: below warn
  spdlog::info("hidden");
  spdlog::error("shown");
  std::vector<std::string> lines = lines_of(testing::internal::GetCapturedStderr());
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("error tessera: shown"), std::string::npos) << lines[0];

  testing::internal::CaptureStderr();
  options.level = "info";
  options.access_log = false;
  setup_logging(options);
  log_access(generation_entry());
  spdlog::info("kept");
  lines = lines_of(testing::internal::GetCapturedStderr());
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("kept"), std::string::npos);

  testing::internal::CaptureStderr();
  options.access_log = true;
  setup_logging(options);
  log_access(generation_entry());
  lines = lines_of(testing::internal::GetCapturedStderr());
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("info  access: 127.0.0.1:5000 \"POST /v1/chat/completions\" 200"), std::string::npos)
      << lines[0];
}

TEST(logging, asynchronous_lines_are_all_written_by_shutdown) {
  testing::internal::CaptureStderr();
  log_options options;  // asynchronous, as `tessera serve` runs
  setup_logging(options);
  for (int i = 0; i < 500; ++i) log_access(generation_entry());
  spdlog::info("last");
  shutdown_logging();
  const std::vector<std::string> lines = lines_of(testing::internal::GetCapturedStderr());
  ASSERT_EQ(lines.size(), 501u);
  EXPECT_NE(lines.back().find("tessera: last"), std::string::npos) << lines.back();
}

// A client's 4xx is an info line (not the server's error); a 5xx is an error line, kept at --log-level warn.
TEST(logging, access_levels_follow_the_status) {
  testing::internal::CaptureStderr();
  log_options options;
  options.level = "warn";
  options.asynchronous = false;
  setup_logging(options);
  access_entry e = generation_entry();
  e.status = 404;
  log_access(e);  // info: below warn
  e.status = 400;
  log_access(e);
  e.status = 500;
  log_access(e);
  std::vector<std::string> lines = lines_of(testing::internal::GetCapturedStderr());
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("error access:"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("\" 500 "), std::string::npos) << lines[0];
}

TEST(logging, early_json_lines_have_the_json_format_shape) {
  const boost::json::object line = boost::json::parse(early_json_line("critical", "config: \"x\"\n")).as_object();
  EXPECT_EQ(line.at("level"), "critical");
  EXPECT_EQ(line.at("logger"), "tessera");
  EXPECT_EQ(line.at("msg"), "config: \"x\"\n");
  EXPECT_EQ(line.at("time").as_string().back(), 'Z');
}

TEST(logging, bad_level_and_format_are_refused) {
  log_options options;
  options.level = "loud";
  EXPECT_THROW(setup_logging(options), std::invalid_argument);
  EXPECT_THROW(parse_log_format("xml"), std::invalid_argument);
  EXPECT_EQ(parse_log_format("json"), log_format::json);
}

}  // namespace
}  // namespace tessera::server
