// Per-operation GPU time of the executor's steps, for finding where a step's time goes on a real GPU
// (the CPU emulation's times mean nothing). Off unless TESSERA_CUDA_PROFILE=1; then every forward
// pass records a CUDA event after each operation, and at exit a table goes to stderr:
//   cuda profile <kind>: <op> <ms per step> (<share of the step's GPU time>)
// where kind is "decode" (every sequence has one new token) or "mixed". Events serialise nothing
// extra on the stream, but recording ~350 of them per step costs a little host time: profile, then
// measure without it.
#pragma once
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "gpu/cuda_check.hpp"

namespace tessera::gpu {

class op_profiler {
 public:
  op_profiler() {
    const char* env = std::getenv("TESSERA_CUDA_PROFILE");
    enabled_ = env != nullptr && env[0] == '1';
  }
  op_profiler(const op_profiler&) = delete;
  op_profiler& operator=(const op_profiler&) = delete;
  ~op_profiler() {
    report();
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }

  bool enabled() const { return enabled_; }

  // Starts a step's timeline on `stream`.
  void begin(cudaStream_t stream, bool decode_only) {
    if (!enabled_) return;
    used_ = 0;
    ops_.clear();
    kind_ = decode_only ? "decode" : "mixed";
    record(stream, nullptr);
    host_start_ = std::chrono::steady_clock::now();
  }
  // Marks the end of operation `op` (a string literal) on `stream`.
  void mark(cudaStream_t stream, const char* op) {
    if (enabled_ && used_ > 0) record(stream, op);
  }
  // After the stream was synchronised: adds the step's op times to the totals.
  void end_step() {
    if (!enabled_ || used_ < 2) return;
    stats& s = kinds_[kind_];
    for (size_t i = 1; i < used_; ++i) {
      float ms = 0.0f;
      CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i - 1], events_[i]));
      s.op_ms[ops_[i]] += ms;
      s.gpu_ms += ms;
    }
    s.host_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - host_start_).count();
    ++s.steps;
    used_ = 0;
  }

 private:
  struct stats {
    std::map<std::string, double> op_ms;
    double gpu_ms = 0.0, host_ms = 0.0;
    long steps = 0;
  };

  void record(cudaStream_t stream, const char* op) {
    if (used_ == events_.size()) {
      cudaEvent_t e = nullptr;
      CUDA_CHECK(cudaEventCreate(&e));
      events_.push_back(e);
    }
    CUDA_CHECK(cudaEventRecord(events_[used_], stream));
    ops_.push_back(op ? op : "");
    ++used_;
  }

  void report() const {
    for (const auto& [kind, s] : kinds_) {
      if (s.steps == 0) continue;
      std::fprintf(stderr, "cuda profile %s: %ld steps, GPU %.3f ms/step, execute() wall %.3f ms/step\n", kind.c_str(),
                   s.steps, s.gpu_ms / s.steps, s.host_ms / s.steps);
      for (const auto& [op, ms] : s.op_ms) {
        std::fprintf(stderr, "cuda profile %s: %-16s %8.3f ms/step (%4.1f%%)\n", kind.c_str(), op.c_str(), ms / s.steps,
                     s.gpu_ms > 0 ? 100.0 * ms / s.gpu_ms : 0.0);
      }
    }
  }

  bool enabled_ = false;
  std::vector<cudaEvent_t> events_;
  std::vector<std::string> ops_;
  size_t used_ = 0;
  std::string kind_;
  std::map<std::string, stats> kinds_;
  std::chrono::steady_clock::time_point host_start_;
};

}  // namespace tessera::gpu
