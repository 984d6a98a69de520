#include "actors/stream_buffer.hpp"

#include <algorithm>

namespace tessera::actors {

stream_buffer::stream_buffer(size_t max_buffered_deltas)
    : max_buffered_deltas_(std::max<size_t>(1, max_buffered_deltas)) {}

stream_buffer::hook_ptr stream_buffer::due_hook() {
  if (!hook_ || hook_called_ || items_.empty()) return nullptr;
  hook_called_ = true;
  return hook_;
}

void stream_buffer::note_read() {
  if (items_.empty()) hook_called_ = false;
}

void stream_buffer::push_delta(const stream_delta& d) {
  hook_ptr hook;
  {
    std::lock_guard lock(mutex_);
    if (final_arrived_) return;
    bool merged = false;
    if (items_.size() >= max_buffered_deltas_) {
      for (auto it = items_.rbegin(); it != items_.rend(); ++it) {
        auto* old = std::get_if<stream_delta>(&*it);
        if (!old || old->output.index != d.output.index) continue;
        request_output& o = old->output;
        o.token_ids.insert(o.token_ids.end(), d.output.token_ids.begin(), d.output.token_ids.end());
        o.text += d.output.text;
        o.logprobs.insert(o.logprobs.end(), d.output.logprobs.begin(), d.output.logprobs.end());
        if (!d.output.prompt_logprobs.empty()) o.prompt_logprobs = d.output.prompt_logprobs;  // once per choice
        o.finished = d.output.finished;
        o.reason = d.output.reason;
        o.error = d.output.error;
        o.num_prompt_tokens = d.output.num_prompt_tokens;
        o.num_cached_prompt_tokens = d.output.num_cached_prompt_tokens;
        o.num_generated_tokens = d.output.num_generated_tokens;
        o.num_draft_tokens = d.output.num_draft_tokens;
        o.num_accepted_draft_tokens = d.output.num_accepted_draft_tokens;
        if (!d.output.timeline.empty()) o.timeline = d.output.timeline;
        old->seconds_since_submit = d.seconds_since_submit;
        merged = true;
        break;
      }
    }
    if (!merged) items_.emplace_back(d);
    hook = due_hook();
  }
  ready_.notify_all();
  if (hook) (*hook)();
}

void stream_buffer::push_final(const stream_final& f) {
  hook_ptr hook;
  {
    std::lock_guard lock(mutex_);
    if (final_arrived_) return;
    final_arrived_ = true;
    items_.emplace_back(f);
    hook = due_hook();
  }
  ready_.notify_all();
  if (hook) (*hook)();
}

std::optional<stream_item> stream_buffer::next(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  auto has_item = [&] { return !items_.empty() || final_taken_; };
  if (timeout == std::chrono::milliseconds::max())
    ready_.wait(lock, has_item);
  else if (!ready_.wait_for(lock, timeout, has_item))
    return std::nullopt;
  if (items_.empty()) {  // final already taken
    note_read();
    return std::nullopt;
  }
  stream_item item = std::move(items_.front());
  items_.pop_front();
  if (std::holds_alternative<stream_final>(item)) final_taken_ = true;
  note_read();
  return item;
}

std::vector<stream_item> stream_buffer::take_all() {
  std::vector<stream_item> out;
  bool took_final = false;
  {
    std::lock_guard lock(mutex_);
    out.reserve(items_.size());
    for (stream_item& item : items_) {
      took_final = took_final || std::holds_alternative<stream_final>(item);
      out.push_back(std::move(item));
    }
    items_.clear();
    if (took_final) final_taken_ = true;
    note_read();
  }
  // A reader blocked in next() on another thread (an odd mix, but allowed) must see the end too.
  if (took_final) ready_.notify_all();
  return out;
}

void stream_buffer::on_ready(std::function<void()> hook) {
  hook_ptr call;
  {
    std::lock_guard lock(mutex_);
    hook_ = hook ? std::make_shared<const std::function<void()>>(std::move(hook)) : nullptr;
    hook_called_ = false;
    call = due_hook();
  }
  if (call) (*call)();
}

bool stream_buffer::final_arrived() const {
  std::lock_guard lock(mutex_);
  return final_arrived_;
}

}  // namespace tessera::actors
