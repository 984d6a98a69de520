// The CUDA executor's tuning settings read from the environment (TESSERA_QGEMM_ROWS,
// TESSERA_PREFILL_MIN_TOKENS): knobs for A/B runs on a device, each read once by its *_from_env().
#pragma once
#include <cstdint>
#include <cstdlib>

namespace tessera::gpu {

// The variable's value when it is a whole decimal number in [lo, hi]; `fallback` when it is unset,
// empty or anything else.
inline int32_t int_setting_from_env(const char* name, int32_t fallback, int32_t lo, int32_t hi) noexcept {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return fallback;
  char* end = nullptr;
  const long v = std::strtol(env, &end, 10);
  return *end == '\0' && v >= lo && v <= hi ? static_cast<int32_t>(v) : fallback;
}

}  // namespace tessera::gpu
