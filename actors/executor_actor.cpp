// The executor actor (detached: compute never runs on one of CAF's cooperative threads) and its client
// side, the actor_executor adapter through which llm_engine calls it synchronously from the engine
// actor's thread.
#include <caf/all.hpp>

#include <exception>
#include <stdexcept>

#include "actors/runtime_actors.hpp"

namespace tessera::actors {

namespace {

caf::behavior executor_behavior(caf::event_based_actor* self, std::shared_ptr<executor> exec) {
  return {
      [self, exec](exec_atom, exec_job job) -> caf::result<done_atom> {
        try {
          switch (job.what) {
            case exec_job::phase::execute: exec->execute(*job.batch, *job.out); break;
            case exec_job::phase::submit: exec->submit(*job.batch); break;
            case exec_job::phase::wait: exec->wait(*job.out); break;
          }
          return done_atom_v;
        } catch (const std::exception& e) {
          auto err = caf::make_error(caf::sec::runtime_error, std::string("executor failed: ") + e.what());
          self->quit(err);
          return err;
        }
      },
  };
}

}  // namespace

caf::actor spawn_executor_actor(caf::actor_system& sys, std::shared_ptr<executor> exec) {
  return sys.spawn<caf::detached>(executor_behavior, std::move(exec));
}

// ---- actor_executor -----------------------------------------------------------------------------

struct actor_executor::blocking_self {
  explicit blocking_self(caf::actor_system& sys) : self(sys) {}
  caf::scoped_actor self;
};

actor_executor::actor_executor(caf::actor_system& sys, caf::actor exec_actor, const executor& metadata)
    : sys_(sys),
      actor_(std::move(exec_actor)),
      config_(metadata.config()),
      spec_(metadata.kv_spec()),
      block_bytes_(metadata.kv_block_bytes()),
      name_(metadata.name()),
      kv_dtype_(metadata.kv_cache_dtype()),
      samples_on_device_(metadata.samples_on_device()),
      overlaps_steps_(metadata.overlaps_steps()),
      takes_late_masks_(metadata.takes_late_masks()),
      reads_only_window_(metadata.reads_only_window()),
      verifies_token_trees_(metadata.verifies_token_trees()),
      pools_hidden_states_(metadata.pools_hidden_states()),
      scores_prompts_(metadata.scores_prompts()),
      groups_(metadata.kv_groups()) {}

actor_executor::~actor_executor() = default;

void actor_executor::execute(const step_batch& batch, step_output& out) {
  run({&batch, &out, exec_job::phase::execute});
}
void actor_executor::submit(const step_batch& batch) { run({&batch, nullptr, exec_job::phase::submit}); }
void actor_executor::wait(step_output& out) { run({nullptr, &out, exec_job::phase::wait}); }

// One job on the executor actor's thread, waited for: a submit returns once the step is queued on the
// device (overlapped steps), so the engine's thread plans the next step while the device runs it.
void actor_executor::run(const exec_job& job) {
  if (failed()) throw std::runtime_error(failure_);
  if (!self_) self_ = std::make_unique<blocking_self>(sys_);
  // infinite: the executor is local and either answers or goes down, and a down actor answers every
  // pending request with request_receiver_down at once.
  self_->self->request(actor_, caf::infinite, exec_atom_v, job)
      .receive([](done_atom) {},
               [this](caf::error& err) {
                 failure_ = sys_.render(err);
                 if (failure_.empty()) failure_ = "executor actor failed";
               });
  if (failed()) throw std::runtime_error(failure_);
}

}  // namespace tessera::actors
