// Process logging for `tessera serve` (spdlog, to stderr): the "tessera" logger for startup, warnings
// and errors, and the "access" logger with one line per HTTP request or WebSocket generation.
// Text lines are for people; `json` writes one JSON object per line for log collectors, with the
// access fields as separate members.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessera::server {

enum class log_format : uint8_t { text, json };

struct log_options {
  std::string level = "info";  // trace | debug | info | warn | error | critical | off
  log_format format = log_format::text;
  bool access_log = true;    // false: no per-request lines (the level still applies to the rest)
  bool asynchronous = true;  // lines are written by a background thread (see setup_logging)
};

// Installs the loggers (replacing spdlog's default logger with "tessera"). Throws std::invalid_argument
// for an unknown level. Call before the server's threads start; safe to call again after
// shutdown_logging. Asynchronous loggers queue lines for one writer thread and drop the oldest when
// 8192 are waiting, so a stderr nobody reads (a full pipe) slows no request.
void setup_logging(const log_options& options);

// Writes what is queued and stops the writer thread (call before exiting). Returns false when stderr
// did not take the lines within `max_wait`: the writer thread is then stuck in a write and holds
// stderr's lock, so the caller should leave with _Exit (a normal exit flushes stderr and would wait).
bool shutdown_logging(std::chrono::milliseconds max_wait = std::chrono::milliseconds(2000));

// Parses "text" / "json"; throws std::invalid_argument otherwise.
log_format parse_log_format(std::string_view text);

// One line of the json format ({"time", "level", "logger": "tessera", "msg"}) for a message written
// before setup_logging (a config file that does not parse), so that every line stays one JSON object.
std::string early_json_line(std::string_view level, std::string_view message);

// One finished HTTP request or WebSocket generation.
struct access_entry {
  std::string_view method;      // "GET", "POST", or "WS" for a generation on /v1/ws
  std::string_view path;        // without the query string; untrusted, sanitized when written
  int status = 0;               // HTTP status sent (a stream that was cut: 200 and outcome "abort")
  double seconds = 0;           // from the request's last byte read to its response's last byte queued
  std::string_view request_id;  // empty: none (routes that run no generation)
  std::string_view peer;        // client address
  std::string_view outcome;     // finish reason of a generation ("stop", "length", "abort", "error"); empty: none
  int64_t prompt_tokens = -1;   // -1: unknown / not a generation
  int64_t completion_tokens = -1;
};

void log_access(const access_entry& entry);

// The access log line in text form (what log_access writes after the time and level), for tests.
std::string format_access_text(const access_entry& entry);

}  // namespace tessera::server
