// The tokenizer actors (a pool, event-based, detached): prompt text or conversation -> token ids, off
// the engine actor's thread, so a long prompt or a slow chat template never delays an engine step.
// Detached, each on a thread of its own, as the executor actor is: encoding a megabyte prompt takes a
// second, and on CAF's cooperative threads a pool as large as the scheduler's (4 and 4 on 16 cores)
// held every thread that delivers stream deltas for that second (tests/actors/engine_facade_test.cpp,
// busy_tokenizers_never_hold_up_a_streams_deltas).
#include <caf/all.hpp>

#include <exception>

#include "actors/runtime_actors.hpp"

namespace tessera::actors {

namespace {

caf::behavior tokenizer_behavior(caf::event_based_actor* self, std::shared_ptr<const prompt_encoder> encoder,
                                 tokenizer_fault fault) {
  return {
      [self, encoder, fault](encode_atom, const prompt_ptr& prompt) -> caf::result<std::vector<token_id>> {
        if (!prompt) return caf::make_error(caf::sec::invalid_argument, "no prompt");
        if (fault && fault(*prompt)) {
          // Fault injection (tests only): the actor dies in the middle of this request, as a crash
          // would: it quits and never answers. CAF 0.17 has no broken-promise error, so the requester
          // learns it only from the down message of the actor it monitors (engine_actor.cpp).
          self->quit(caf::make_error(caf::sec::runtime_error, "fault injection: tokenizer actor exited mid-request"));
          return caf::delegated<std::vector<token_id>>{};
        }
        try {
          return encoder->encode(*prompt);
        } catch (const std::exception& e) { return caf::make_error(caf::sec::invalid_argument, std::string(e.what())); }
      },
  };
}

}  // namespace

caf::actor spawn_tokenizer_actor(caf::actor_system& sys, std::shared_ptr<const prompt_encoder> encoder,
                                 tokenizer_fault fault) {
  return sys.spawn<caf::detached>(tokenizer_behavior, std::move(encoder), std::move(fault));
}

}  // namespace tessera::actors
