// The packed weight layout (kernels.hpp, "packed weights"): rows in panels of 16, every field of a ggml
// block transposed across the panel's rows. Packing runs once per matrix at load; these loops are
// plain C++ (O(bytes), not worth an ISA).
#include <cstring>

#include "cpu/kernels.hpp"

namespace tessera::cpu {
namespace {

struct field {
  int16_t offset;  // in the ggml block
  int16_t size;    // bytes: 2 (one f16) or a multiple of 4
};

// The fields of each block, in block order (ggml-common.h). The packed panel-block holds field f at
// 16 * f.offset.
struct block_fields {
  int count = 0;
  field f[5] = {};
  int16_t qh = -1;  // Q5_0 / Q5_1: offset of the 32-bit qh word whose bits are permuted
};

block_fields fields_of(ggml_type t) {
  switch (t) {
    case ggml_type::q4_0: return {2, {{0, 2}, {2, 16}}};                               // d, qs
    case ggml_type::q4_1: return {3, {{0, 2}, {2, 2}, {4, 16}}};                       // d, m, qs
    case ggml_type::q5_0: return {3, {{0, 2}, {2, 4}, {6, 16}}, 2};                    // d, qh, qs
    case ggml_type::q5_1: return {4, {{0, 2}, {2, 2}, {4, 4}, {8, 16}}, 4};            // d, m, qh, qs
    case ggml_type::q8_0: return {2, {{0, 2}, {2, 32}}};                               // d, qs
    case ggml_type::q2_k: return {4, {{0, 16}, {16, 64}, {80, 2}, {82, 2}}};           // scales, qs, d, dmin
    case ggml_type::q3_k: return {4, {{0, 32}, {32, 64}, {96, 12}, {108, 2}}};         // hmask, qs, scales, d
    case ggml_type::q4_k: return {4, {{0, 2}, {2, 2}, {4, 12}, {16, 128}}};            // d, dmin, scales, qs
    case ggml_type::q5_k: return {5, {{0, 2}, {2, 2}, {4, 12}, {16, 32}, {48, 128}}};  // d, dmin, scales, qh, qs
    case ggml_type::q6_k: return {4, {{0, 128}, {128, 64}, {192, 16}, {208, 2}}};      // ql, qh, scales, d
    default: return {};
  }
}

// Q5_0 / Q5_1 qh: new bit 8j + g = old bit 4g + j (fifth bit of element 4g + j, the low nibble of byte
// 4g + j of qs), new bit 8j + 4 + g = old bit 16 + 4g + j (element 16 + 4g + j, its high nibble).
uint32_t permute_qh(uint32_t old) {
  uint32_t out = 0;
  for (uint32_t j = 0; j < 4; ++j) {
    for (uint32_t g = 0; g < 4; ++g) {
      out |= ((old >> (4 * g + j)) & 1u) << (8 * j + g);
      out |= ((old >> (16 + 4 * g + j)) & 1u) << (8 * j + 4 + g);
    }
  }
  return out;
}

uint32_t unpermute_qh(uint32_t packed) {
  uint32_t out = 0;
  for (uint32_t j = 0; j < 4; ++j) {
    for (uint32_t g = 0; g < 4; ++g) {
      out |= ((packed >> (8 * j + g)) & 1u) << (4 * g + j);
      out |= ((packed >> (8 * j + 4 + g)) & 1u) << (16 + 4 * g + j);
    }
  }
  return out;
}

// Byte `x` of field `f` of lane `lane` inside a packed panel-block.
int64_t packed_offset(const field& f, int lane, int x) {
  if (f.size == 2) return 16 * f.offset + 2 * lane + x;
  return 16 * f.offset + (x / 4 * panel_rows + lane) * 4 + x % 4;
}

}  // namespace

bool has_packed_kernel(ggml_type t) noexcept { return fields_of(t).count > 0; }

int64_t packed_matrix_bytes(ggml_type t, int64_t rows, int64_t cols) noexcept {
  const int64_t rb = row_bytes(t, cols);
  if (rb < 0) return -1;
  return (rows + panel_rows - 1) / panel_rows * panel_rows * rb;
}

void pack_weights(ggml_type t, const std::byte* src, int64_t src_stride, int64_t rows, int64_t cols, std::byte* dst) {
  const block_fields bf = fields_of(t);
  const ggml_type_info& info = type_info(t);
  const int64_t nb = cols / info.block_elems, bb = info.block_bytes;
  const int64_t panels = (rows + panel_rows - 1) / panel_rows;
  std::memset(dst, 0, static_cast<size_t>(panels * panel_rows * nb * bb));
  std::byte blk[256];
  for (int64_t p = 0; p < panels; ++p) {
    for (int lane = 0; lane < panel_rows; ++lane) {
      const int64_t r = p * panel_rows + lane;
      if (r >= rows) break;  // the padding rows stay zero (zero scales: they contribute nothing)
      for (int64_t b = 0; b < nb; ++b) {
        std::memcpy(blk, src + r * src_stride + b * bb, static_cast<size_t>(bb));
        if (bf.qh >= 0) {
          uint32_t qh;
          std::memcpy(&qh, blk + bf.qh, 4);
          qh = permute_qh(qh);
          std::memcpy(blk + bf.qh, &qh, 4);
        }
        std::byte* pblk = dst + (p * nb + b) * panel_rows * bb;
        for (int i = 0; i < bf.count; ++i) {
          const field& f = bf.f[i];
          const int unit = f.size == 2 ? 2 : 4;  // an f16, or a 4-byte word
          for (int x = 0; x < f.size; x += unit) {
            std::memcpy(pblk + packed_offset(f, lane, x), blk + f.offset + x, static_cast<size_t>(unit));
          }
        }
      }
    }
  }
}

void unpack_panel_block(ggml_type t, const std::byte* panel_block, int lane, std::byte* dst) {
  const block_fields bf = fields_of(t);
  for (int i = 0; i < bf.count; ++i) {
    const field& f = bf.f[i];
    for (int x = 0; x < f.size; ++x) dst[f.offset + x] = panel_block[packed_offset(f, lane, x)];
  }
  if (bf.qh >= 0) {
    uint32_t qh;
    std::memcpy(&qh, dst + bf.qh, 4);
    qh = unpermute_qh(qh);
    std::memcpy(dst + bf.qh, &qh, 4);
  }
}

void unpack_weight_row(ggml_type t, const std::byte* packed, int64_t cols, int64_t r, std::byte* dst) {
  const ggml_type_info& info = type_info(t);
  const int64_t nb = cols / info.block_elems, bb = info.block_bytes;
  const int64_t p = r / panel_rows;
  for (int64_t b = 0; b < nb; ++b) {
    unpack_panel_block(t, packed + (p * nb + b) * panel_rows * bb, static_cast<int>(r % panel_rows), dst + b * bb);
  }
}

}  // namespace tessera::cpu
