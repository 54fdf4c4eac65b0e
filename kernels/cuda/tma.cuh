#pragma once
// Tensor Memory Accelerator loads (sm_90): a 2D tile of a BF16 tensor copied
// from global to shared memory by the copy engine (and, further down, FP32
// reductions from shared to global memory), in the 128-byte swizzle
// that wgmma.cuh's descriptors read, completing on an mbarrier
// (mbarrier.cuh). Issue 13's producer warp issues these; consumers wait on
// the barrier.
//
// Tensor: (rows, cols) BF16, row-major with a row stride (elements) >= cols;
// the base 16-byte aligned, the stride a multiple of 8 elements (16 bytes).
// Box: box_rows x 64 elements (64 BF16 = 128 bytes, the widest inner box the
// 128-byte swizzle allows and exactly one row of a wgmma.cuh sub-tile).
// load_2d(dst, map, col, row, bar) writes the box whose top-left element is
// (row, col) to dst, 1024-byte aligned: box row r at dst + 128 r bytes, its
// 16-byte chunk c at chunk c ^ (r % 8) (the copy engine XORs address bits 4-6
// with bits 7-9; PTX ISA, section "Tensors": swizzling modes). That is
// wgmma::tile_offset's [R][64] sub-tile, so a [R][W] tile is W / 64 loads at
// columns col + 64 j into dst + j * R * 64 elements (load_tile below).
// Elements outside the tensor (any coordinate < 0 or >= its extent; the row
// stride's padding is outside) are written as zeros, and still count towards
// the transaction bytes: every load completes box_rows * 128 bytes on `bar`
// (PTX ISA: instruction "cp.async.bulk.tensor"; section "Tensors": bounding
// box, out-of-bound access). The issuing thread announces them first with
// mbarrier::arrive_expect_tx.
//
// The tensor map (CUtensorMap, 128 bytes) is built on the host by
// encode_bf16_tile_map (cuTensorMapEncodeTiled, found at run time through
// cudaGetDriverEntryPointByVersion, so nothing links libcuda) and passed to
// the kernel as a `const __grid_constant__ tma::TensorMap` parameter; device
// code hands its address to load_2d. The map holds the global address: one
// map per tensor and allocation.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/mbarrier.cuh"

namespace gaugewatch::gpu::tma {

inline constexpr uint32_t kBoxCols = 64;           // 128 bytes of BF16: one swizzled row
inline constexpr uint32_t kMaxBoxRows = 256;       // cuTensorMapEncodeTiled's box limit
inline constexpr uint32_t kElementBytes = 2;       // BF16

enum class EncodeStatus {
  kOk = 0,
  kInvalidArgument,      // the tensor or box breaks a rule above (nothing was asked of the driver)
  kDriverUnavailable,    // no driver entry point cuTensorMapEncodeTiled (no driver, or one older than CUDA 12)
  kEncodeFailed,         // the driver refused the arguments
};

inline const char* describe(EncodeStatus status) {
  switch (status) {
    case EncodeStatus::kOk:
      return "ok";
    case EncodeStatus::kInvalidArgument:
      return "invalid tensor or box (base 16-byte aligned, extents 1 .. 2^32, box 1 .. 256 rows; BF16 loads: "
             "stride a multiple of 8 elements >= cols, box 64 columns; FP32 reductions: dense, cols a multiple "
             "of 4)";
    case EncodeStatus::kDriverUnavailable:
      return "cuTensorMapEncodeTiled unavailable (no CUDA driver, or older than CUDA 12.0)";
    case EncodeStatus::kEncodeFailed:
      return "cuTensorMapEncodeTiled rejected the tensor map";
  }
  return "unknown status";
}

// The rules above, checked before the driver (or the emulation) sees them.
inline bool valid_bf16_tile_map(const void* base, uint64_t rows, uint64_t cols, uint64_t row_stride,
                                uint32_t box_rows, uint32_t box_cols) {
  constexpr uint64_t kMaxExtent = uint64_t{1} << 32;
  return base != nullptr && reinterpret_cast<uintptr_t>(base) % 16 == 0 && rows >= 1 && rows <= kMaxExtent &&
         cols >= 1 && cols <= kMaxExtent && row_stride >= cols && (row_stride * kElementBytes) % 16 == 0 &&
         row_stride * kElementBytes < (uint64_t{1} << 40) && box_rows >= 1 && box_rows <= kMaxBoxRows &&
         box_cols == kBoxCols;
}

// A (batch, heads, rows, cols) BF16 tensor with free batch, head and row
// strides (elements), e.g. an attention operand (B, H, N, d): a rank-4 map
// whose box is box_rows x 64 elements of one (batch, head). Coordinates past
// `rows` (a tile's rows past N) read as zeros, as in load_2d.
struct RowsTensor {
  const void* base = nullptr;
  uint64_t batch = 0, heads = 0, rows = 0, cols = 0;
  uint64_t batch_stride = 0, head_stride = 0, row_stride = 0;  // elements
};

// The rules of valid_bf16_tile_map for the rows, plus head and batch strides
// that are multiples of 8 elements below 2^40 bytes and extents 1 .. 2^32.
// An extent of 1 takes any stride (it is never stepped over).
inline bool valid_bf16_rows_map(const RowsTensor& t, uint32_t box_rows) {
  constexpr uint64_t kMaxExtent = uint64_t{1} << 32;
  auto stride_ok = [](uint64_t extent, uint64_t stride) {
    return extent == 1 || ((stride * kElementBytes) % 16 == 0 && stride * kElementBytes < (uint64_t{1} << 40));
  };
  return valid_bf16_tile_map(t.base, t.rows, t.cols, t.row_stride, box_rows, kBoxCols) && t.heads >= 1 &&
         t.heads <= kMaxExtent && t.batch >= 1 && t.batch <= kMaxExtent && stride_ok(t.heads, t.head_stride) &&
         stride_ok(t.batch, t.batch_stride);
}

// Strides as the map holds them: an extent of 1 gets the dense stride
// (rows x row stride, heads x head stride), a valid value the copy never uses.
inline void dense_unit_strides(uint64_t (&strides)[3], const RowsTensor& t) {
  strides[0] = t.row_stride;
  strides[1] = t.heads == 1 ? t.rows * t.row_stride : t.head_stride;
  strides[2] = t.batch == 1 ? t.heads * strides[1] : t.batch_stride;
}

// FP32 reductions by the copy engine (the other direction): a box of an
// FP32 tile in shared memory added element by element to a dense (planes,
// rows, cols) FP32 tensor in global memory, e.g. the backward's dQ
// accumulator (B Hq, N, d). The box is box_rows x 32 floats (128 bytes, the
// widest inner box of the 128-byte swizzle) of one plane; in shared memory box
// element (r, c) lies at byte r * 128 + 4 c with address bits 4-6 XORed with
// bits 7-9, as the loads' boxes (f32_tile_offset below). Elements outside the
// tensor (rows past its extent: a tile's rows past N) are not written (PTX
// ISA: "cp.reduce.async.bulk.tensor"; section "Tensors": out-of-bound
// access). The adds land in L2 like atomics, in an order the copy engine
// chooses. Completion is the issuing thread's bulk group (bulk_reduce.cuh:
// commit, wait_read before the tile is rewritten, wait_all before the block
// exits); writers of the tile fence it for the async proxy first.
inline constexpr uint32_t kF32BoxCols = 32;  // 128 bytes of FP32: one swizzled row
inline constexpr uint32_t kF32Bytes = 4;

// A dense row-major (planes, rows, cols) FP32 tensor.
struct F32Tensor {
  float* base = nullptr;
  uint64_t planes = 0, rows = 0, cols = 0;
};

// Base 16-byte aligned, rows of a multiple of 4 floats (16 bytes), extents
// 1 .. 2^32, the plane stride below 2^40 bytes, box 1 .. 256 rows.
inline bool valid_f32_reduce_map(const F32Tensor& t, uint32_t box_rows) {
  constexpr uint64_t kMaxExtent = uint64_t{1} << 32;
  return t.base != nullptr && reinterpret_cast<uintptr_t>(t.base) % 16 == 0 && t.cols >= 1 && t.cols <= kMaxExtent &&
         (t.cols * kF32Bytes) % 16 == 0 && t.rows >= 1 && t.rows <= kMaxExtent && t.planes >= 1 &&
         t.planes <= kMaxExtent && t.rows * t.cols * kF32Bytes < (uint64_t{1} << 40) && box_rows >= 1 &&
         box_rows <= kMaxBoxRows;
}

// The float offset of element (r, col) of an [R][W] FP32 tile stored as W / 32
// boxes of [R][32] one after the other in the 128-byte swizzle (the boxes a
// reduce_rows_tile call adds): box col / 32, its 16-byte chunk (col / 4) % 8
// of row r at chunk ((col / 4) % 8) ^ (r % 8). A warp's float2 stores of an
// accumulator fragment (rows g, g of 8 consecutive rows; columns 8 j + 2 c)
// meet no bank conflict: the 8 rows' chunks are spread over all 8 chunk
// positions of the 128-byte row.
template <int R>
__host__ __device__ constexpr int f32_tile_offset(int r, int col) {
  return (col >> 5) * R * static_cast<int>(kF32BoxCols) + r * static_cast<int>(kF32BoxCols) +
         ((((col >> 2) & 7) ^ (r & 7)) << 2) + (col & 3);
}

// f32_tile_offset<R>(r, col + 8 j) from x = f32_tile_offset<R>(r, col) where
// col % 32 < 8 (col's chunk is 0 or 1) and j = 0..7: one XOR of the chunk's
// bits 1-2 (the 8-column steps within a box) and a constant per box, so an
// accumulator fragment's 8 stores per row need one address, not 8.
template <int R>
__host__ __device__ constexpr int f32_tile_step(int x, int j) {
  return (x ^ (8 * (j & 3))) + (j >> 2) * R * static_cast<int>(kF32BoxCols);
}

template <int R>
constexpr bool f32_tile_steps_agree() {
  for (int r = 0; r < R; ++r) {
    for (int col : {0, 2, 4, 6, 32, 38, 64, 70, 96, 102}) {
      for (int j = 0; j < 8 && col + 8 * j < 4 * static_cast<int>(kF32BoxCols); ++j) {
        if (f32_tile_step<R>(f32_tile_offset<R>(r, col), j) != f32_tile_offset<R>(r, col + 8 * j)) return false;
      }
    }
  }
  return true;
}
static_assert(f32_tile_steps_agree<64>(), "f32_tile_step is f32_tile_offset 8 j columns on");

// Bytes one load_2d completes on its barrier (out-of-bounds zeros included).
__host__ __device__ constexpr uint32_t box_bytes(uint32_t box_rows) { return box_rows * kBoxCols * kElementBytes; }

}  // namespace gaugewatch::gpu::tma

#if defined(GAUGEWATCH_CUDA_EMULATION)
// CI without a GPU: an emulated tensor map and a copy done at the call
// (tests/cuda/emulation/tma_emulation.h).
#include "tma_emulation.h"
#else
#include <cuda.h>           // CUtensorMap and its enums (types only: libcuda is not linked)
#include <cudaTypedefs.h>   // PFN_cuTensorMapEncodeTiled

namespace gaugewatch::gpu::tma {

using TensorMap = CUtensorMap;

// The driver's cuTensorMapEncodeTiled, or nullptr where there is none; looked
// up once per process (a backward encodes up to nine maps per call).
inline PFN_cuTensorMapEncodeTiled_v12000 tiled_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encoder = [] {
    void* entry = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t err =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &entry, 12000, cudaEnableDefault, &found);
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || entry == nullptr) {
      (void)cudaGetLastError();  // not sticky, but leave no error for the caller's next check
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(entry);
  }();
  return encoder;
}

// Fills *map for the (rows, cols) BF16 tensor at `base` (device memory, row
// stride `row_stride` elements) and a box_rows x box_cols box, 128-byte
// swizzle, out-of-bounds elements zero.
inline EncodeStatus encode_bf16_tile_map(TensorMap* map, const void* base, uint64_t rows, uint64_t cols,
                                         uint64_t row_stride, uint32_t box_rows, uint32_t box_cols = kBoxCols) {
  if (map == nullptr || !valid_bf16_tile_map(base, rows, cols, row_stride, box_rows, box_cols)) {
    return EncodeStatus::kInvalidArgument;
  }
  const auto encode = tiled_encoder();
  if (encode == nullptr) return EncodeStatus::kDriverUnavailable;
  const cuuint64_t extents[2] = {cols, rows};                  // innermost first
  const cuuint64_t strides[1] = {row_stride * kElementBytes};  // bytes, dimensions 1.. only
  const cuuint32_t box[2] = {box_cols, box_rows};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult result =
      encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), extents, strides, box,
             element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return result == CUDA_SUCCESS ? EncodeStatus::kOk : EncodeStatus::kEncodeFailed;
}

// Fills *map for the rank-4 tensor t (device memory) and a box_rows x 64
// box of one (batch, head), 128-byte swizzle, out-of-bounds elements zero.
inline EncodeStatus encode_bf16_rows_map(TensorMap* map, const RowsTensor& t, uint32_t box_rows) {
  if (map == nullptr || !valid_bf16_rows_map(t, box_rows)) return EncodeStatus::kInvalidArgument;
  const auto encode = tiled_encoder();
  if (encode == nullptr) return EncodeStatus::kDriverUnavailable;
  uint64_t s[3];
  dense_unit_strides(s, t);
  const cuuint64_t extents[4] = {t.cols, t.rows, t.heads, t.batch};  // innermost first
  const cuuint64_t strides[3] = {s[0] * kElementBytes, s[1] * kElementBytes, s[2] * kElementBytes};
  const cuuint32_t box[4] = {kBoxCols, box_rows, 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUresult result =
      encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(t.base), extents, strides, box,
             element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return result == CUDA_SUCCESS ? EncodeStatus::kOk : EncodeStatus::kEncodeFailed;
}

// Fills *map for the dense FP32 tensor t (device memory) and a box_rows x 32
// box of one plane, 128-byte swizzle: the destination of reduce_add_3d.
inline EncodeStatus encode_f32_reduce_map(TensorMap* map, const F32Tensor& t, uint32_t box_rows) {
  if (map == nullptr || !valid_f32_reduce_map(t, box_rows)) return EncodeStatus::kInvalidArgument;
  const auto encode = tiled_encoder();
  if (encode == nullptr) return EncodeStatus::kDriverUnavailable;
  const cuuint64_t extents[3] = {t.cols, t.rows, t.planes};  // innermost first
  const cuuint64_t strides[2] = {t.cols * kF32Bytes, t.rows * t.cols * kF32Bytes};
  const cuuint32_t box[3] = {kF32BoxCols, box_rows, 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult result =
      encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, t.base, extents, strides, box, element_strides,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return result == CUDA_SUCCESS ? EncodeStatus::kOk : EncodeStatus::kEncodeFailed;
}

// Fetches the map into the tensor-map cache ahead of the first load
// ("prefetch.tensormap"); `map` is the kernel's __grid_constant__ parameter.
__device__ __forceinline__ void prefetch(const TensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// The box at (row, col) -> dst (shared, 1024-byte aligned), completing
// box_bytes on `bar` (shared). Issued by one thread.
__device__ __forceinline__ void load_2d(void* dst, const TensorMap* map, int32_t col, int32_t row, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row),
      "r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar)))
      : "memory");
}


// The box at (col, row) of (batch, head) of a rank-4 map -> dst, as load_2d.
__device__ __forceinline__ void load_4d(void* dst, const TensorMap* map, int32_t col, int32_t row, int32_t head,
                                        int32_t batch, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(head), "r"(batch),
      "r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar)))
      : "memory");
}

// tensor[plane][row + r][col + c] += box (r, c) for the box at src (shared,
// 1024-byte aligned, f32_tile_offset's layout), rows past the tensor's
// skipped; into this thread's bulk group (bulk::commit). Issued by one thread.
__device__ __forceinline__ void reduce_add_3d(const TensorMap* map, const float* src, int32_t col, int32_t row,
                                              int32_t plane) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(static_cast<uint32_t>(__cvta_generic_to_shared(src))), "r"(col), "r"(row), "r"(plane)
      : "memory");
}

}  // namespace gaugewatch::gpu::tma
#endif  // GAUGEWATCH_CUDA_EMULATION

namespace gaugewatch::gpu::tma {

// A [R][W] tile in wgmma.cuh's layout (tile_offset<R>) from the tensor's
// rows row .. row + R - 1, columns col .. col + W - 1: W / 64 boxes of R rows,
// R * W * 2 bytes on `bar` (announce them with arrive_expect_tx first).
template <int R, int W>
__device__ __forceinline__ void load_tile(uint16_t* dst, const TensorMap* map, int32_t col, int32_t row,
                                          uint64_t* bar) {
  static_assert(W % kBoxCols == 0 && R >= 1 && R <= static_cast<int>(kMaxBoxRows), "box R x 64, W / 64 of them");
#pragma unroll
  for (int j = 0; j < W / static_cast<int>(kBoxCols); ++j) {
    load_2d(dst + j * R * static_cast<int>(kBoxCols), map, col + j * static_cast<int>(kBoxCols), row, bar);
  }
}

// load_tile for a rank-4 map: rows row .. row + R - 1 of (batch, head), all
// W columns.
template <int R, int W>
__device__ __forceinline__ void load_rows_tile(uint16_t* dst, const TensorMap* map, int32_t row, int32_t head,
                                               int32_t batch, uint64_t* bar) {
  static_assert(W % kBoxCols == 0 && R >= 1 && R <= static_cast<int>(kMaxBoxRows), "box R x 64, W / 64 of them");
#pragma unroll
  for (int j = 0; j < W / static_cast<int>(kBoxCols); ++j) {
    load_4d(dst + j * R * static_cast<int>(kBoxCols), map, j * static_cast<int>(kBoxCols), row, head, batch, bar);
  }
}

// tensor[plane][row .. row + R - 1][0 .. W - 1] += the [R][W] FP32 tile at src
// (f32_tile_offset<R>'s layout): W / 32 reductions, one thread's.
template <int R, int W>
__device__ __forceinline__ void reduce_rows_tile(const TensorMap* map, const float* src, int32_t row, int32_t plane) {
  static_assert(W % kF32BoxCols == 0 && R >= 1 && R <= static_cast<int>(kMaxBoxRows), "box R x 32, W / 32 of them");
#pragma unroll
  for (int j = 0; j < W / static_cast<int>(kF32BoxCols); ++j) {
    reduce_add_3d(map, src + j * R * static_cast<int>(kF32BoxCols), j * static_cast<int>(kF32BoxCols), row, plane);
  }
}

template <int R, int W>
__host__ __device__ constexpr uint32_t tile_bytes() {
  return static_cast<uint32_t>(R) * static_cast<uint32_t>(W) * kElementBytes;
}

}  // namespace gaugewatch::gpu::tma
