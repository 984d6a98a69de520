// The server's Prometheus metrics: request outcomes and latency histograms recorded by the sessions,
// plus the engine's gauges and counters read from the facade at scrape time. Thread-safe.
//
// Two sets of names (docs/server.md#metrics): Tessera's own (`tessera_...`, what the dashboard and
// the tests read), and vLLM's names with the `tessera:` prefix and a `model_name` label (the same
// quantities, so Grafana boards made for vLLM switch by replacing `vllm:` with `tessera:`).
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "actors/engine_facade.hpp"
#include "server/prometheus_text.hpp"

namespace tessera::server {

// A cumulative histogram with fixed upper bounds (Prometheus "le" buckets).
class histogram {
 public:
  explicit histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double value);
  // The family `name` with its buckets, sum and count.
  void write(prometheus_text& out, std::string_view name, std::string_view help) const;
  uint64_t count() const;

 private:
  mutable std::mutex mutex_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // last: +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

// Why the server closed a connection itself (besides answering and the client leaving).
enum class close_reason : uint8_t {
  write_timeout,    // no write progress for --write-timeout: a client that does not read
  read_timeout,     // a request not complete within --request-timeout (slow loris)
  pipeline_flood,   // pipelined bytes beyond the read buffer while a request ran
  ws_auth_timeout,  // a WebSocket that did not authenticate in time
  ws_slow_reader,   // a WebSocket whose send queue reached ws_max_queued_messages
  internal_error,   // an exception from a handler (logged)
};
constexpr size_t num_close_reasons = 6;
std::string_view to_string(close_reason r);

enum class connection_kind : uint8_t { http, websocket };

// One finished generation's numbers for the per-request histograms (request_phases: -1 = did not happen).
struct finished_request {
  double e2e_seconds = 0;
  double queue_seconds = -1, prefill_seconds = -1, decode_seconds = -1;
  int32_t prompt_tokens = 0, generation_tokens = 0;
};

class server_metrics {
 public:
  server_metrics();
  void record_closed(close_reason reason);
  void record_exception() { exceptions_.fetch_add(1, std::memory_order_relaxed); }
  void connection_opened(connection_kind k) { open_[static_cast<size_t>(k)].fetch_add(1, std::memory_order_relaxed); }
  void connection_closed(connection_kind k) { open_[static_cast<size_t>(k)].fetch_sub(1, std::memory_order_relaxed); }
  int64_t connections_open(connection_kind k) const { return open_[static_cast<size_t>(k)].load(); }
  uint64_t closed(close_reason r) const { return closed_[static_cast<size_t>(r)].load(); }
  void record_finish(finish_reason reason);
  void record_rejected(int status);
  void record_http(int status);
  // At a generation's first token (not at its end: a long stream shows its TTFT while it runs).
  void observe_ttft(double s) { ttft_.observe(s); }
  void observe_itl(double s) { itl_.observe(s); }
  void observe_finished(const finished_request& r);
  uint64_t num_ttft_observed() const { return ttft_.count(); }
  // Prometheus text exposition format 0.0.4; `model_name` labels the vLLM-style set.
  std::string render(const actors::engine_facade& engine, const std::string& model_name = "") const;

 private:
  void render_vllm_names(prometheus_text& out, const actors::facade_stats& s, const std::string& model_name) const;
  void write_finished(prometheus_text& out, const char* name) const;  // request_success_total{finished_reason}

  std::array<std::atomic<uint64_t>, 5> finished_{};  // by finish_reason
  std::atomic<uint64_t> rejected_429_{0}, rejected_503_{0};
  std::array<std::atomic<uint64_t>, 6> http_by_class_{};  // 1xx..5xx, index = status / 100
  std::array<std::atomic<uint64_t>, num_close_reasons> closed_{};
  std::array<std::atomic<int64_t>, 2> open_{};  // by connection_kind
  std::atomic<uint64_t> exceptions_{0};
  histogram ttft_, itl_, e2e_;
  histogram queue_, prefill_, decode_;           // request phases (seconds)
  histogram prompt_tokens_, generation_tokens_;  // per request
};

// Counts one open connection of its kind in the metrics for as long as it lives (a session member).
class connection_gauge {
 public:
  connection_gauge(server_metrics& m, connection_kind k) : metrics_(&m), kind_(k) { m.connection_opened(k); }
  ~connection_gauge() { metrics_->connection_closed(kind_); }
  connection_gauge(const connection_gauge&) = delete;
  connection_gauge& operator=(const connection_gauge&) = delete;

 private:
  server_metrics* metrics_;
  connection_kind kind_;
};

}  // namespace tessera::server
