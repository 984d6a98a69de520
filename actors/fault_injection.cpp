#include "actors/fault_injection.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <new>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "engine/base/error.hpp"

namespace tessera::actors {

namespace {

// Draw streams: one per kind of decision, so adding a tokenizer rate does not move executor faults.
constexpr uint64_t k_stream_executor = 1;
constexpr uint64_t k_stream_kind = 2;
constexpr uint64_t k_stream_tokenizer = 3;

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

[[noreturn]] void bad(std::string_view text, const std::string& why) {
  throw invalid_request("TESSERA_FAULT_INJECTION='" + std::string(text) + "': " + why +
                        " (expected SEED:RATE or seed=N,rate=P,kinds=throw+stall+stall_throw+bad_alloc,stall_ms=N,"
                        "after=N,at=N,tokenizer_exit=P)");
}

template <class T>
T parse_number(std::string_view all, std::string_view key, std::string_view value) {
  T out{};
  const char* end = value.data() + value.size();
  auto [ptr, ec] = std::from_chars(value.data(), end, out);
  if (ec != std::errc() || ptr != end)
    bad(all, "'" + std::string(key) + "' needs a number, got '" + std::string(value) + "'");
  return out;
}

double parse_rate(std::string_view all, std::string_view key, std::string_view value) {
  // from_chars for double is in GCC 11+; strtod would accept "0x1p-3" and leading spaces.
  const double r = parse_number<double>(all, key, value);
  if (!(r >= 0.0 && r <= 1.0)) bad(all, "'" + std::string(key) + "' must be a probability in [0, 1]");
  return r;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t end = s.find(sep, start);
    out.push_back(s.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return out;
}

}  // namespace

std::string_view to_string(executor_fault f) {
  switch (f) {
    case executor_fault::none: return "none";
    case executor_fault::throw_now: return "throw";
    case executor_fault::stall: return "stall";
    case executor_fault::stall_then_throw: return "stall_throw";
    case executor_fault::bad_alloc: return "bad_alloc";
  }
  return "unknown";
}

std::string fault_plan::describe() const {
  std::string kinds;
  for (auto [on, name] : {std::pair{throws, "throw"}, std::pair{stalls, "stall"},
                          std::pair{stall_throws, "stall_throw"}, std::pair{bad_allocs, "bad_alloc"}}) {
    if (!on) continue;
    if (!kinds.empty()) kinds += "+";
    kinds += name;
  }
  char text[320];
  std::snprintf(text, sizeof text,
                "seed %llu, executor faults %g per step (%s, stalls %lld ms, none in the first %lld)%s, "
                "a fraction %g of the prompts kill the tokenizer actor encoding them",
                static_cast<unsigned long long>(seed), executor_fault_rate, kinds.c_str(),
                static_cast<long long>(stall.count()), static_cast<long long>(after_calls),
                at_call > 0 ? (" and one at step " + std::to_string(at_call)).c_str() : "", tokenizer_exit_rate);
  return text;
}

fault_plan parse_fault_plan(std::string_view text) {
  fault_plan p;
  if (text.empty()) bad(text, "empty");
  if (text.find('=') == std::string_view::npos) {
    const size_t colon = text.find(':');
    if (colon == std::string_view::npos) bad(text, "no ':' or '='");
    p.seed = parse_number<uint64_t>(text, "seed", text.substr(0, colon));
    p.executor_fault_rate = parse_rate(text, "rate", text.substr(colon + 1));
    return p;
  }
  for (std::string_view item : split(text, ',')) {
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) bad(text, "'" + std::string(item) + "' is not key=value");
    const std::string_view key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "seed") {
      p.seed = parse_number<uint64_t>(text, key, value);
    } else if (key == "rate") {
      p.executor_fault_rate = parse_rate(text, key, value);
    } else if (key == "kinds") {
      p.throws = p.stalls = p.stall_throws = p.bad_allocs = false;
      for (std::string_view k : split(value, '+')) {
        if (k == "throw")
          p.throws = true;
        else if (k == "stall")
          p.stalls = true;
        else if (k == "stall_throw")
          p.stall_throws = true;
        else if (k == "bad_alloc")
          p.bad_allocs = true;
        else
          bad(text, "unknown fault kind '" + std::string(k) + "'");
      }
    } else if (key == "stall_ms") {
      const auto ms = parse_number<int64_t>(text, key, value);
      if (ms < 0 || ms > 600000) bad(text, "'stall_ms' must be in [0, 600000]");
      p.stall = std::chrono::milliseconds(ms);
    } else if (key == "after") {
      p.after_calls = parse_number<int64_t>(text, key, value);
      if (p.after_calls < 0) bad(text, "'after' must be >= 0");
    } else if (key == "at") {
      p.at_call = parse_number<int64_t>(text, key, value);
      if (p.at_call < 1) bad(text, "'at' must be >= 1 (the first execute() call is 1)");
    } else if (key == "tokenizer_exit") {
      p.tokenizer_exit_rate = parse_rate(text, key, value);
    } else {
      bad(text, "unknown key '" + std::string(key) + "'");
    }
  }
  if (p.faults_executor() && !p.throws && !p.stalls && !p.stall_throws && !p.bad_allocs)
    bad(text, "executor faults but no fault kind");
  return p;
}

double fault_draw(uint64_t seed, uint64_t stream, uint64_t index) {
  const uint64_t h = splitmix64(splitmix64(seed ^ (stream * 0xd1b54a32d192ed03ULL)) + index);
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

uint64_t prompt_hash(const prompt_input& p) {
  // FNV-1a over the kind and every byte that is encoded, with separators that cannot be confused.
  uint64_t h = 0xcbf29ce484222325ULL;
  auto mix = [&h](std::string_view bytes) {
    for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ULL;
    h = (h ^ 0xff) * 0x100000001b3ULL;
  };
  mix(std::string_view(p.type == prompt_input::kind::chat ? "chat" : "text"));
  mix(p.text);
  for (const chat_message& m : p.messages) {
    mix(m.role);
    mix(m.content);
  }
  return h;
}

tokenizer_fault make_tokenizer_fault(const fault_plan& plan) {
  if (plan.tokenizer_exit_rate <= 0) return {};
  // Keyed on the prompt, not on a counter: a drawn prompt kills every actor that encodes it, like
  // an input that trips a crash bug, and every other prompt is safe however often it is retried.
  // So the runtime's promise is testable exactly: only the poisoned prompts fail.
  return [seed = plan.seed, rate = plan.tokenizer_exit_rate](const prompt_input& p) {
    return fault_draw(seed, k_stream_tokenizer, prompt_hash(p)) < rate;
  };
}

fault_injecting_executor::fault_injecting_executor(std::unique_ptr<executor> inner, fault_plan plan,
                                                   schedule_fn schedule)
    : inner_(std::move(inner)), plan_(plan), schedule_(std::move(schedule)) {
  if (!inner_) throw invalid_request("fault_injecting_executor: no executor");
}

executor_fault fault_injecting_executor::drawn_fault(int64_t call) const {
  const auto index = static_cast<uint64_t>(call);
  const bool fixed = plan_.at_call > 0 && call == plan_.at_call;
  if (!fixed) {
    if (call <= plan_.after_calls || plan_.executor_fault_rate <= 0) return executor_fault::none;
    if (fault_draw(plan_.seed, k_stream_executor, index) >= plan_.executor_fault_rate) return executor_fault::none;
  }
  std::vector<executor_fault> kinds;
  if (plan_.throws) kinds.push_back(executor_fault::throw_now);
  if (plan_.stalls) kinds.push_back(executor_fault::stall);
  if (plan_.stall_throws) kinds.push_back(executor_fault::stall_then_throw);
  if (plan_.bad_allocs) kinds.push_back(executor_fault::bad_alloc);
  if (kinds.empty()) return executor_fault::none;
  const auto k = static_cast<size_t>(fault_draw(plan_.seed, k_stream_kind, index) * static_cast<double>(kinds.size()));
  return kinds[std::min(k, kinds.size() - 1)];
}

void fault_injecting_executor::execute(const step_batch& batch, step_output& out) {
  inject(batch);
  inner_->execute(batch, out);
}

void fault_injecting_executor::submit(const step_batch& batch) {
  inject(batch);
  inner_->submit(batch);
}

void fault_injecting_executor::inject(const step_batch& batch) {
  const int64_t call = num_calls_.fetch_add(1) + 1;
  const executor_fault f = schedule_ ? schedule_(call, batch) : drawn_fault(call);
  if (f == executor_fault::stall || f == executor_fault::stall_then_throw) {
    num_stalls_.fetch_add(1);
    std::this_thread::sleep_for(plan_.stall);
  }
  if (f == executor_fault::bad_alloc) {
    // What an executor whose allocation fails throws (a host vector, a device buffer wrapper): no
    // message of ours, so the error the client sees is the one such a real failure produces.
    num_throws_.fetch_add(1);
    throw std::bad_alloc();
  }
  if (f == executor_fault::throw_now || f == executor_fault::stall_then_throw) {
    num_throws_.fetch_add(1);
    throw std::runtime_error("fault injection: " + std::string(to_string(f)) + " at execute() call " +
                             std::to_string(call));
  }
}

}  // namespace tessera::actors
