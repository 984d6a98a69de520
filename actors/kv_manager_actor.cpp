// The KV manager actor: the read side of the KV block manager. The engine actor publishes each step's
// occupancy here; dashboards and /metrics query it, never the engine, so they cannot stall or race a
// step (see docs/architecture.md, "Why the KV block manager's mutations stay inside the step").
#include <caf/all.hpp>

#include "actors/runtime_actors.hpp"

namespace tessera::actors {

namespace {

struct kv_manager_state {
  occupancy_ptr latest;
  static inline const char* name = "kv_manager";
};

// The int is unused: CAF 0.17 spawns an argument-less function actor by binding a reference through a
// null shared_ptr<tuple<>> (init_fun_factory), which UBSan reports; one argument avoids that path.
caf::behavior kv_manager_behavior(caf::stateful_actor<kv_manager_state>* self, int /*unused*/) {
  return {
      [self](occupy_atom, const occupancy_ptr& occupancy) {
        // A snapshot without blocks keeps the previous block view (blocks are refreshed at a bounded rate).
        if (occupancy && !occupancy->blocks && self->state.latest && self->state.latest->blocks) {
          auto merged = std::make_shared<kv_occupancy>(*occupancy);
          merged->blocks = self->state.latest->blocks;
          merged->blocks_step = self->state.latest->blocks_step;
          self->state.latest = std::move(merged);
        } else {
          self->state.latest = occupancy;
        }
      },
      [self](query_atom) -> occupancy_ptr { return self->state.latest; },
      [self](query_atom, usage_atom) -> usage_report {
        usage_report r;
        if (const auto& l = self->state.latest) {
          r.device = l->device;
          r.host = l->host;
          r.step = l->step;
        }
        return r;
      },
  };
}

}  // namespace

caf::actor spawn_kv_manager_actor(caf::actor_system& sys) { return sys.spawn(kv_manager_behavior, 0); }

}  // namespace tessera::actors
