// The actor runtime's message vocabulary: atoms, payload types, CAF inspect() overloads and the type
// ID block. Every CAF-specific declaration of the protocol lives here so a CAF upgrade (0.17 -> 0.18+
// changes atoms, inspect and typed-actor syntax) touches one file. The protocol itself (who sends
// what to whom) is documented in docs/architecture.md and next to each actor's spawn function.
//
// Payloads that are large or only ever sent inside this process (request outputs, step records,
// batches) travel as std::shared_ptr<const T>, whitelisted with CAF_ALLOW_UNSAFE_MESSAGE_TYPE: CAF
// passes messages between local actors by reference count, so an immutable payload is never copied.
#pragma once
#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/type_id.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "actors/prompt_input.hpp"
#include "engine/executor.hpp"
#include "engine/llm_engine.hpp"
#include "engine/sampling_params.hpp"
#include "engine/step_record.hpp"
#include "engine/text/chat_template.hpp"

namespace tessera::actors {

// The runtime's id for one submitted request (assigned by the caller of submit, unique per runtime).
// It exists before the prompt is tokenized, so it differs from the engine's request_id.
using ticket_id = id_type<struct ticket_id_tag>;

using runtime_clock = std::chrono::steady_clock;

// engine actor <- client: one new request. `subscriber` receives the stream (delta_atom / final_atom).
struct submit_request {
  ticket_id ticket;
  prompt_input prompt;
  sampling_params params;
  int32_t priority = 0;
  // An embedding request (llm_engine::add_embedding_request) when not none; `params` is unused then.
  pooling_type pooling = pooling_type::none;
  runtime_clock::time_point submitted_at = runtime_clock::now();
};

// subscriber <- engine actor: one choice's news from one engine step (tokens in order, text, logprobs).
struct stream_delta {
  ticket_id ticket;
  request_output output;  // output.id is the engine's request id
  double seconds_since_submit = 0;
};

// One choice's end.
struct choice_result {
  int32_t index = 0;
  finish_reason reason = finish_reason::none;
  std::string error;
  int32_t num_generated_tokens = 0;
  int32_t num_draft_tokens = 0;  // speculative decoding: drafts verified, of which accepted
  int32_t num_accepted_draft_tokens = 0;
  std::vector<lifecycle_entry> timeline;
  std::vector<float> embedding;  // an embedding request's pooled vector (moved here from its output)
};

// subscriber <- engine actor: the one terminal message of a stream, after every delta.
struct stream_final {
  ticket_id ticket;
  request_id request;                          // 0 when the request never reached the engine
  finish_reason reason = finish_reason::none;  // error > abort > choice 0's reason
  std::string error;                           // reason == error: what failed
  // reason == error: the runtime failed (the executor, a tokenizer actor, shutdown), not the
  // request; with request == 0 the request was refused (prompt too long, template error) otherwise.
  bool runtime_fault = false;
  // A request refused before it reached the engine because of one of its fields (the grammar of
  // response_format does not compile, ...): that field, for the client's 400. Empty otherwise.
  std::string error_param;
  std::vector<choice_result> choices;
  int32_t num_prompt_tokens = 0;
  int32_t num_cached_prompt_tokens = 0;
  int32_t num_generated_tokens = 0;       // all choices
  int32_t num_draft_tokens = 0;           // speculative decoding, all choices: draft tokens verified
  int32_t num_accepted_draft_tokens = 0;  // of which the target accepted
  double seconds_to_first_token = -1;     // -1: no token was produced
  double seconds_total = 0;
};

// executor <- engine actor (request/reply): run one engine step's batch. The requester blocks until the
// reply, so the pointers stay valid for the whole execution; that is why the job is passed by
// pointer instead of by copy (no per-step copy of the batch or of the logits).
struct exec_job {
  const step_batch* batch = nullptr;
  step_output* out = nullptr;
  // execute: batch and out; submit (overlapped steps): batch; wait: out.
  enum class phase : uint8_t { execute, submit, wait } what = phase::execute;
};

// kv_manager <- engine actor, once per step: published occupancy. `blocks` is refreshed at a bounded
// rate (blocks_step says from which step it is); the pool usage is exact for `step`. `blocks` holds
// the device pool's blocks, then the host (swap) pool's (see scheduler::block_snapshot).
struct kv_occupancy {
  uint64_t step = 0;
  pool_usage device;
  pool_usage host;
  std::shared_ptr<const std::vector<block_info>> blocks;
  uint64_t blocks_step = 0;
};

struct bus_event {
  uint64_t step = 0;
  engine_event event;
};

// event sink <- event bus: everything since the subscriber's previous batch, coalesced. `latest` is
// the newest step record (latest wins: older records' occupancy is dropped), `events` every event of
// the coalesced steps in order, up to a bound beyond which they are counted in num_dropped_events.
struct event_batch {
  std::shared_ptr<const step_record> latest;
  std::vector<bus_event> events;
  uint64_t num_records = 0;  // step records coalesced into this batch
  uint64_t num_dropped_events = 0;
};

using submit_ptr = std::shared_ptr<const submit_request>;
using prompt_ptr = std::shared_ptr<const prompt_input>;
using delta_ptr = std::shared_ptr<const stream_delta>;
using final_ptr = std::shared_ptr<const stream_final>;
using record_ptr = std::shared_ptr<const step_record>;
using occupancy_ptr = std::shared_ptr<const kv_occupancy>;
using event_batch_ptr = std::shared_ptr<const event_batch>;
// engine actor <- a grammar compile worker: a submitted request's structured output, compiled.
using compiled_ptr = std::shared_ptr<const compile_result>;

// Small value messages are inspectable (0.17 signature) and carry type IDs.
struct usage_report {
  pool_usage device;
  pool_usage host;
  uint64_t step = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ticket_id& x) {
  return f(caf::meta::type_name("ticket_id"), x.value_ref());
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, usage_report& x) {
  return f(caf::meta::type_name("usage_report"), x.device.num_total, x.device.num_used, x.device.num_free,
           x.device.num_cached, x.host.num_total, x.host.num_used, x.host.num_free, x.host.num_cached, x.step);
}

// The engine actor's answer to status_atom: queue sizes and health, for probes that do not go through
// the facade.
struct runtime_status {
  bool healthy = true;
  std::string message;
  int32_t num_tickets = 0;  // requests with a stream still open
  int32_t num_waiting = 0;
  int32_t num_running = 0;
  uint64_t num_steps = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, runtime_status& x) {
  return f(caf::meta::type_name("runtime_status"), x.healthy, x.message, x.num_tickets, x.num_waiting, x.num_running,
           x.num_steps);
}

}  // namespace tessera::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::submit_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::prompt_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::delta_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::final_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::record_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::occupancy_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::event_batch_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::exec_job)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::compiled_ptr)

// Atom texts are at most 10 characters in CAF 0.17.
CAF_BEGIN_TYPE_ID_BLOCK(tessera_actors, caf::first_custom_type_id)
CAF_ADD_TYPE_ID(tessera_actors, (tessera::actors::ticket_id))
CAF_ADD_TYPE_ID(tessera_actors, (tessera::actors::usage_report))
CAF_ADD_TYPE_ID(tessera_actors, (tessera::actors::runtime_status))
CAF_ADD_ATOM(tessera_actors, tessera::actors, submit_atom, "submit")
CAF_ADD_ATOM(tessera_actors, tessera::actors, abort_atom, "abort")
CAF_ADD_ATOM(tessera_actors, tessera::actors, step_atom, "step")
CAF_ADD_ATOM(tessera_actors, tessera::actors, exec_atom, "exec")
CAF_ADD_ATOM(tessera_actors, tessera::actors, done_atom, "done")
CAF_ADD_ATOM(tessera_actors, tessera::actors, encode_atom, "encode")
CAF_ADD_ATOM(tessera_actors, tessera::actors, delta_atom, "delta")
CAF_ADD_ATOM(tessera_actors, tessera::actors, final_atom, "final")
CAF_ADD_ATOM(tessera_actors, tessera::actors, occupy_atom, "occupancy")
CAF_ADD_ATOM(tessera_actors, tessera::actors, query_atom, "query")
CAF_ADD_ATOM(tessera_actors, tessera::actors, publish_atom, "publish")
CAF_ADD_ATOM(tessera_actors, tessera::actors, subscribe_atom, "subscribe")
CAF_ADD_ATOM(tessera_actors, tessera::actors, events_atom, "events")
CAF_ADD_ATOM(tessera_actors, tessera::actors, ack_atom, "ack")
CAF_ADD_ATOM(tessera_actors, tessera::actors, flush_atom, "flush")
CAF_ADD_ATOM(tessera_actors, tessera::actors, status_atom, "status")
CAF_ADD_ATOM(tessera_actors, tessera::actors, abort_all_atom, "abort_all")
CAF_ADD_ATOM(tessera_actors, tessera::actors, stop_atom, "stop")
CAF_ADD_ATOM(tessera_actors, tessera::actors, usage_atom, "usage")
CAF_ADD_ATOM(tessera_actors, tessera::actors, compiled_atom, "compiled")
CAF_END_TYPE_ID_BLOCK(tessera_actors)
