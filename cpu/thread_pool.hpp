// A persistent pool of worker threads for the CPU executor. `run` hands one job to every thread
// (the caller is thread 0) and returns when all have finished it; inside a job, threads meet at
// `barrier()` between the phases of a forward pass, so one step costs one wake-up, not one per
// matmul. Waiting spins briefly (phases are microseconds apart during decode) and then yields or
// sleeps, so an idle or oversubscribed pool does not burn cores.
#pragma once
#include <atomic>
#include <cstdint>
#include <thread>
#include <type_traits>
#include <vector>

namespace tessera::cpu {

class thread_pool {
 public:
  // num_threads <= 0: std::thread::hardware_concurrency().
  explicit thread_pool(int num_threads);
  ~thread_pool();
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  int size() const noexcept { return num_threads_; }

  // Calls job(i) on thread i for every i in [0, size()); returns when all calls have returned.
  // Not reentrant. The job must not throw.
  template <class F>
  void run(F&& job) {
    run_impl(&invoke<F>, &job);
  }

  // Every thread of the running job must call this the same number of times.
  void barrier() noexcept { barrier_impl(nullptr, nullptr); }

  // barrier(), but a thread that arrives early calls idle() (a short piece of work returning whether
  // there is more) until the others arrive or it returns false; then it waits as barrier() does.
  template <class Idle>
  void barrier(Idle&& idle) noexcept {
    barrier_impl(&call_idle<Idle>, &idle);
  }

 private:
  using job_fn = void (*)(void* ctx, int thread_index);
  using idle_fn = bool (*)(void* ctx);
  template <class F>
  static void invoke(void* ctx, int i) {
    (*static_cast<F*>(ctx))(i);
  }
  template <class F>
  static bool call_idle(void* ctx) {
    return (*static_cast<std::remove_reference_t<F>*>(ctx))();
  }
  void run_impl(job_fn fn, void* ctx);
  void barrier_impl(idle_fn idle, void* idle_ctx) noexcept;
  void worker_loop(int index);

  int num_threads_;
  std::vector<std::thread> workers_;
  job_fn fn_ = nullptr;
  void* ctx_ = nullptr;
  alignas(64) std::atomic<uint32_t> generation_{0};
  alignas(64) std::atomic<int> pending_{0};
  alignas(64) std::atomic<int> barrier_count_{0};
  alignas(64) std::atomic<uint32_t> barrier_generation_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace tessera::cpu
