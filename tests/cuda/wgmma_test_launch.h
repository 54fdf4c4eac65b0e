#pragma once
// The launcher of the wgmma primitive tests (wgmma_test.cpp), one definition
// per build: wgmma_test_gpu.cu (<<<>>> on an sm_90a GPU) and
// emulation/wgmma_test_launcher.cpp (the CPU emulation). Each case is one
// block of one warpgroup (kernels in wgmma_test_kernels.cuh); matrices are
// row-major BF16 bits in, FP32 out, all in device memory.

#include <cuda_runtime.h>

#include <cstdint>

namespace gaugewatch::testing_cuda::wgmma_test {

enum class Case {
  kSsKMajor,   // C[64][64] = A[64][size] B[64][size]^T: ss, both operands K-major
  kRsBMnMajor, // C[64][size] = A[64][64] B[64][size]: A in registers, B MN-major
  kSsMnMajor,  // C[64][size] = A[64][64]^T B[64][size]: ss, both operands MN-major
  kChain,      // C[64][size] = bf16(A[64][64] B[64][64]^T) V[64][size]: the
               // kSsKMajor accumulator fed as the A registers of kRsBMnMajor
  kSsKMajorAMnMajorB,  // C[64][64] = A[64][size] B[size][128][:, 64..127]: ss, A
                       // K-major, B MN-major from its second 64-column block
                       // (the key-outer kernel's dQ = t K at D = 128)
  kSsN32Halves,  // C[64][64] = A[64][size] B[size][64] as two m64n32k16
                 // halves: ss, A K-major, B MN-major from 0 and 64 bytes into
                 // its rows (the warp-specialized key-outer kernel's dQ at D = 64)
  kSsN8,  // C[64][8] = A[64][size] B[8][size]^T: m64n8k16, ss, both K-major
          // (pivot's row sums of t against a tile of ones in the key-outer kernels)
  kStoredTile,  // C[64][size] = bf16(A[64][64] B[64][64]^T)^T V[64][size]: the
                // kSsKMajor accumulator stored by store_accumulator_tile, then
                // read as the MN-major A operand (the key-outer kernels' r and
                // t tiles in dV and dK)
};

struct Operands {
  const uint16_t* a = nullptr;
  const uint16_t* b = nullptr;
  const uint16_t* v = nullptr;  // kChain only
  float* c = nullptr;
};

// Runs one case, size 64 or 128, and waits for it (cudaErrorInvalidValue for
// another size).
cudaError_t run(Case which, int size, const Operands& operands);

}  // namespace gaugewatch::testing_cuda::wgmma_test
