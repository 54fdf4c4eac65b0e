#pragma once
// Shared by the CUDA kernel tests (GPU and CPU emulation builds): why a test
// cannot run, and an owning device buffer whose CUDA errors fail the test
// instead of aborting it.

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <vector>

namespace gaugewatch::testing_cuda {

// Why no test can run, or "" when a CUDA device is present.
inline std::string gpu_unavailable_reason() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(err);
  if (count == 0) return "no CUDA device";
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return "cudaGetDeviceProperties failed";
  if (prop.major < 9) return "kernels are built for sm_90a; device is sm_" + std::to_string(prop.major * 10 + prop.minor);
  return "";
}

#define SKIP_WITHOUT_GPU()                                         \
  do {                                                             \
    const std::string reason = ::gaugewatch::testing_cuda::gpu_unavailable_reason();           \
    if (!reason.empty()) {                                         \
      GTEST_SKIP() << reason;                                      \
    }                                                              \
  } while (0)

// Owns one device allocation; the test fails (not aborts) on CUDA errors.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t count) : count_(count) {
    if (count_ > 0) {
      const cudaError_t err = cudaMalloc(&ptr_, count_ * sizeof(T));
      EXPECT_EQ(err, cudaSuccess) << "cudaMalloc: " << cudaGetErrorString(err);
      if (err != cudaSuccess) ptr_ = nullptr;
    }
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  T* get() const { return ptr_; }
  size_t size() const { return count_; }
  void upload(const std::vector<T>& host) {
    if (count_ == 0 || ptr_ == nullptr) return;
    const cudaError_t err = cudaMemcpy(ptr_, host.data(), count_ * sizeof(T), cudaMemcpyHostToDevice);
    EXPECT_EQ(err, cudaSuccess) << "upload: " << cudaGetErrorString(err);
  }
  std::vector<T> download() const {
    std::vector<T> host(count_);
    if (count_ == 0 || ptr_ == nullptr) return host;
    const cudaError_t err = cudaMemcpy(host.data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost);
    EXPECT_EQ(err, cudaSuccess) << "download: " << cudaGetErrorString(err);
    return host;
  }
  // Every byte set to `byte` (by default 0xff: NaN in float).
  void poison(int byte = 0xff) {
    if (count_ > 0 && ptr_ != nullptr) {
      EXPECT_EQ(cudaMemset(ptr_, byte, count_ * sizeof(T)), cudaSuccess);
    }
  }

 private:
  size_t count_ = 0;
  T* ptr_ = nullptr;
};

}  // namespace gaugewatch::testing_cuda
