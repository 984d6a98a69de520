// The stream sink: the facade's subscriber actor for one request, spawned by submit(). It moves the
// engine actor's delta/final messages into the request's stream_buffer (whose ready hook, if any,
// then runs on this actor's thread) and quits after the final. It monitors the engine actor, so a
// stream whose engine actor died still ends (with an error) instead of hanging.
#include <caf/all.hpp>

#include "actors/runtime_actors.hpp"
#include "actors/stream_buffer.hpp"

namespace tessera::actors {

namespace {

caf::behavior stream_sink(caf::event_based_actor* self, std::shared_ptr<stream_buffer> buffer, caf::actor_addr engine,
                          ticket_id ticket) {
  self->monitor(engine);
  self->set_down_handler([self, buffer, ticket](const caf::down_msg&) {
    stream_final f;
    f.ticket = ticket;
    f.reason = finish_reason::error;
    f.error = "engine scheduler stopped";
    buffer->push_final(f);
    self->quit();
  });
  return {
      [buffer](delta_atom, const delta_ptr& d) {
        if (d) buffer->push_delta(*d);
      },
      [self, buffer](final_atom, const final_ptr& f) {
        if (f) buffer->push_final(*f);
        self->quit();
      },
  };
}

}  // namespace

caf::actor spawn_stream_sink(caf::actor_system& sys, std::shared_ptr<stream_buffer> buffer, caf::actor_addr engine,
                             ticket_id ticket) {
  return sys.spawn(stream_sink, std::move(buffer), std::move(engine), ticket);
}

}  // namespace tessera::actors
