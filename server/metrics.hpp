// The server's Prometheus metrics: request outcomes and latency histograms recorded by the sessions,
// plus the engine's gauges and counters read from the facade at scrape time. Thread-safe.
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "actors/engine_facade.hpp"

namespace tessera::server {

// A cumulative histogram with fixed upper bounds (Prometheus "le" buckets).
class histogram {
 public:
  explicit histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double value);
  void write(std::string& out, const std::string& name, const std::string& help) const;

 private:
  mutable std::mutex mutex_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // last: +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class server_metrics {
 public:
  server_metrics();
  void record_finish(finish_reason reason);
  void record_rejected(int status);
  void record_http(int status);
  void observe_ttft(double s) { ttft_.observe(s); }
  void observe_itl(double s) { itl_.observe(s); }
  void observe_e2e(double s) { e2e_.observe(s); }
  // Prometheus text exposition format 0.0.4.
  std::string render(const actors::engine_facade& engine) const;

 private:
  std::array<std::atomic<uint64_t>, 5> finished_{};  // by finish_reason
  std::atomic<uint64_t> rejected_429_{0}, rejected_503_{0};
  std::array<std::atomic<uint64_t>, 6> http_by_class_{};  // 1xx..5xx, index = status / 100
  histogram ttft_, itl_, e2e_;
};

}  // namespace tessera::server
