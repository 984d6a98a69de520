// The decode attention kernels (gpu/attention.hpp's decode_kernel) a kernel test runs, and their names
// for failure messages.
#pragma once
#include <vector>

#include "gpu/attention.hpp"

namespace tessera::gpu {

// v2 (the default) and v1 over any cache; v3 too over a bf16 or fp8 one (it stages 1- and 2-byte
// rows only).
inline std::vector<decode_kernel> decode_kernels(bool narrow_cache) {
  std::vector<decode_kernel> kernels{decode_kernel::warp_tiles, decode_kernel::thread_rows};
  if (narrow_cache) kernels.push_back(decode_kernel::staged_warp_tiles);
  return kernels;
}

inline const char* name(decode_kernel k) {
  switch (k) {
    case decode_kernel::thread_rows: return "v1";
    case decode_kernel::warp_tiles: return "v2";
    case decode_kernel::staged_warp_tiles: return "v3";
  }
  return "?";
}

}  // namespace tessera::gpu
