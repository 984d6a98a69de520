#include "cpu/thread_pool.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace tessera::cpu {

namespace {

void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// Waiting escalates: spin (phases of a decode step are tens of microseconds apart), then yield
// (lets a descheduled peer run when cores are oversubscribed), then sleep on the futex (an idle
// server burns nothing). Spinning long is a loss on shared machines: a waiting thread then takes
// the core from the very thread it waits for.
constexpr int spin_rounds = 256;
constexpr int yield_rounds = 64;

template <class T, class Ready>
void wait_for(std::atomic<T>& word, T seen, Ready ready) {
  for (int i = 0; i < spin_rounds; ++i) {
    if (ready()) return;
    cpu_relax();
  }
  for (int i = 0; i < yield_rounds; ++i) {
    if (ready()) return;
    std::this_thread::yield();
  }
  while (!ready()) word.wait(seen, std::memory_order_acquire);
}

}  // namespace

thread_pool::thread_pool(int num_threads)
    : num_threads_(num_threads > 0 ? num_threads : static_cast<int>(std::thread::hardware_concurrency())) {
  if (num_threads_ < 1) num_threads_ = 1;
  workers_.reserve(static_cast<size_t>(num_threads_ - 1));
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

thread_pool::~thread_pool() {
  stop_.store(true, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void thread_pool::run_impl(job_fn fn, void* ctx) {
  if (num_threads_ == 1) {
    fn(ctx, 0);
    return;
  }
  fn_ = fn;
  ctx_ = ctx;
  pending_.store(num_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  fn(ctx, 0);
  for (;;) {
    const int left = pending_.load(std::memory_order_acquire);
    if (left == 0) break;
    wait_for(pending_, left, [&] { return pending_.load(std::memory_order_acquire) != left; });
  }
}

void thread_pool::worker_loop(int index) {
  uint32_t seen = 0;
  for (;;) {
    wait_for(generation_, seen, [&] { return generation_.load(std::memory_order_acquire) != seen; });
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load(std::memory_order_relaxed)) return;
    fn_(ctx_, index);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

void thread_pool::barrier_impl(idle_fn idle, void* idle_ctx) noexcept {
  if (num_threads_ == 1) return;
  const uint32_t gen = barrier_generation_.load(std::memory_order_acquire);
  if (barrier_count_.fetch_add(1, std::memory_order_acq_rel) == num_threads_ - 1) {
    barrier_count_.store(0, std::memory_order_relaxed);
    barrier_generation_.fetch_add(1, std::memory_order_release);
    barrier_generation_.notify_all();
    return;
  }
  auto released = [&] { return barrier_generation_.load(std::memory_order_acquire) != gen; };
  if (idle != nullptr) {
    while (!released() && idle(idle_ctx)) {}
  }
  wait_for(barrier_generation_, gen, released);
}

}  // namespace tessera::cpu
