// Tests of the Hopper warpgroup MMA primitives (kernels/cuda/wgmma.cuh) in the
// modes the fused BF16 backward uses: ss with both operands K-major, rs with B
// MN-major, ss with both operands MN-major, and an accumulator rounded to BF16
// fed back as the rs A operand, ss with A K-major and B MN-major (the
// key-outer kernel's dQ; m64n32k16 halves of it at D = 64), m64n8k16 with
// both K-major (pivot's row sums against a tile of ones), and an
// accumulator stored to a tile by stmatrix
// (store_accumulator_tile) read back as the MN-major A operand. Descriptors,
// the 128-byte swizzle of the tile layout, k16 stepping and the fragment
// layouts all show in the result.
//
// Operands are multiples of 1/4 in [-2, 2]: BF16-exact, and every partial sum
// of their products is exact in FP32 (at most 2^21 steps of 1/64), so the
// result does not depend on the order of summation and is compared exactly.
// The chain's BF16 rounding of S (up to 256 in steps of 1/16) is real and is
// reproduced here (round to nearest even, as __floats2bfloat162_rn). Outputs
// start as NaN, so an element the kernel forgets to write fails.
//
// Two builds of this one source (tests/cuda/CMakeLists.txt):
//   gaugewatch_cuda_wgmma_tests            on an sm_90 GPU (skips without one)
//   gaugewatch_cuda_wgmma_emulation_tests  the same kernels on the CPU
//                                          emulation (tests/cuda/emulation)

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/reference/bf16.h"
#include "tests/cuda/device_support.h"
#include "tests/cuda/wgmma_test_launch.h"

namespace gaugewatch {
namespace {

namespace ref = gaugewatch::reference;
using testing_cuda::DeviceBuffer;
using testing_cuda::wgmma_test::Case;

constexpr int kM = 64;  // rows of every accumulator

// A row-major [rows][cols] matrix of BF16-exact floats.
struct Matrix {
  int rows = 0, cols = 0;
  std::vector<float> values;
  float at(int r, int c) const { return values[static_cast<size_t>(r) * cols + c]; }
};

Matrix random_matrix(int rows, int cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> quarter(-8, 8);
  Matrix m{rows, cols, std::vector<float>(static_cast<size_t>(rows) * cols)};
  for (auto& x : m.values) x = static_cast<float>(quarter(rng)) / 4.0f;
  return m;
}

std::vector<uint16_t> bf16_bits(const Matrix& m) {
  std::vector<uint16_t> bits(m.values.size());
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = ref::float_to_bf16_bits(m.values[i]);
  return bits;
}

// C[i][j] = sum_k A(i, k) B(k, j), A(i, k) = a.at(i, k) or a.at(k, i) when
// a_transposed, B(k, j) = b.at(k, j) or b.at(j, k) when b_transposed.
Matrix product(const Matrix& a, bool a_transposed, const Matrix& b, bool b_transposed) {
  const int rows = a_transposed ? a.cols : a.rows, inner = a_transposed ? a.rows : a.cols;
  const int cols = b_transposed ? b.rows : b.cols;
  Matrix c{rows, cols, std::vector<float>(static_cast<size_t>(rows) * cols)};
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < cols; ++j) {
      double sum = 0.0;  // exact for these operands; the kernel's FP32 sums are too
      for (int k = 0; k < inner; ++k) {
        sum += static_cast<double>(a_transposed ? a.at(k, i) : a.at(i, k)) *
               static_cast<double>(b_transposed ? b.at(j, k) : b.at(k, j));
      }
      c.values[static_cast<size_t>(i) * cols + j] = static_cast<float>(sum);
    }
  }
  return c;
}

Matrix rounded_to_bf16(Matrix m) {
  for (auto& x : m.values) x = ref::round_bf16(x);
  return m;
}

::testing::AssertionResult same_matrix(const Matrix& expected, const std::vector<float>& actual) {
  if (actual.size() != expected.values.size()) {
    return ::testing::AssertionFailure() << "size " << actual.size() << ", expected " << expected.values.size();
  }
  size_t mismatches = 0;
  std::string first;
  for (size_t i = 0; i < actual.size(); ++i) {
    if (actual[i] == expected.values[i]) continue;  // NaN (unwritten) never equals
    if (mismatches++ == 0) {
      first = "C[" + std::to_string(i / expected.cols) + "][" + std::to_string(i % expected.cols) +
              "] = " + std::to_string(actual[i]) + ", expected " + std::to_string(expected.values[i]);
    }
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << mismatches << " of " << actual.size() << " elements differ; first "
                                       << first;
}

struct Inputs {
  Matrix a, b, v;  // v: kChain only
};

// Runs `which` on the device and returns C, [64][cols] row-major.
std::vector<float> run_case(Case which, int size, const Inputs& in, int cols) {
  DeviceBuffer<uint16_t> a(bf16_bits(in.a)), b(bf16_bits(in.b)), v(bf16_bits(in.v));
  DeviceBuffer<float> c(static_cast<size_t>(kM) * cols);
  c.poison();
  testing_cuda::wgmma_test::Operands operands;
  operands.a = a.get();
  operands.b = b.get();
  operands.v = v.get();
  operands.c = c.get();
  const cudaError_t err = testing_cuda::wgmma_test::run(which, size, operands);
  EXPECT_EQ(err, cudaSuccess) << "wgmma test kernel: " << cudaGetErrorString(err);
  return c.download();
}

constexpr int kSizes[] = {64, 128};

// (a) C = A B^T, A and B [64][K] K-major: the S = Q K^T of the backward.
TEST(Wgmma, SsBothKMajor) {
  SKIP_WITHOUT_GPU();
  for (const int k : kSizes) {
    SCOPED_TRACE("K = " + std::to_string(k));
    const Inputs in{random_matrix(kM, k, 11 + k), random_matrix(64, k, 12 + k), {}};
    EXPECT_TRUE(same_matrix(product(in.a, false, in.b, true), run_case(Case::kSsKMajor, k, in, 64)));
  }
}

// (b) C = A B, A [64][64] in registers, B [64 = k][N] MN-major.
TEST(Wgmma, RsBMnMajor) {
  SKIP_WITHOUT_GPU();
  for (const int n : kSizes) {
    SCOPED_TRACE("N = " + std::to_string(n));
    const Inputs in{random_matrix(kM, 64, 21 + n), random_matrix(64, n, 22 + n), {}};
    EXPECT_TRUE(same_matrix(product(in.a, false, in.b, false), run_case(Case::kRsBMnMajor, n, in, n)));
  }
}

// (c) C = A^T B, A stored [64 = k][64 = m] and B [64 = k][N], both MN-major.
TEST(Wgmma, SsBothMnMajor) {
  SKIP_WITHOUT_GPU();
  for (const int n : kSizes) {
    SCOPED_TRACE("N = " + std::to_string(n));
    const Inputs in{random_matrix(64, kM, 31 + n), random_matrix(64, n, 32 + n), {}};
    EXPECT_TRUE(same_matrix(product(in.a, true, in.b, false), run_case(Case::kSsMnMajor, n, in, n)));
  }
}

// S = A B^T (ss), then C = bf16(S) V with S's accumulator as the rs A operand.
TEST(Wgmma, AccumulatorAsRsOperand) {
  SKIP_WITHOUT_GPU();
  for (const int n : kSizes) {
    SCOPED_TRACE("N = " + std::to_string(n));
    const Inputs in{random_matrix(kM, 64, 41 + n), random_matrix(64, 64, 42 + n), random_matrix(64, n, 43 + n)};
    const Matrix s = product(in.a, false, in.b, true);
    const Matrix s_bf16 = rounded_to_bf16(s);
    ASSERT_NE(s.values, s_bf16.values) << "S should need rounding, or the test misses the pack's rounding";
    EXPECT_TRUE(same_matrix(product(s_bf16, false, in.v, false), run_case(Case::kChain, n, in, n)));
  }
}

// (d) C = A B[:, 64..127], A [64][K] K-major, B [K][128] MN-major: the
// key-outer kernel's dQ = t K (t K-major, K's rows the contraction).
TEST(Wgmma, SsAKMajorBMnMajorSecondColumnBlock) {
  SKIP_WITHOUT_GPU();
  for (const int k : kSizes) {
    SCOPED_TRACE("K = " + std::to_string(k));
    const Inputs in{random_matrix(kM, k, 51 + k), random_matrix(k, 128, 52 + k), {}};
    Matrix right{k, 64, std::vector<float>(static_cast<size_t>(k) * 64)};
    for (int r = 0; r < k; ++r) {
      for (int c = 0; c < 64; ++c) right.values[static_cast<size_t>(r) * 64 + c] = in.b.at(r, 64 + c);
    }
    EXPECT_TRUE(same_matrix(product(in.a, false, right, false), run_case(Case::kSsKMajorAMnMajorB, k, in, 64)));
  }
}

// C = A B, B [K][64], as two m64n32k16 halves with B MN-major: the second
// half's descriptor starts 64 bytes into the swizzled 128-byte rows (the
// warp-specialized key-outer kernel's dQ at D = 64).
TEST(Wgmma, SsN32HalvesOfAnMnMajorTile) {
  SKIP_WITHOUT_GPU();
  for (const int k : kSizes) {
    SCOPED_TRACE("K = " + std::to_string(k));
    const Inputs in{random_matrix(kM, k, 81 + k), random_matrix(k, 64, 82 + k), {}};
    EXPECT_TRUE(same_matrix(product(in.a, false, in.b, false), run_case(Case::kSsN32Halves, k, in, 64)));
  }
}

// (e) C = A B^T, B [8][K] (m64n8k16), both K-major; with B all ones every
// column of C is A's row sums: pivot's rho in the key-outer kernels.
TEST(Wgmma, SsN8AndRowSums) {
  SKIP_WITHOUT_GPU();
  for (const int k : kSizes) {
    SCOPED_TRACE("K = " + std::to_string(k));
    const Inputs in{random_matrix(kM, k, 61 + k), random_matrix(8, k, 62 + k), {}};
    EXPECT_TRUE(same_matrix(product(in.a, false, in.b, true), run_case(Case::kSsN8, k, in, 8)));
    const Inputs ones{in.a, Matrix{8, k, std::vector<float>(static_cast<size_t>(8) * k, 1.0f)}, {}};
    Matrix sums{kM, 8, std::vector<float>(static_cast<size_t>(kM) * 8)};
    for (int r = 0; r < kM; ++r) {
      float sum = 0.0f;  // exact: multiples of 1/4, |sum| <= 256
      for (int c = 0; c < k; ++c) sum += in.a.at(r, c);
      for (int c = 0; c < 8; ++c) sums.values[static_cast<size_t>(r) * 8 + c] = sum;
    }
    EXPECT_TRUE(same_matrix(sums, run_case(Case::kSsN8, k, ones, 8)));
  }
}

// S = A B^T stored to a tile by store_accumulator_tile (stmatrix.x4), then
// C = bf16(S)^T V with the tile as the MN-major A operand: the store's
// fragment-to-tile layout, swizzle and BF16 rounding, as dV and dK read it.
TEST(Wgmma, StoredAccumulatorTileAsMnMajorOperand) {
  SKIP_WITHOUT_GPU();
  for (const int n : kSizes) {
    SCOPED_TRACE("N = " + std::to_string(n));
    const Inputs in{random_matrix(kM, 64, 71 + n), random_matrix(64, 64, 72 + n), random_matrix(64, n, 73 + n)};
    const Matrix s_bf16 = rounded_to_bf16(product(in.a, false, in.b, true));
    EXPECT_TRUE(same_matrix(product(s_bf16, true, in.v, false), run_case(Case::kStoredTile, n, in, n)));
  }
}

TEST(Wgmma, RejectsOtherSizes) {
  SKIP_WITHOUT_GPU();
  EXPECT_EQ(testing_cuda::wgmma_test::run(Case::kSsKMajor, 96, {}), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace gaugewatch
