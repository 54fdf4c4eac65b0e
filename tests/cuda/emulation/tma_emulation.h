#pragma once
// kernels/cuda/tma.cuh on the CPU emulation. The tensor map is an opaque
// struct holding what encode_bf16_tile_map (or, rank 4, encode_bf16_rows_map;
// FP32, rank 3, encode_f32_reduce_map) received (no driver involved); load_2d (load_4d: of one batch and head, a
// whole box of zeros outside them) copies the box at the call, element by element, into shared memory
// at the address the copy engine would use under the 128-byte swizzle: the
// byte offset r * 128 + 2 c of box element (r, c), with address bits 4-6
// XORed with bits 7-9 of the shared address (counted from the block's
// 1024-byte aligned dynamic shared memory, as wgmma_emulation.h's descriptors
// are). Elements outside the tensor are written as zeros. Then it performs
// the copy's complete_tx of the whole box's bytes on the barrier
// (mbarrier_emulation.h), which wakes the consumers waiting on its phase.
// reduce_add_3d reads each box element from the same swizzled address (4-byte
// elements) and adds it through the emulated atomicAdd; rows outside the
// tensor are skipped.
//
// So a wrong coordinate order, box placement, swizzle or byte count shows
// here as it would on the GPU. Not modelled: the copy's asynchrony (it has
// landed before load_2d returns, so reading a stage before waiting on its
// barrier goes unnoticed here), the async proxy (a missing
// fence.proxy.async), L2 promotion and the tensor-map cache (prefetch is a
// no-op). A destination outside the block's dynamic shared memory or not
// 128-byte aligned (the instruction's rule), or a map encode never filled,
// aborts with a message.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cuda_runtime.h"

namespace gaugewatch::gpu::tma {

struct TensorMap {
  static constexpr uint64_t kFilled = 0x746d6170656e63ull;  // written by encode
  uint64_t filled = 0;
  const unsigned char* base = nullptr;
  uint64_t rows = 0, cols = 0, row_stride = 0;  // elements
  uint32_t box_rows = 0, box_cols = 0;
  uint64_t heads = 1, batch = 1, head_stride = 0, batch_stride = 0;  // rank 4 (encode_bf16_rows_map)
  uint32_t element_bytes = kElementBytes;  // 4: an FP32 map (encode_f32_reduce_map; planes in heads)
};

inline EncodeStatus encode_bf16_tile_map(TensorMap* map, const void* base, uint64_t rows, uint64_t cols,
                                         uint64_t row_stride, uint32_t box_rows, uint32_t box_cols = kBoxCols) {
  if (map == nullptr || !valid_bf16_tile_map(base, rows, cols, row_stride, box_rows, box_cols)) {
    return EncodeStatus::kInvalidArgument;
  }
  *map = TensorMap{TensorMap::kFilled, static_cast<const unsigned char*>(base), rows, cols, row_stride, box_rows,
                   box_cols};
  return EncodeStatus::kOk;
}

inline EncodeStatus encode_bf16_rows_map(TensorMap* map, const RowsTensor& t, uint32_t box_rows) {
  if (map == nullptr || !valid_bf16_rows_map(t, box_rows)) return EncodeStatus::kInvalidArgument;
  uint64_t s[3];
  dense_unit_strides(s, t);
  *map = TensorMap{TensorMap::kFilled, static_cast<const unsigned char*>(t.base), t.rows, t.cols, s[0], box_rows,
                   kBoxCols, t.heads, t.batch, s[1], s[2]};
  return EncodeStatus::kOk;
}

inline EncodeStatus encode_f32_reduce_map(TensorMap* map, const F32Tensor& t, uint32_t box_rows) {
  if (map == nullptr || !valid_f32_reduce_map(t, box_rows)) return EncodeStatus::kInvalidArgument;
  *map = TensorMap{TensorMap::kFilled, reinterpret_cast<const unsigned char*>(t.base), t.rows, t.cols, t.cols,
                   box_rows, kF32BoxCols, t.planes, 1, t.rows * t.cols, 0, kF32Bytes};
  return EncodeStatus::kOk;
}

namespace emulated {

[[noreturn]] inline void fail(const char* what, uint64_t value) {
  std::fprintf(stderr, "tma emulation: %s (0x%llx)\n", what, static_cast<unsigned long long>(value));
  std::abort();
}

// The block's dynamic shared memory from its 1024-byte aligned start
// (wgmma::align_1024), where the swizzle's address bits are counted from.
inline unsigned char* aligned_smem() {
  auto* smem = reinterpret_cast<unsigned char*>(gaugewatch_emulation::dynamic_smem());
  return reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem) + 1023) & ~uintptr_t{1023});
}

// The offset from aligned_smem() of a box of `bytes` at `p` (the copy's
// destination or the reduction's source), which must lie inside the block's
// aligned dynamic shared memory and start 128-byte aligned.
inline uint64_t box_offset(const void* p, size_t bytes, const char* role) {
  const auto* at = static_cast<const unsigned char*>(p);
  const unsigned char* origin = aligned_smem();
  const auto* end = reinterpret_cast<const unsigned char*>(gaugewatch_emulation::dynamic_smem()) +
                    gaugewatch_emulation::dynamic_smem_bytes();
  if (at < origin || at + bytes > end) {
    std::fprintf(stderr, "tma emulation: %s outside the block's aligned dynamic shared memory\n", role);
    std::abort();
  }
  const auto start = static_cast<uint64_t>(at - origin);
  if (start % 128 != 0) {
    std::fprintf(stderr, "tma emulation: %s not 128-byte aligned (0x%llx)\n", role,
                 static_cast<unsigned long long>(start));
    std::abort();
  }
  return start;
}

}  // namespace emulated

inline void prefetch(const TensorMap* /*map*/) {}

inline void load_4d(void* dst, const TensorMap* map, int32_t col, int32_t row, int32_t head, int32_t batch,
                    uint64_t* bar) {
  if (map->filled != TensorMap::kFilled) emulated::fail("tensor map not filled by encode_bf16_tile_map", 0);
  if (map->element_bytes != kElementBytes) emulated::fail("a BF16 load through an FP32 map", map->element_bytes);
  unsigned char* origin = emulated::aligned_smem();
  const size_t box = size_t{map->box_rows} * map->box_cols * kElementBytes;
  const uint64_t start = emulated::box_offset(dst, box, "destination");
  const bool plane = head >= 0 && static_cast<uint64_t>(head) < map->heads && batch >= 0 &&
                     static_cast<uint64_t>(batch) < map->batch;  // outside: the whole box is zeros
  const uint64_t plane_base =
      plane ? static_cast<uint64_t>(head) * map->head_stride + static_cast<uint64_t>(batch) * map->batch_stride : 0;
  for (uint32_t r = 0; r < map->box_rows; ++r) {
    const int64_t gr = int64_t{row} + r;
    for (uint32_t c = 0; c < map->box_cols; ++c) {
      const int64_t gc = int64_t{col} + c;
      uint16_t value = 0;  // out of bounds: zero
      if (plane && gr >= 0 && gr < static_cast<int64_t>(map->rows) && gc >= 0 &&
          gc < static_cast<int64_t>(map->cols)) {
        std::memcpy(&value,
                    map->base + (plane_base + static_cast<uint64_t>(gr) * map->row_stride + static_cast<uint64_t>(gc)) *
                                    kElementBytes,
                    sizeof value);
      }
      uint64_t addr = start + (uint64_t{r} * map->box_cols + c) * kElementBytes;
      addr ^= ((addr >> 7) & 7u) << 4;  // 128-byte swizzle: bits 4-6 ^= bits 7-9
      std::memcpy(origin + addr, &value, sizeof value);
    }
  }
  mbarrier::emulated::complete_tx(bar, static_cast<uint32_t>(box));
}

inline void load_2d(void* dst, const TensorMap* map, int32_t col, int32_t row, uint64_t* bar) {
  load_4d(dst, map, col, row, 0, 0, bar);
}

// The reduction at the call: each box element inside the tensor read from
// the swizzled address (as load_4d writes it) and added through the
// emulated atomicAdd, so concurrent reductions add up as on the GPU.
inline void reduce_add_3d(const TensorMap* map, const float* src, int32_t col, int32_t row, int32_t plane) {
  if (map->filled != TensorMap::kFilled) emulated::fail("tensor map not filled by encode_f32_reduce_map", 0);
  if (map->element_bytes != kF32Bytes) emulated::fail("an FP32 reduction through a BF16 map", map->element_bytes);
  unsigned char* origin = emulated::aligned_smem();
  const size_t box = size_t{map->box_rows} * map->box_cols * kF32Bytes;
  const uint64_t start = emulated::box_offset(src, box, "source");
  if (plane < 0 || static_cast<uint64_t>(plane) >= map->heads) return;  // the whole box is outside
  auto* base = const_cast<float*>(reinterpret_cast<const float*>(map->base)) +
               static_cast<uint64_t>(plane) * map->head_stride;
  for (uint32_t r = 0; r < map->box_rows; ++r) {
    const int64_t gr = int64_t{row} + r;
    if (gr < 0 || gr >= static_cast<int64_t>(map->rows)) continue;
    for (uint32_t c = 0; c < map->box_cols; ++c) {
      const int64_t gc = int64_t{col} + c;
      if (gc < 0 || gc >= static_cast<int64_t>(map->cols)) continue;
      uint64_t addr = start + (uint64_t{r} * map->box_cols + c) * kF32Bytes;
      addr ^= ((addr >> 7) & 7u) << 4;  // 128-byte swizzle: bits 4-6 ^= bits 7-9
      float value;
      std::memcpy(&value, origin + addr, sizeof value);
      atomicAdd(base + static_cast<uint64_t>(gr) * map->row_stride + static_cast<uint64_t>(gc), value);
    }
  }
}

}  // namespace gaugewatch::gpu::tma
