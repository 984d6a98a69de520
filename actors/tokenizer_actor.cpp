// The tokenizer actors (a pool, event-based): prompt text or conversation -> token ids, off the engine
// actor's thread, so a long prompt or a slow chat template never delays an engine step.
#include <caf/all.hpp>

#include <exception>

#include "actors/runtime_actors.hpp"

namespace tessera::actors {

namespace {

caf::behavior tokenizer_behavior(caf::event_based_actor* self, std::shared_ptr<const prompt_encoder> encoder) {
  (void)self;
  return {
      [encoder](encode_atom, const prompt_ptr& prompt) -> caf::result<std::vector<token_id>> {
        if (!prompt) return caf::make_error(caf::sec::invalid_argument, "no prompt");
        try {
          return encoder->encode(*prompt);
        } catch (const std::exception& e) {
          return caf::make_error(caf::sec::invalid_argument, std::string(e.what()));
        }
      },
  };
}

}  // namespace

caf::actor spawn_tokenizer_actor(caf::actor_system& sys, std::shared_ptr<const prompt_encoder> encoder) {
  return sys.spawn(tokenizer_behavior, std::move(encoder));
}

}  // namespace tessera::actors
