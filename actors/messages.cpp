// The type ID block of actors/messages.hpp, registered with an actor system configuration.
#include <caf/all.hpp>

#include "actors/runtime_actors.hpp"

namespace tessera::actors {

void add_message_types(caf::actor_system_config& cfg) { cfg.add_message_types<caf::id_block::tessera_actors>(); }

}  // namespace tessera::actors
