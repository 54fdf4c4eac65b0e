// Tests of the Hopper TMA and mbarrier primitives (kernels/cuda/tma.cuh,
// mbarrier.cuh, setmaxnreg.cuh), the groundwork of issue 13's warp-specialized
// backward:
//   TmaEncode  the tensor-map rules refused before the driver is asked;
//   Mbarrier   one barrier's phases: arrival counts, transaction bytes, the
//              parity try_wait reads, a copy completing before its expect_tx;
//   TmaRing    a producer warpgroup (setmaxnreg.dec) loading 64 x 64 boxes by
//              TMA into a 2-stage ring guarded by full/empty mbarriers, two
//              consumer warpgroups (setmaxnreg.inc) reading each stage through
//              wgmma.cuh's tile_offset and writing it out: bit for bit the
//              tensor's box, zeros outside the tensor (ragged edges, negative
//              coordinates, the row stride's padding);
//   TmaReduce  an FP32 tile stored swizzled in shared memory and added to a
//              (planes, rows, cols) tensor by tensor reductions: its own rows
//              of its own plane, rows past the tensor dropped;
//   TmaWgmma   tiles loaded by TMA and by cp.async (the backward's path) give
//              the same wgmma ss products, K-major across two sub-tiles and
//              MN-major, exactly the CPU's: the two layouts agree.
//
// Two builds of this one source (tests/cuda/CMakeLists.txt):
//   gaugewatch_cuda_tma_tests            on an sm_90 GPU (skips without one)
//   gaugewatch_cuda_tma_emulation_tests  the same kernels on the CPU emulation

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "kernels/reference/bf16.h"
#include "tests/cuda/device_support.h"
#include "tests/cuda/tma_test_launch.h"

namespace gaugewatch {
namespace {

namespace ref = gaugewatch::reference;
namespace tt = testing_cuda::tma_test;
using testing_cuda::DeviceBuffer;

constexpr int kBox = 64;
constexpr int kBoxElements = kBox * kBox;

// A (rows, cols) BF16 tensor with a row stride, on the host.
struct HostTensor {
  int rows = 0, cols = 0, stride = 0;
  std::vector<uint16_t> bits;  // rows * stride
  uint16_t at(int r, int c) const { return bits[static_cast<size_t>(r) * stride + c]; }
};

// Nonzero payload bits (0 and -0 excluded, so a zero fill is never mistaken for
// data); the stride's padding holds 0xffff, which must never be loaded.
HostTensor random_tensor(int rows, int cols, int stride, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> bits(1, 0x7fff);
  std::bernoulli_distribution negative(0.5);
  HostTensor t{rows, cols, stride, std::vector<uint16_t>(static_cast<size_t>(rows) * stride, 0xffff)};
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      t.bits[static_cast<size_t>(r) * stride + c] =
          static_cast<uint16_t>(bits(rng) | (negative(rng) ? 0x8000 : 0));
    }
  }
  return t;
}

tt::Tensor view(const DeviceBuffer<uint16_t>& buffer, const HostTensor& t) {
  return tt::Tensor{buffer.get(), t.rows, t.cols, t.stride};
}

TEST(TmaEncode, RefusesInvalidTensorsAndBoxes) {
  // Only the argument rules run: no GPU needed. The base is never dereferenced.
  const auto* aligned = reinterpret_cast<const uint16_t*>(uintptr_t{0x10000});
  const auto* misaligned = reinterpret_cast<const uint16_t*>(uintptr_t{0x10008});
  struct Bad {
    const char* why;
    tt::Tensor t;
    int box_rows, box_cols;
  };
  const Bad cases[] = {
      {"null base", {nullptr, 64, 64, 64}, 64, 64},
      {"base not 16-byte aligned", {misaligned, 64, 64, 64}, 64, 64},
      {"stride not a multiple of 8 elements", {aligned, 64, 60, 60}, 64, 64},
      {"stride below cols", {aligned, 64, 72, 64}, 64, 64},
      {"no rows", {aligned, 0, 64, 64}, 64, 64},
      {"box wider than the 128-byte swizzle", {aligned, 64, 128, 128}, 64, 128},
      {"box narrower than a swizzled row", {aligned, 64, 64, 64}, 64, 32},
      {"box of 0 rows", {aligned, 64, 64, 64}, 0, 64},
      {"box of 257 rows", {aligned, 512, 64, 64}, 257, 64},
  };
  for (const Bad& bad : cases) {
    SCOPED_TRACE(bad.why);
    const std::string error = tt::encode_check(bad.t, bad.box_rows, bad.box_cols);
    EXPECT_NE(error.find("invalid tensor or box"), std::string::npos) << error;
  }
}

TEST(TmaEncode, RefusesInvalidF32ReductionTensors) {
  auto* aligned = reinterpret_cast<float*>(uintptr_t{0x10000});
  auto* misaligned = reinterpret_cast<float*>(uintptr_t{0x10008});
  struct Bad {
    const char* why;
    tt::F32Tensor t;
    int box_rows;
  };
  const Bad cases[] = {
      {"null base", {nullptr, 1, 64, 64}, 64},
      {"base not 16-byte aligned", {misaligned, 1, 64, 64}, 64},
      {"rows not a multiple of 16 bytes", {aligned, 1, 64, 30}, 64},
      {"no planes", {aligned, 0, 64, 64}, 64},
      {"no rows", {aligned, 1, 0, 64}, 64},
      {"box of 0 rows", {aligned, 1, 64, 64}, 0},
      {"box of 257 rows", {aligned, 1, 512, 64}, 257},
  };
  for (const Bad& bad : cases) {
    SCOPED_TRACE(bad.why);
    const std::string error = tt::encode_f32_check(bad.t, bad.box_rows);
    EXPECT_NE(error.find("invalid tensor or box"), std::string::npos) << error;
  }
}

TEST(Mbarrier, PhaseParityAndTransactionCount) {
  SKIP_WITHOUT_GPU();
  const HostTensor in = random_tensor(64, 64, 64, 1);
  DeviceBuffer<uint16_t> data(in.bits);
  DeviceBuffer<uint32_t> out(tt::kPhaseSteps);
  out.poison();
  ASSERT_EQ(tt::run_phases(view(data, in), out.get()), "");
  // Steps (tma_test_kernels.cuh, phase_kernel): parity 1 before phase 0 is
  // complete; phase 0 open after init, after 1 of 2 arrivals, after both with
  // 8192 bytes outstanding; complete once the copy lands; phase 1 open, still
  // after a copy and 1 arrival; complete after the second arrival's expect_tx.
  const std::vector<uint32_t> expected = {1, 0, 0, 0, 1, 0, 0, 1};
  EXPECT_EQ(out.download(), expected);
}

struct RingCase {
  const char* name;
  int rows, cols, stride;
  int origin_row, origin_col, tiles_r, tiles_c;
};

void PrintTo(const RingCase& k, std::ostream* os) { *os << k.name; }

class TmaRing : public ::testing::TestWithParam<RingCase> {};

TEST_P(TmaRing, CopiesEveryBoxWithZerosOutside) {
  SKIP_WITHOUT_GPU();
  const RingCase& k = GetParam();
  const HostTensor in = random_tensor(k.rows, k.cols, k.stride, 7 + static_cast<uint64_t>(k.rows));
  const int tiles = k.tiles_r * k.tiles_c;
  DeviceBuffer<uint16_t> data(in.bits);
  DeviceBuffer<uint16_t> out(static_cast<size_t>(tiles) * kBoxElements);
  out.poison();  // 0xffff: never a payload or a zero fill
  ASSERT_EQ(tt::run_ring(view(data, in), k.origin_row, k.origin_col, k.tiles_r, k.tiles_c, out.get()), "");
  const std::vector<uint16_t> got = out.download();
  size_t mismatches = 0, zeros = 0;
  std::string first;
  for (int t = 0; t < tiles; ++t) {
    for (int r = 0; r < kBox; ++r) {
      for (int c = 0; c < kBox; ++c) {
        const int gr = k.origin_row + kBox * (t / k.tiles_c) + r, gc = k.origin_col + kBox * (t % k.tiles_c) + c;
        const bool inside = gr >= 0 && gr < k.rows && gc >= 0 && gc < k.cols;
        const uint16_t want = inside ? in.at(gr, gc) : 0;
        zeros += inside ? 0 : 1;
        const uint16_t have = got[static_cast<size_t>(t) * kBoxElements + static_cast<size_t>(r) * kBox + c];
        if (have == want) continue;
        if (mismatches++ == 0) {
          first = "tile " + std::to_string(t) + " (" + std::to_string(r) + ", " + std::to_string(c) + "): " +
                  std::to_string(have) + ", expected " + std::to_string(want);
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0u) << "first: " << first;
  // Whether the case reaches past the tensor is part of its point.
  const bool ragged = k.origin_row < 0 || k.origin_col < 0 || k.tiles_r * kBox + k.origin_row > k.rows ||
                      k.tiles_c * kBox + k.origin_col > k.cols;
  EXPECT_EQ(zeros > 0, ragged);
}

// 2 stages: 4 tiles go round the ring twice, 20 tiles ten times.
INSTANTIATE_TEST_SUITE_P(Shapes, TmaRing,
                         ::testing::Values(RingCase{"exact_128x128", 128, 128, 128, 0, 0, 2, 2},
                                           RingCase{"ragged_150x100_stride104", 150, 100, 104, 0, 0, 3, 2},
                                           RingCase{"ragged_300x200_20_tiles", 300, 200, 208, 0, 0, 5, 4},
                                           RingCase{"negative_origin_100x70", 100, 70, 72, -24, -8, 3, 2},
                                           RingCase{"one_row_1x5", 1, 5, 8, 0, 0, 1, 1}),
                         [](const ::testing::TestParamInfo<RingCase>& case_info) { return std::string(case_info.param.name); });

// A [rows][cols] operand of multiples of 1/4 in [-2, 2] (BF16-exact, every
// partial sum of products exact in FP32, so the order of summation does not
// matter), padding NaN: a load of padding poisons the product.
HostTensor quarter_tensor(int rows, int cols, int stride, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> quarter(-8, 8);
  HostTensor t{rows, cols, stride, std::vector<uint16_t>(static_cast<size_t>(rows) * stride, 0x7fc0)};
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      t.bits[static_cast<size_t>(r) * stride + c] = ref::float_to_bf16_bits(static_cast<float>(quarter(rng)) / 4.0f);
    }
  }
  return t;
}

float value(const HostTensor& t, int r, int c) { return ref::bf16_bits_to_float(t.at(r, c)); }

TEST(TmaWgmma, TmaTilesGiveTheCpAsyncProductsExactly) {
  SKIP_WITHOUT_GPU();
  const HostTensor a = quarter_tensor(64, 128, 136, 21), b = quarter_tensor(64, 128, 136, 22),
                   v = quarter_tensor(64, 64, 72, 23);
  // S = A B^T over 128 columns; C = A[:, :64]^T V.
  std::vector<float> s_want(64 * 64), c_want(64 * 64);
  for (int i = 0; i < 64; ++i) {
    for (int j = 0; j < 64; ++j) {
      double s = 0.0, c = 0.0;
      for (int k = 0; k < 128; ++k) s += static_cast<double>(value(a, i, k)) * value(b, j, k);
      for (int k = 0; k < 64; ++k) c += static_cast<double>(value(a, k, i)) * value(v, k, j);
      s_want[static_cast<size_t>(i) * 64 + j] = static_cast<float>(s);
      c_want[static_cast<size_t>(i) * 64 + j] = static_cast<float>(c);
    }
  }
  DeviceBuffer<uint16_t> da(a.bits), db(b.bits), dv(v.bits);
  std::vector<float> results[2][2];  // [load][s, c]
  const tt::Load loads[2] = {tt::Load::kTma, tt::Load::kCpAsync};
  for (int l = 0; l < 2; ++l) {
    SCOPED_TRACE(l == 0 ? "TMA" : "cp.async");
    DeviceBuffer<float> s(64 * 64), c(64 * 64);
    s.poison();
    c.poison();
    ASSERT_EQ(tt::run_wgmma(loads[l], view(da, a), view(db, b), view(dv, v), s.get(), c.get()), "");
    results[l][0] = s.download();
    results[l][1] = c.download();
    EXPECT_EQ(results[l][0], s_want) << "S = A B^T (K-major)";
    EXPECT_EQ(results[l][1], c_want) << "C = A0^T V (MN-major)";
  }
  for (int m = 0; m < 2; ++m) {
    EXPECT_EQ(std::memcmp(results[0][m].data(), results[1][m].data(), 64 * 64 * sizeof(float)), 0)
        << (m == 0 ? "S" : "C") << ": TMA and cp.async tiles differ";
  }
}

// The FP32 tensor reduction of a swizzled shared tile (the dQ writer's): every
// element of the tile lands on its own element of the destination plane,
// rows past the tensor are dropped (nothing beyond them changes), other
// planes are untouched, and repeated reductions accumulate. Values are
// multiples of 1/8 of modest size, so every sum is exact in FP32 whatever the
// order of the adds.
struct ReduceCase {
  const char* name;
  int planes, rows, row, plane, times;
};

void PrintTo(const ReduceCase& k, std::ostream* os) { *os << k.name; }

class TmaReduce : public ::testing::TestWithParam<ReduceCase> {};

TEST_P(TmaReduce, AddsTheTileToItsRowsOfItsPlane) {
  SKIP_WITHOUT_GPU();
  const ReduceCase& k = GetParam();
  constexpr int kCols = 64;
  std::mt19937_64 rng(41 + static_cast<uint64_t>(k.rows));
  std::uniform_int_distribution<int> eighth(-64, 64);
  std::vector<float> tile(kBox * kCols), init(static_cast<size_t>(k.planes) * k.rows * kCols);
  for (float& x : tile) x = static_cast<float>(eighth(rng)) / 8.0f;
  for (float& x : init) x = static_cast<float>(eighth(rng)) / 8.0f;
  DeviceBuffer<float> dtile(tile), dst(init);
  ASSERT_EQ(tt::run_reduce(dtile.get(), tt::F32Tensor{dst.get(), k.planes, k.rows, kCols}, k.row, k.plane, k.times),
            "");
  const std::vector<float> got = dst.download();
  size_t mismatches = 0, added = 0;
  std::string first;
  for (int p = 0; p < k.planes; ++p) {
    for (int r = 0; r < k.rows; ++r) {
      for (int c = 0; c < kCols; ++c) {
        const size_t at = (static_cast<size_t>(p) * k.rows + r) * kCols + c;
        const int tr = r - k.row;
        const bool hit = p == k.plane && tr >= 0 && tr < kBox;
        const float want = hit ? init[at] + static_cast<float>(k.times) * tile[static_cast<size_t>(tr) * kCols + c]
                               : init[at];
        added += hit ? 1 : 0;
        if (got[at] == want) continue;
        if (mismatches++ == 0) {
          first = "(" + std::to_string(p) + ", " + std::to_string(r) + ", " + std::to_string(c) +
                  "): " + std::to_string(got[at]) + ", expected " + std::to_string(want);
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0u) << "first: " << first;
  EXPECT_GT(added, 0u);
}

INSTANTIATE_TEST_SUITE_P(Shapes, TmaReduce,
                         ::testing::Values(ReduceCase{"whole_tile_plane_1_of_3", 3, 128, 64, 1, 1},
                                           ReduceCase{"rows_past_the_end_dropped", 2, 100, 64, 1, 1},
                                           ReduceCase{"three_times_first_plane", 2, 64, 0, 0, 3},
                                           ReduceCase{"fewer_rows_than_a_box", 1, 40, 0, 0, 2}),
                         [](const ::testing::TestParamInfo<ReduceCase>& case_info) {
                           return std::string(case_info.param.name);
                         });

}  // namespace
}  // namespace gaugewatch
