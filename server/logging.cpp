#include "server/logging.hpp"

#include <spdlog/async.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <boost/json.hpp>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <future>
#include <memory>
#include <stdexcept>
#include <thread>

#include "engine/text/tokenizer.hpp"

namespace tessera::server {

namespace json = boost::json;

namespace {

constexpr std::string_view access_logger_name = "access";

// Set by setup_logging before the server's threads start; read-only while they run.
std::shared_ptr<spdlog::logger> g_access;
log_format g_format = log_format::text;
// The writer thread of the asynchronous loggers.
std::shared_ptr<spdlog::details::thread_pool> g_pool;

// `%*` in the json pattern: `"msg":"<escaped message>"`. The access logger's messages are already
// JSON members (`"msg":...,"method":...`, built by log_access) and are written as they are.
class json_message_flag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    if (msg.logger_name == access_logger_name) {
      dest.append(msg.payload.data(), msg.payload.data() + msg.payload.size());
      return;
    }
    const std::string text =
        json::serialize(json::string(sanitize_utf8(std::string(msg.payload.data(), msg.payload.size()))));
    dest.append(std::string_view("\"msg\":"));
    dest.append(text.data(), text.data() + text.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<json_message_flag>(); }
};

spdlog::level::level_enum parse_level(const std::string& text) {
  static const std::pair<const char*, spdlog::level::level_enum> levels[] = {
      {"trace", spdlog::level::trace},       {"debug", spdlog::level::debug},  {"info", spdlog::level::info},
      {"warn", spdlog::level::warn},         {"warning", spdlog::level::warn}, {"error", spdlog::level::err},
      {"critical", spdlog::level::critical}, {"off", spdlog::level::off}};
  for (const auto& [name, level] : levels) {
    if (text == name) return level;
  }
  throw std::invalid_argument("unknown log level '" + text + "' (trace, debug, info, warn, error, critical, off)");
}

std::unique_ptr<spdlog::formatter> make_formatter(log_format format) {
  if (format == log_format::text) {
    return std::make_unique<spdlog::pattern_formatter>("%Y-%m-%d %H:%M:%S.%e %^%-5l%$ %n: %v",
                                                       spdlog::pattern_time_type::local);
  }
  auto f = std::make_unique<spdlog::pattern_formatter>(spdlog::pattern_time_type::utc);
  f->add_flag<json_message_flag>('*').set_pattern(R"({"time":"%Y-%m-%dT%H:%M:%S.%fZ","level":"%l","logger":"%n",%*})");
  return f;
}

// A client-supplied path made safe for one log line: valid UTF-8, no control characters or quotes,
// bounded length.
std::string printable_path(std::string_view path) {
  constexpr size_t max_bytes = 256;
  std::string out = sanitize_utf8(std::string(path.substr(0, max_bytes)));
  for (char& c : out) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f || c == '"') c = '?';
  }
  if (path.size() > max_bytes) out += "...";
  return out;
}

}  // namespace

log_format parse_log_format(std::string_view text) {
  if (text == "text") return log_format::text;
  if (text == "json") return log_format::json;
  throw std::invalid_argument("unknown log format '" + std::string(text) + "' (text, json)");
}

void setup_logging(const log_options& options) {
  const spdlog::level::level_enum level = parse_level(options.level);
  spdlog::sink_ptr sink;
  if (options.format == log_format::text) {
    sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>(spdlog::color_mode::automatic);
  } else {
    sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  }
  sink->set_formatter(make_formatter(options.format));

  std::shared_ptr<spdlog::logger> main_logger, access;
  if (options.asynchronous) {
    // A terminal or pipe that stops reading must not stall the I/O threads: lines go through a queue
    // to one writer thread, and when the queue is full the oldest lines are dropped, not waited for.
    if (!g_pool) g_pool = std::make_shared<spdlog::details::thread_pool>(8192, 1);
    main_logger =
        std::make_shared<spdlog::async_logger>("tessera", sink, g_pool, spdlog::async_overflow_policy::overrun_oldest);
    access = std::make_shared<spdlog::async_logger>(std::string(access_logger_name), sink, g_pool,
                                                    spdlog::async_overflow_policy::overrun_oldest);
  } else {
    main_logger = std::make_shared<spdlog::logger>("tessera", sink);
    access = std::make_shared<spdlog::logger>(std::string(access_logger_name), sink);
  }
  main_logger->set_level(level);
  main_logger->flush_on(spdlog::level::trace);
  access->set_level(options.access_log ? level : spdlog::level::off);
  access->flush_on(spdlog::level::trace);

  spdlog::drop_all();
  spdlog::set_default_logger(main_logger);
  g_access = access;
  g_format = options.format;
}

std::string format_access_text(const access_entry& e) {
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%.3fs", e.seconds);
  std::string line;
  line.reserve(160);
  line += e.peer.empty() ? std::string_view("-") : e.peer;
  line += " \"";
  line += e.method;
  line += ' ';
  line += printable_path(e.path);
  line += "\" ";
  line += std::to_string(e.status);
  line += ' ';
  line += seconds;
  line += " id=";
  line += e.request_id.empty() ? std::string_view("-") : e.request_id;
  if (e.prompt_tokens >= 0) line += " prompt_tokens=" + std::to_string(e.prompt_tokens);
  if (e.completion_tokens >= 0) line += " completion_tokens=" + std::to_string(e.completion_tokens);
  if (!e.outcome.empty()) {
    line += " finish=";
    line += e.outcome;
  }
  return line;
}

std::string early_json_line(std::string_view level, std::string_view message) {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm utc{};
  gmtime_r(&t, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &utc);
  const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() % 1000000;
  char fraction[16];
  std::snprintf(fraction, sizeof fraction, ".%06lldZ", static_cast<long long>(micros));
  json::object line{{"time", std::string(stamp) + fraction},
                    {"level", level},
                    {"logger", "tessera"},
                    {"msg", sanitize_utf8(std::string(message))}};
  return json::serialize(line);
}

void log_access(const access_entry& e) {
  const std::shared_ptr<spdlog::logger>& access = g_access;
  // A client's mistake (4xx) is news about the client, not a fault of the server: info, as every
  // other access line. A 5xx is the server failing a request: error, so alerts on error lines see it.
  const spdlog::level::level_enum level = e.status >= 500 ? spdlog::level::err : spdlog::level::info;
  if (!access || !access->should_log(level)) return;
  if (g_format == log_format::text) {
    access->log(level, format_access_text(e));
    return;
  }
  json::object fields{{"method", e.method},
                      {"path", printable_path(e.path)},
                      {"status", e.status},
                      {"duration_seconds", e.seconds},
                      {"request_id", e.request_id.empty() ? json::value(nullptr) : json::value(e.request_id)},
                      {"peer", e.peer}};
  if (e.prompt_tokens >= 0) fields["prompt_tokens"] = e.prompt_tokens;
  if (e.completion_tokens >= 0) fields["completion_tokens"] = e.completion_tokens;
  if (!e.outcome.empty()) fields["finish_reason"] = e.outcome;
  const std::string summary = std::string(e.method) + " " + printable_path(e.path) + " " + std::to_string(e.status);
  std::string members = json::serialize(fields);  // {"method":...}
  members.front() = ',';
  members.pop_back();
  const std::string payload = "\"msg\":" + json::serialize(json::string(summary)) + members;
  access->log(level, spdlog::string_view_t(payload.data(), payload.size()));
}

bool shutdown_logging(std::chrono::milliseconds max_wait) {
  // Releasing the loggers and the pool lets the writer thread write what is queued, then joins it. That
  // happens on a helper thread: a stderr nobody reads would block the join forever, and then we only
  // wait `max_wait` (the lines are lost with the process).
  std::shared_ptr<spdlog::details::thread_pool> pool = std::move(g_pool);
  std::shared_ptr<spdlog::logger> access = std::move(g_access);
  spdlog::drop_all();
  spdlog::set_default_logger(
      std::make_shared<spdlog::logger>("tessera", std::make_shared<spdlog::sinks::stderr_sink_mt>()));
  auto drained = std::make_shared<std::promise<void>>();
  std::future<void> done = drained->get_future();
  std::thread([pool = std::move(pool), access = std::move(access), drained]() mutable {
    access.reset();
    pool.reset();
    drained->set_value();
  }).detach();
  return done.wait_for(max_wait) == std::future_status::ready;
}

}  // namespace tessera::server
