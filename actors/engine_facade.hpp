// The engine as the server and the CLI see it: a plain C++ object that owns an actor system running
// the tokenizer pool, the engine actor (which runs the scheduler), the executor, the KV manager and the
// event bus actors.
//
//   engine_facade engine(std::move(components), options);      // throws load_error / invalid_request
//   submit_result r = engine.submit(prompt_input::from_text("Hello"), params);
//   if (!r) report(r.message);                                  // overloaded, unhealthy, invalid, ...
//   while (auto item = r.stream.next())                         // deltas, then exactly one final
//     ...
//
// Thread-safe: any thread may submit, abort, read stats or health (not concurrently with shutdown()
// or destruction). Streams are single-consumer; handles must not outlive the facade.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/fault_injection.hpp"
#include "actors/messages.hpp"
#include "actors/stream_buffer.hpp"
#include "engine/executor.hpp"
#include "engine/llm_engine.hpp"
#include "engine/text/chat_template.hpp"
#include "engine/text/tokenizer.hpp"

namespace tessera::actors {

struct runtime_shared;
struct facade_internals;

struct facade_options {
  engine_options engine;
  int32_t max_waiting = 256;                         // queued (submitted, not yet running) requests; beyond: overloaded
  int32_t max_buffered_deltas = 256;                 // per stream; beyond, new deltas merge into buffered ones
  int32_t num_tokenizer_actors = 0;                  // 0: one per 4 cores, 1..4
  int32_t num_caf_threads = 0;                       // CAF's cooperative scheduler threads; 0: min(cores, 4)
  std::chrono::milliseconds shutdown_timeout{5000};  // running requests may finish this long, then abort
  bool warm_up = false;                              // run one 1-token request before the constructor returns
  double kv_snapshot_interval_seconds = 0.1;
};

// What the runtime runs. The executor moves into the executor actor.
struct facade_components {
  std::unique_ptr<executor> exec;
  std::shared_ptr<const tokenizer> tok;  // null: token-id prompts only, no text in outputs
  std::optional<chat_template> chat;     // absent: ChatML
  // Fault injection, for tests only (empty in production): a tokenizer actor asked to encode a prompt
  // for which this returns true exits without answering (see actors/fault_injection.hpp).
  tokenizer_fault tokenizer_exit_when;
};

// The consumer's side of one request's stream. Copyable; when the last copy is destroyed before the
// final message arrived, the request is aborted (its subscriber actor goes down).
class stream_handle {
 public:
  stream_handle() = default;
  ticket_id id() const { return id_; }
  bool valid() const { return buffer_ != nullptr; }

  // The next item, blocking up to `timeout`; nullopt on timeout or once the final was taken.
  std::optional<stream_item> next(std::chrono::milliseconds timeout = std::chrono::milliseconds::max());
  // Every item waiting now, in order, without blocking; with on_ready, how a reader that must never
  // block (an I/O thread) consumes the stream.
  std::vector<stream_item> take_all();
  // `hook` is called on a CAF thread whenever items become available (coalesced: at most one call
  // outstanding until a read finds or leaves the buffer empty); see stream_buffer::on_ready for the
  // contract. An empty function removes it.
  void on_ready(std::function<void()> hook);
  // Drains the stream until the final message and returns it (deltas are appended to *deltas).
  stream_final wait(std::vector<stream_delta>* deltas = nullptr);
  // Asks the engine actor to abort the request; the stream still ends with its final message.
  void abort();

  struct guard;

 private:
  friend class engine_facade;
  ticket_id id_;
  std::shared_ptr<stream_buffer> buffer_;
  std::shared_ptr<guard> guard_;
};

enum class submit_error : uint8_t { none, overloaded, unhealthy, shutting_down, invalid };
std::string_view to_string(submit_error e);

struct submit_result {
  stream_handle stream;
  submit_error error = submit_error::none;
  std::string message;
  explicit operator bool() const { return error == submit_error::none; }
};

struct facade_stats {
  engine_stats engine;
  pool_usage device;
  pool_usage host;
  int32_t num_waiting = 0;  // engine's waiting queue after the last step
  int32_t num_running = 0;
  int32_t num_swapped = 0;
  int32_t num_queued = 0;  // submitted, not yet admitted (admission control counts these)
  int32_t num_open = 0;    // streams whose final message has not been sent
  uint64_t num_submitted = 0;
  uint64_t num_rejected = 0;  // overloaded / unhealthy / shutting down / invalid
  uint64_t num_completed = 0;
  uint64_t num_aborted = 0;
  uint64_t num_failed = 0;
  uint64_t num_tokenizer_restarts = 0;  // tokenizer actors that died and were replaced
};

// What tokenize_async() answers: the ids, or why there are none.
struct tokenize_result {
  std::vector<token_id> ids;
  std::string error;     // empty: ok
  bool refused = false;  // not tokenized at all: no tokenizer, or the runtime is shutting down
};

struct health_report {
  bool healthy = true;
  std::string message;  // why not
};

class engine_facade {
 public:
  engine_facade(facade_components components, facade_options options = {});
  ~engine_facade();  // shutdown() with options.shutdown_timeout, then destroys the actor system
  engine_facade(const engine_facade&) = delete;
  engine_facade& operator=(const engine_facade&) = delete;

  // Fails fast (no message round-trip) when the runtime is unhealthy, shutting down, more than
  // max_waiting requests are queued, or the sampling parameters are invalid. Everything else (prompt
  // too long, template errors) arrives as the stream's final message with reason error.
  submit_result submit(prompt_input prompt, const sampling_params& params, int32_t priority = 0);
  // An embedding request (llm_engine::add_embedding_request): the stream ends with a final whose
  // choices[0].embedding is the pooled vector. Refused at once as submit() is; a prompt the engine
  // refuses (empty, too long, an executor without hidden states) ends the stream with reason error.
  submit_result submit_embedding(prompt_input prompt, pooling_type pooling, int32_t priority = 0);
  // Aborts a request by id; unknown or finished ids are ignored.
  void abort(ticket_id id);

  // Tokenizes `prompt` on one of the tokenizer actors, exactly as submit() would (text: with the
  // vocabulary's BOS when prompt.add_special and the vocabulary asks for it; a conversation: rendered
  // with the chat template first), and calls `done` with the ids or the error, on that actor's thread
  // (or on the caller's, at once, when refused: no tokenizer, or shutting down). Never blocks: what a
  // server's I/O thread calls instead of encoding a megabyte of text itself. `done` must be quick
  // and must not block (hand the result to the caller's own thread).
  void tokenize_async(prompt_input prompt, std::function<void(tokenize_result)> done);

  // The longest sequence the engine admits: --max-model-len when set, else the model's context.
  int32_t max_model_len() const;

  // `callback` receives coalesced event batches on its own thread, at most max_rate_hz per second.
  void subscribe_events(std::function<void(const event_batch&)> callback, double max_rate_hz = 10.0);

  facade_stats stats() const;
  health_report health() const;
  // The KV manager's latest published occupancy (block view refreshed at a bounded rate); null
  // before the first step.
  occupancy_ptr kv_occupancy_snapshot() const;

  // Stops admitting, lets open requests finish for up to `timeout`, aborts the rest, then stops every
  // actor. Idempotent; the destructor calls it with options.shutdown_timeout.
  void shutdown(std::chrono::milliseconds timeout);
  void shutdown();

  const std::shared_ptr<const tokenizer>& tok() const { return tok_; }
  const model_config& config() const { return config_; }
  // The executor's KV cache element type ("fp16", ...; empty when it does not say) and block bytes.
  const std::string& kv_cache_dtype() const { return kv_cache_dtype_; }
  int64_t kv_block_bytes() const { return kv_block_bytes_; }

 private:
  // What submit and submit_embedding share once the request is valid: admission, the stream, the send.
  submit_result send_submit(prompt_input prompt, const sampling_params& params, int32_t priority, pooling_type pooling,
                            std::string invalid);
  std::unique_ptr<facade_internals> in_;
  std::shared_ptr<runtime_shared> shared_;
  std::shared_ptr<const tokenizer> tok_;
  model_config config_;
  std::string kv_cache_dtype_;
  int64_t kv_block_bytes_ = 0;
  facade_options options_;
};

}  // namespace tessera::actors
