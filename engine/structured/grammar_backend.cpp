#include "engine/structured/grammar_backend.hpp"

#include <xgrammar/xgrammar.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/base/error.hpp"
#include "engine/structured/gbnf_compat.hpp"
#include "engine/structured/schema_check.hpp"
#include "engine/structured/token_table.hpp"

namespace tessera::structured {
namespace {

using clock_type = std::chrono::steady_clock;

// ---- one sequence's matcher ----------------------------------------------------------------------

// A DLTensor view of a packed mask (xgrammar's bitmask is int32 words, same bit layout as ours).
struct mask_view {
  int64_t shape[1];
  DLTensor tensor{};
  explicit mask_view(std::span<uint32_t> mask) : shape{static_cast<int64_t>(mask.size())} {
    tensor.data = mask.data();
    tensor.device = DLDevice{kDLCPU, 0};
    tensor.ndim = 1;
    tensor.dtype = DLDataType{kDLInt, 32, 1};
    tensor.shape = shape;
    tensor.strides = nullptr;
    tensor.byte_offset = 0;
  }
};

class xgrammar_constraint final : public token_constraint {
 public:
  xgrammar_constraint(xgrammar::GrammarMatcher matcher, std::shared_ptr<const std::vector<int32_t>> end_ids,
                      int32_t words)
      : matcher_(std::move(matcher)), end_ids_(std::move(end_ids)), words_(words) {}

  void fill_next_mask(std::span<uint32_t> mask) override {
    if (completion_mask_valid_) {  // is_complete() computed it already for this position
      std::copy(completion_mask_.begin(), completion_mask_.end(), mask.begin());
      return;
    }
    if (matcher_.IsTerminated()) {  // nothing may follow an accepted end token
      std::fill(mask.begin(), mask.end(), 0u);
      return;
    }
    mask_view view(mask);
    matcher_.FillNextTokenBitmask(&view.tensor);
  }

  bool accept(token_id token) override {
    if (!matcher_.AcceptToken(token)) return false;
    completion_mask_valid_ = false;
    ++accepted_;
    return true;
  }

  void rollback(int32_t num_tokens) override {
    if (num_tokens <= 0) return;
    if (num_tokens > accepted_) throw invalid_request("rollback of more tokens than were accepted");
    matcher_.Rollback(num_tokens);
    accepted_ -= num_tokens;
    completion_mask_valid_ = false;
  }

  int32_t num_accepted() const override { return accepted_; }

  // Complete when an end token was accepted, or the root rule is matched and the mask holds end
  // tokens only. The mask is computed here (on the engine's thread) only in that matched state, which
  // is rare for most grammars (the end of a JSON value); it is kept for the next fill_next_mask.
  bool is_complete() override {
    if (matcher_.IsTerminated()) return true;
    if (!matcher_.IsCompleted()) return false;
    if (!completion_mask_valid_) {
      completion_mask_.assign(static_cast<size_t>(words_), 0u);
      mask_view view(completion_mask_);
      matcher_.FillNextTokenBitmask(&view.tensor);
      completion_mask_valid_ = true;
    }
    std::vector<uint32_t> rest = completion_mask_;
    for (int32_t id : *end_ids_) {
      if (id >= 0 && id / 32 < words_) rest[static_cast<size_t>(id / 32)] &= ~(1u << (id % 32));
    }
    return std::all_of(rest.begin(), rest.end(), [](uint32_t w) { return w == 0; });
  }

  std::unique_ptr<token_constraint> fork() const override {
    auto copy = std::make_unique<xgrammar_constraint>(matcher_.Fork(), end_ids_, words_);
    copy->accepted_ = accepted_;
    copy->completion_mask_ = completion_mask_;
    copy->completion_mask_valid_ = completion_mask_valid_;
    return copy;
  }

 private:
  xgrammar::GrammarMatcher matcher_;
  std::shared_ptr<const std::vector<int32_t>> end_ids_;
  int32_t words_ = 0;
  int32_t accepted_ = 0;
  std::vector<uint32_t> completion_mask_;
  bool completion_mask_valid_ = false;
};

class xgrammar_compiled final : public compiled_constraint {
 public:
  xgrammar_compiled(xgrammar::CompiledGrammar grammar, std::shared_ptr<const std::vector<int32_t>> end_ids,
                    int32_t words)
      : grammar_(std::move(grammar)), end_ids_(std::move(end_ids)), words_(words), bytes_(grammar_.MemorySizeBytes()) {}

  std::unique_ptr<token_constraint> start() const override {
    return std::make_unique<xgrammar_constraint>(xgrammar::GrammarMatcher(grammar_, *end_ids_), end_ids_, words_);
  }
  size_t memory_bytes() const override { return bytes_; }

 private:
  xgrammar::CompiledGrammar grammar_;
  std::shared_ptr<const std::vector<int32_t>> end_ids_;
  int32_t words_ = 0;
  size_t bytes_ = 0;
};

// ---- threads -----------------------------------------------------------------------------------------

// A fixed set of threads running queued tasks in order.
class worker_pool {
 public:
  explicit worker_pool(int32_t n) {
    for (int32_t i = 0; i < std::max(n, 1); ++i) threads_.emplace_back([this] { run(); });
  }
  ~worker_pool() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  void post(std::function<void()> task) {
    {
      std::lock_guard lock(mutex_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
  }
  size_t size() const { return threads_.size(); }

 private:
  void run() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
        if (tasks_.empty()) return;  // stopping, and nothing left
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

// ---- the backend -------------------------------------------------------------------------------------

std::string quote_ebnf(std::string_view text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02X", c);
      out += hex;
    } else {
      out += static_cast<char>(c);  // UTF-8 passes through: the grammar reads code points
    }
  }
  return out + "\"";
}

// The cache key: everything that changes the compiled grammar.
std::string cache_key(const structured_output_spec& spec, bool any_whitespace) {
  std::string key;
  key += static_cast<char>(spec.type);
  key += spec.strict ? '1' : '0';
  key += any_whitespace ? '1' : '0';
  key += spec.source;
  for (const std::string& c : spec.choices) {
    key += '\0';
    key += std::to_string(c.size());
    key += ':';
    key += c;
  }
  return key;
}

class grammar_backend final : public constraint_backend {
 public:
  grammar_backend(const tokenizer& tok, int32_t vocab_size, const grammar_options& options)
      : options_(options), words_(token_mask_words(vocab_size)) {
    token_table table = make_token_table(tok, vocab_size);
    end_ids_ = std::make_shared<const std::vector<int32_t>>(table.end_ids);
    xgrammar::TokenizerInfo info(table.pieces, xgrammar::VocabType::RAW, vocab_size, table.end_ids,
                                 table.add_prefix_space);
    const int32_t hw = static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
    // xgrammar's own cache stays off: ours is keyed by the whole spec, bounded, and caches failures.
    compiler_.emplace(info, /*max_threads=*/std::max(1, hw / 2), /*cache_enabled=*/false);
    const int32_t mask_threads = options.num_mask_threads > 0 ? options.num_mask_threads : std::clamp(hw / 2, 1, 4);
    masks_ = std::make_unique<worker_pool>(mask_threads);
    compiles_ = std::make_unique<worker_pool>(std::max(1, options.num_compile_threads));
    watchdog_ = std::thread([this] { watch_deadlines(); });
  }

  ~grammar_backend() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    deadline_cv_.notify_all();
    watchdog_.join();
    compiles_.reset();  // finishes what is queued: every waiter hears back
    masks_.reset();
  }

  void compile_async(const structured_output_spec& spec, std::function<void(compile_result)> done) override {
    const auto named = [&spec](const std::string& what) { return "'" + spec.field + "': " + what; };
    try {
      precheck(spec);
    } catch (const std::exception& e) { return done({nullptr, named(e.what())}); }
    std::string key = cache_key(spec, options_.any_whitespace);
    const uint64_t hash = XXH3_64bits(key.data(), key.size());
    std::unique_lock lock(mutex_);
    if (cache_entry* hit = find_cached(hash, key)) {
      compile_result r;
      r.compiled = hit->compiled;
      r.error = hit->error;
      r.cache_hit = true;
      lock.unlock();
      return done(std::move(r));
    }
    if (auto it = in_flight_.find(hash); it != in_flight_.end() && it->second->key == key) {
      it->second->waiters.push_back(std::move(done));
      return;
    }
    if (std::ssize(in_flight_) >= options_.max_pending_compiles) {
      lock.unlock();
      return done({nullptr, named("too many grammars are being compiled; try again later")});
    }
    auto job = std::make_shared<compile_job>();
    job->spec = spec;
    job->key = std::move(key);
    job->hash = hash;
    job->deadline = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(
                                            std::chrono::duration<double>(options_.max_compile_seconds));
    job->waiters.push_back(std::move(done));
    in_flight_[hash] = job;
    lock.unlock();
    deadline_cv_.notify_all();
    compiles_->post([this, job] { run_compile(job); });
  }

  std::shared_future<void> fill_masks(std::vector<mask_job> jobs) override {
    auto batch = std::make_shared<mask_batch>();
    batch->jobs = std::move(jobs);
    std::shared_future<void> ready = batch->done.get_future().share();
    if (batch->jobs.empty()) {
      batch->done.set_value();
      return ready;
    }
    batch->remaining = batch->jobs.size();
    // Each worker takes the next unfilled mask until none is left: sequences whose masks are costly
    // do not hold up the others.
    const size_t drains = std::min(masks_->size(), batch->jobs.size());
    for (size_t i = 0; i < drains; ++i) masks_->post([batch] { drain(*batch); });
    return ready;
  }

 private:
  struct cache_entry {
    std::string key;
    std::shared_ptr<const compiled_constraint> compiled;
    std::string error;
    size_t bytes = 0;
    std::list<uint64_t>::iterator lru;
  };
  struct compile_job {
    structured_output_spec spec;
    std::string key;
    uint64_t hash = 0;
    clock_type::time_point deadline;
    std::vector<std::function<void(compile_result)>> waiters;
    bool answered = false;  // by the compile or by the deadline, whichever came first
  };
  struct mask_batch {
    std::vector<mask_job> jobs;
    std::atomic<size_t> next{0};
    std::atomic<size_t> remaining{0};
    std::promise<void> done;
  };

  static void drain(mask_batch& b) {
    for (size_t i = b.next.fetch_add(1); i < b.jobs.size(); i = b.next.fetch_add(1)) {
      const mask_job& j = b.jobs[i];
      try {
        j.constraint->fill_next_mask(j.mask);
      } catch (...) {
        // A matcher that throws allows nothing: the sampler's fallback token is then rejected by
        // accept() and the sequence fails with an error, never with output outside its grammar.
        std::fill(j.mask.begin(), j.mask.end(), 0u);
      }
      if (b.remaining.fetch_sub(1) == 1) b.done.set_value();
    }
  }

  // Cheap checks on the calling thread, before anything is queued.
  void precheck(const structured_output_spec& spec) const {
    if (spec.type == structured_output_spec::kind::json_schema) {
      check_json_schema(spec.source, {spec.strict, options_.max_schema_depth});
    }
  }

  xgrammar::CompiledGrammar compile_now(const structured_output_spec& spec) {
    using kind = structured_output_spec::kind;
    const std::optional<std::pair<std::string, std::string>> separators =
        options_.any_whitespace ? std::nullopt : std::optional(std::pair<std::string, std::string>(", ", ": "));
    switch (spec.type) {
      case kind::json_object:
        return compiler_->CompileJSONSchema(R"({"type": "object"})", options_.any_whitespace, std::nullopt, separators,
                                            /*strict_mode=*/false);
      case kind::json_schema:
        // strict_mode: properties and items the schema does not name are not generated (OpenAI's
        // additionalProperties: false), whatever the request's strict flag (which governs keywords).
        return compiler_->CompileJSONSchema(spec.source, options_.any_whitespace, std::nullopt, separators,
                                            /*strict_mode=*/true);
      case kind::regex: return compiler_->CompileRegex(spec.source);
      case kind::choice: return compiler_->CompileGrammar(choice_grammar(spec.choices), "root");
      case kind::grammar: return compiler_->CompileGrammar(fill_empty_alternatives(spec.source), "root");
      case kind::structural_tag: return compiler_->CompileStructuralTag(spec.source);
    }
    throw invalid_request("unknown structured output kind");
  }

  void run_compile(const std::shared_ptr<compile_job>& job) {
    const auto t0 = clock_type::now();
    compile_result r;
    {
      std::lock_guard lock(mutex_);
      if (job->answered) return;  // timed out while queued
    }
    try {
      xgrammar::CompiledGrammar g = compile_now(job->spec);
      r.compiled = std::make_shared<xgrammar_compiled>(std::move(g), end_ids_, words_);
    } catch (const std::exception& e) {
      r.error = "'" + job->spec.field + "': " + describe_failure(job->spec, e.what());
    }
    const auto finished = clock_type::now();
    r.seconds = std::chrono::duration<double>(finished - t0).count();
    if (finished > job->deadline) {
      // Past the bound, whether or not the watchdog has woken up yet: the bound does not depend on
      // thread scheduling, and a spec that is too slow is refused every time.
      r.compiled = nullptr;
      r.error = time_bound_error(job->spec);
    }
    std::vector<std::function<void(compile_result)>> waiters;
    {
      std::lock_guard lock(mutex_);
      if (!job->answered) {
        job->answered = true;
        waiters = std::move(job->waiters);
        remember(job->hash, job->key, r.compiled, r.error);
      }
      if (auto it = in_flight_.find(job->hash); it != in_flight_.end() && it->second == job) in_flight_.erase(it);
    }
    for (auto& w : waiters) w(r);
  }

  static std::string describe_failure(const structured_output_spec& spec, std::string what) {
    // xgrammar's messages can carry a trailing newline and start with a timestamp and its own source
    // location ("[15:26:38] /path/grammar_parser.cc:820: EBNF parser error at ..."): keep the message.
    if (auto nl = what.find('\n'); nl != std::string::npos) what.resize(nl);
    if (!what.empty() && what.front() == '[') {
      if (auto end = what.find("] "); end != std::string::npos) what.erase(0, end + 2);
      if (auto cc = what.find(".cc:"); cc != std::string::npos && cc < what.find(' ')) {
        if (auto colon = what.find(": ", cc); colon != std::string::npos) what.erase(0, colon + 2);
      }
    }
    using kind = structured_output_spec::kind;
    switch (spec.type) {
      case kind::json_object:
      case kind::json_schema: return "invalid JSON schema: " + what;
      case kind::regex: return "the regular expression does not compile: " + what;
      case kind::choice: return "the choices do not compile: " + what;
      case kind::grammar: return "the grammar does not parse: " + what;
      case kind::structural_tag: return "invalid structural tag: " + what;
    }
    return what;
  }

  std::string time_bound_error(const structured_output_spec& spec) const {
    char text[160];
    std::snprintf(text, sizeof text, "compiling the grammar took longer than %.3g s (the bound)",
                  options_.max_compile_seconds);
    return "'" + spec.field + "': " + text;
  }

  // The deadline of every compile in flight: past it, its waiters get an error now and the spec is
  // remembered as too slow; the compile itself runs to its end on its worker (xgrammar cannot be
  // interrupted) and is then discarded.
  void watch_deadlines() {
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      auto next = clock_type::time_point::max();
      const auto now = clock_type::now();
      std::vector<std::pair<std::vector<std::function<void(compile_result)>>, std::string>> expired;
      for (auto it = in_flight_.begin(); it != in_flight_.end();) {
        compile_job& job = *it->second;
        if (!job.answered && job.deadline <= now) {
          job.answered = true;
          const std::string error = time_bound_error(job.spec);
          remember(job.hash, job.key, nullptr, error);
          expired.emplace_back(std::move(job.waiters), error);
          it = in_flight_.erase(it);
          continue;
        }
        next = std::min(next, job.deadline);
        ++it;
      }
      if (!expired.empty()) {
        lock.unlock();
        for (auto& [waiters, error] : expired) {
          for (auto& w : waiters) w({nullptr, error});
        }
        lock.lock();
        continue;
      }
      if (next == clock_type::time_point::max()) {
        deadline_cv_.wait(lock);
      } else {
        deadline_cv_.wait_until(lock, next);
      }
    }
  }

  // ---- the LRU cache (under mutex_) ----

  cache_entry* find_cached(uint64_t hash, const std::string& key) {
    auto it = cache_.find(hash);
    if (it == cache_.end() || it->second.key != key) return nullptr;
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    return &it->second;
  }

  void remember(uint64_t hash, const std::string& key, std::shared_ptr<const compiled_constraint> compiled,
                const std::string& error) {
    if (auto old = cache_.find(hash); old != cache_.end()) {
      cache_bytes_ -= old->second.bytes;
      lru_.erase(old->second.lru);
      cache_.erase(old);
    }
    cache_entry e;
    e.key = key;
    e.bytes = key.size() + error.size() + (compiled ? compiled->memory_bytes() : 0);
    e.compiled = std::move(compiled);
    e.error = error;
    lru_.push_front(hash);
    e.lru = lru_.begin();
    cache_bytes_ += e.bytes;
    cache_.emplace(hash, std::move(e));
    while (!lru_.empty() && (std::ssize(cache_) > options_.max_cached_grammars ||
                             static_cast<int64_t>(cache_bytes_) > options_.max_cache_bytes)) {
      auto victim = cache_.find(lru_.back());
      cache_bytes_ -= victim->second.bytes;
      cache_.erase(victim);
      lru_.pop_back();
    }
  }

  grammar_options options_;
  int32_t words_ = 0;
  std::shared_ptr<const std::vector<int32_t>> end_ids_;
  std::optional<xgrammar::GrammarCompiler> compiler_;

  std::mutex mutex_;
  std::condition_variable deadline_cv_;
  bool stopping_ = false;
  std::unordered_map<uint64_t, cache_entry> cache_;
  std::list<uint64_t> lru_;  // most recently used first
  size_t cache_bytes_ = 0;
  std::unordered_map<uint64_t, std::shared_ptr<compile_job>> in_flight_;

  std::thread watchdog_;
  std::unique_ptr<worker_pool> compiles_;
  std::unique_ptr<worker_pool> masks_;
};

}  // namespace

std::string choice_grammar(const std::vector<std::string>& choices) {
  std::string g = "root ::= ";
  for (size_t i = 0; i < choices.size(); ++i) {
    if (i > 0) g += " | ";
    g += choices[i].empty() ? std::string("\"\"") : quote_ebnf(choices[i]);
  }
  return g + "\n";
}

std::shared_ptr<constraint_backend> make_grammar_backend(const tokenizer& tok, int32_t vocab_size,
                                                         const grammar_options& options) {
  if (vocab_size < static_cast<int32_t>(tok.vocab_size())) {
    throw invalid_request("make_grammar_backend: vocab_size " + std::to_string(vocab_size) +
                          " is below the tokenizer's " + std::to_string(tok.vocab_size()));
  }
  return std::make_shared<grammar_backend>(tok, vocab_size, options);
}

}  // namespace tessera::structured
