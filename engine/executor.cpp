#include "engine/executor.hpp"

#include <stdexcept>
#include <string>

#include "engine/base/error.hpp"

namespace tessera {

// Only an executor that overlaps_steps() is ever handed a step this way (llm_engine checks).
void executor::submit(const step_batch&) {
  throw std::logic_error(std::string(name()) + " executor: submit() without overlapped steps");
}
void executor::wait(step_output&) {
  throw std::logic_error(std::string(name()) + " executor: wait() without overlapped steps");
}

void check_block_moves(const step_batch& batch, const kv_cache_spec& spec, const char* executor_name) {
  auto check = [&](const std::vector<block_copy>& moves, int32_t src_limit, int32_t dst_limit, const char* what) {
    for (const block_copy& c : moves) {
      if (c.src < 0 || c.src >= src_limit || c.dst < 0 || c.dst >= dst_limit) {
        throw invalid_request(std::string(executor_name) + " executor: " + what + " block id out of range");
      }
    }
  };
  check(batch.swap_in, spec.num_host_blocks, spec.num_device_blocks, "swap_in");
  check(batch.swap_out, spec.num_device_blocks, spec.num_host_blocks, "swap_out");
  check(batch.copies, spec.num_device_blocks, spec.num_device_blocks, "copy");
}

}  // namespace tessera
