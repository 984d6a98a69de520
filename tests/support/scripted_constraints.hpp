// A scripted stand-in for the grammar engine (engine/structured_output.hpp), for tests of the engine
// core and the executors without xgrammar: the "grammar" allows, at output position k, the tokens of
// script[k], and is complete after the last position (then only `end` is allowed). Masks are filled
// on a thread of their own, optionally late, as the real backend fills them while the forward pass runs.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "engine/structured_output.hpp"

namespace tessera::test_support {

using token_script = std::vector<std::vector<token_id>>;

class scripted_constraint final : public token_constraint {
 public:
  scripted_constraint(std::shared_ptr<const token_script> script, token_id end)
      : script_(std::move(script)), end_(end) {}
  void fill_next_mask(std::span<uint32_t> mask) override {
    std::fill(mask.begin(), mask.end(), 0u);
    const auto allow = [&](token_id t) { mask[static_cast<size_t>(t) / 32] |= 1u << (t % 32); };
    if (pos_ >= script_->size()) return allow(end_);
    for (token_id t : (*script_)[pos_]) allow(t);
  }
  bool accept(token_id token) override {
    if (pos_ >= script_->size()) return false;
    const auto& allowed = (*script_)[pos_];
    if (std::find(allowed.begin(), allowed.end(), token) == allowed.end()) return false;
    ++pos_;
    return true;
  }
  void rollback(int32_t n) override { pos_ -= static_cast<size_t>(n); }
  int32_t num_accepted() const override { return static_cast<int32_t>(pos_); }
  bool is_complete() override { return pos_ >= script_->size(); }
  std::unique_ptr<token_constraint> fork() const override { return std::make_unique<scripted_constraint>(*this); }

 private:
  std::shared_ptr<const token_script> script_;
  token_id end_ = 0;
  size_t pos_ = 0;
};

class scripted_compiled final : public compiled_constraint {
 public:
  explicit scripted_compiled(token_script script, token_id end = 0)
      : script_(std::make_shared<const token_script>(std::move(script))), end_(end) {}
  std::unique_ptr<token_constraint> start() const override {
    return std::make_unique<scripted_constraint>(script_, end_);
  }
  size_t memory_bytes() const override { return 0; }

 private:
  std::shared_ptr<const token_script> script_;
  token_id end_ = 0;
};

// compile_async answers with `compile(spec)`; fill_masks fills every mask on another thread after
// `mask_delay` (so an executor that reads a mask before waiting for masks_ready reads garbage).
class scripted_backend final : public constraint_backend {
 public:
  explicit scripted_backend(std::function<compile_result(const structured_output_spec&)> compile,
                            std::chrono::milliseconds mask_delay = std::chrono::milliseconds(0))
      : compile_(std::move(compile)), mask_delay_(mask_delay) {}
  void compile_async(const structured_output_spec& spec, std::function<void(compile_result)> done) override {
    ++compiles;
    done(compile_(spec));
  }
  std::shared_future<void> fill_masks(std::vector<mask_job> jobs) override {
    ++batches;
    masks += static_cast<int>(jobs.size());
    for (const mask_job& j : jobs) std::fill(j.mask.begin(), j.mask.end(), 0xA5A5A5A5u);  // not a mask yet
    return std::async(std::launch::async,
                      [jobs = std::move(jobs), delay = mask_delay_] {
                        std::this_thread::sleep_for(delay);
                        for (const mask_job& j : jobs) j.constraint->fill_next_mask(j.mask);
                      })
        .share();
  }
  std::atomic<int> compiles{0}, batches{0}, masks{0};

 private:
  std::function<compile_result(const structured_output_spec&)> compile_;
  std::chrono::milliseconds mask_delay_;
};

}  // namespace tessera::test_support
