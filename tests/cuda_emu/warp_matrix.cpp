// The warp matrix instructions of the CPU emulation of CUDA (include/cuda_emu/ptx.hpp): mma.sync and
// ldmatrix as warp collectives (scheduler.cpp's warp_matrix_collective), with the fragment layouts
// of the PTX ISA manual. The layout functions below are the manual's formulas, written as it states
// them; tests/gpu/mma_test.cpp checks every lane's fragment against an independent spelling of the
// same tables, on a GPU as well as here, so a mistake in either shows.
//
// Numerics: the products of two bf16 or two f16 values are exact in fp32; here the K products and C
// are summed in double and rounded to fp32 once. A Tensor Core sums in its own order with its own
// intermediate rounding, so a kernel's results may differ from a GPU's in the last bits (never in
// which element goes where).
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "include/cuda_emu/ptx.hpp"
#include "scheduler.hpp"

namespace tessera::gpu::emu {
namespace {

struct coord {
  int row = 0;
  int col = 0;
};

// PTX ISA 9.7.14.5.8, "Matrix Fragments for mma.m16n8k16 with floating point type" (.f16/.bf16).
// A lane holds elements a0..a7 of A (16 x 16) in four .b32 registers, two per register, low half
// first; b0..b3 of B (16 x 8) in two; c0..c3 of C/D (16 x 8, .f32) in four:
//   groupID = %laneid >> 2, threadID_in_group = %laneid % 4
//   A: row = groupID for ai where 0 <= i < 2 || 4 <= i < 6, groupID + 8 otherwise
//      col = (threadID_in_group * 2) + (i & 0x1) for ai where i < 4, ... + 8 for ai where i >= 4
//   B: row = (threadID_in_group * 2) + (i & 0x1) for bi where i < 2, ... + 8 for bi where i >= 2
//      col = groupID
//   C: row = groupID for ci where i < 2, groupID + 8 for ci where i >= 2
//      col = (threadID_in_group * 2) + (i & 0x1)
coord a_m16n8k16(int lane, int i) {
  const int group = lane >> 2, thread_in_group = lane % 4;
  const int row = ((0 <= i && i < 2) || (4 <= i && i < 6)) ? group : group + 8;
  const int col = (thread_in_group * 2) + (i & 0x1) + (i >= 4 ? 8 : 0);
  return {row, col};
}
coord b_m16n8k16(int lane, int i) {
  const int group = lane >> 2, thread_in_group = lane % 4;
  return {(thread_in_group * 2) + (i & 0x1) + (i >= 2 ? 8 : 0), group};
}
// PTX ISA 9.7.14.5.7, "Matrix Fragments for mma.m16n8k8" (.f16/.bf16): a0..a3 of A (16 x 8) in two
// registers, b0, b1 of B (8 x 8) in one, C/D as for m16n8k16:
//   A: row = groupID for a0 and a1, groupID + 8 for a2 and a3; col = threadID_in_group * 2 + (i & 0x1)
//   B: row = (threadID_in_group * 2) + i; col = groupID
coord a_m16n8k8(int lane, int i) {
  const int group = lane >> 2, thread_in_group = lane % 4;
  return {i < 2 ? group : group + 8, thread_in_group * 2 + (i & 0x1)};
}
coord b_m16n8k8(int lane, int i) {
  const int group = lane >> 2, thread_in_group = lane % 4;
  return {(thread_in_group * 2) + i, group};
}
coord c_m16n8(int lane, int i) {
  const int group = lane >> 2, thread_in_group = lane % 4;
  return {i < 2 ? group : group + 8, (thread_in_group * 2) + (i & 0x1)};
}

// Element i of a fragment held two per .b32 register: register i / 2, the low 16 bits for even i.
uint16_t element(const uint32_t* regs, int i) { return static_cast<uint16_t>(regs[i / 2] >> (16 * (i & 1))); }

float f16_to_float(uint16_t h) {
  const int exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  float v = 0.0f;
  if (exponent == 0) {
    v = std::ldexp(static_cast<float>(mantissa), -24);  // zero or subnormal
  } else if (exponent == 31) {
    v = mantissa ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else {
    v = std::ldexp(static_cast<float>(mantissa | 0x400), exponent - 25);
  }
  return (h & 0x8000) ? -v : v;
}

struct mma_lane {
  float* d;
  const uint32_t* a;
  const uint32_t* b;
  const float* c;
};

void complete_mma(warp_op op, void* const (&lanes)[32]) {
  const bool k16 = op == warp_op::mma_m16n8k16_bf16 || op == warp_op::mma_m16n8k16_f16;
  const bool bf16 = op == warp_op::mma_m16n8k16_bf16 || op == warp_op::mma_m16n8k8_bf16;
  const int k = k16 ? 16 : 8;
  auto widen = [bf16](uint16_t bits) { return bf16 ? bf16_to_float(bits) : f16_to_float(bits); };
  float a[16][16] = {}, b[16][8] = {}, c[16][8] = {};
  for (int lane = 0; lane < 32; ++lane) {
    const auto& l = *static_cast<const mma_lane*>(lanes[lane]);
    for (int i = 0; i < (k16 ? 8 : 4); ++i) {
      const coord x = k16 ? a_m16n8k16(lane, i) : a_m16n8k8(lane, i);
      a[x.row][x.col] = widen(element(l.a, i));
    }
    for (int i = 0; i < (k16 ? 4 : 2); ++i) {
      const coord x = k16 ? b_m16n8k16(lane, i) : b_m16n8k8(lane, i);
      b[x.row][x.col] = widen(element(l.b, i));
    }
    for (int i = 0; i < 4; ++i) {
      const coord x = c_m16n8(lane, i);
      c[x.row][x.col] = l.c[i];
    }
  }
  // Every C is read before any D is written: a lane's d may be its c (accumulate in place).
  for (int lane = 0; lane < 32; ++lane) {
    const auto& l = *static_cast<const mma_lane*>(lanes[lane]);
    for (int i = 0; i < 4; ++i) {
      const coord x = c_m16n8(lane, i);
      double sum = c[x.row][x.col];
      for (int p = 0; p < k; ++p) sum += static_cast<double>(a[x.row][p]) * b[p][x.col];
      l.d[i] = static_cast<float>(sum);
    }
  }
}

struct ldmatrix_lane {
  uint32_t* r;
  const void* row;
};

std::string lane_text(int lane) { return "lane " + std::to_string(lane); }

// PTX ISA 9.7.14.5.15, "Warp-level matrix load instruction: ldmatrix": lanes 0-7 give the row
// addresses of the first 8x8 matrix, 8-15 of the second, ... (16 bytes per row, naturally aligned;
// the other lanes' addresses are not used). "Each thread in a warp loads fragments of a row, with
// thread 0 receiving the first fragment in its register r ... A group of four threads loads an entire
// row": lane l gets row l / 4, elements 2 (l % 4) and 2 (l % 4) + 1 (low half first), register i from
// matrix i. .trans loads the matrix column-major: the same from the transpose, rows 2 (l % 4) and
// 2 (l % 4) + 1 of column l / 4.
void complete_ldmatrix(warp_op op, void* const (&lanes)[32]) {
  const int num = (op == warp_op::ldmatrix_x1 || op == warp_op::ldmatrix_x1_trans)   ? 1
                  : (op == warp_op::ldmatrix_x2 || op == warp_op::ldmatrix_x2_trans) ? 2
                                                                                     : 4;
  const bool trans =
      op == warp_op::ldmatrix_x1_trans || op == warp_op::ldmatrix_x2_trans || op == warp_op::ldmatrix_x4_trans;
  uint16_t m[4][8][8];
  for (int i = 0; i < num; ++i) {
    for (int j = 0; j < 8; ++j) {
      const int lane = 8 * i + j;
      const void* p = static_cast<const ldmatrix_lane*>(lanes[lane])->row;
      if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
        throw std::logic_error("ldmatrix: " + lane_text(lane) +
                               "'s row address is not 16-byte aligned (each 8x8 row of b16 is 16 bytes, "
                               "naturally aligned)");
      }
      if (const std::string why = check_shared_range(p, 16, "row address"); !why.empty()) {
        throw std::logic_error("ldmatrix: " + lane_text(lane) + "'s " + why);
      }
      std::memcpy(m[i][j], p, 16);
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    uint32_t* r = static_cast<const ldmatrix_lane*>(lanes[lane])->r;
    const int row = lane / 4, col = 2 * (lane % 4);
    for (int i = 0; i < num; ++i) {
      const uint16_t lo = trans ? m[i][col][row] : m[i][row][col];
      const uint16_t hi = trans ? m[i][col + 1][row] : m[i][row][col + 1];
      r[i] = uint32_t{lo} | (uint32_t{hi} << 16);
    }
  }
}

}  // namespace

void mma_sync(mma_shape shape, mma_input input, float* d, const uint32_t* a, const uint32_t* b, const float* c,
              const std::source_location& where) {
  const warp_op op = shape == mma_shape::m16n8k16
                         ? (input == mma_input::bf16 ? warp_op::mma_m16n8k16_bf16 : warp_op::mma_m16n8k16_f16)
                         : (input == mma_input::bf16 ? warp_op::mma_m16n8k8_bf16 : warp_op::mma_m16n8k8_f16);
  mma_lane lane{d, a, b, c};
  warp_matrix_collective(op, &lane, &complete_mma, where);
}

void ldmatrix_sync(int num, bool trans, uint32_t* r, const void* row, const std::source_location& where) {
  warp_op op = warp_op::ldmatrix_x1;
  if (num == 1) op = trans ? warp_op::ldmatrix_x1_trans : warp_op::ldmatrix_x1;
  if (num == 2) op = trans ? warp_op::ldmatrix_x2_trans : warp_op::ldmatrix_x2;
  if (num == 4) op = trans ? warp_op::ldmatrix_x4_trans : warp_op::ldmatrix_x4;
  if (num != 1 && num != 2 && num != 4)
    throw std::logic_error("gpu emulation: ldmatrix of " + std::to_string(num) + " matrices");
  ldmatrix_lane lane{r, row};
  warp_matrix_collective(op, &lane, &complete_ldmatrix, where);
}

}  // namespace tessera::gpu::emu
