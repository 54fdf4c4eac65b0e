#pragma once
// Small dense kernels the CPU reference is built from. Dot products keep
// eight independent partial sums so the compiler vectorizes them without
// -ffast-math; the order is fixed, so results are deterministic.

#include <cmath>
#include <cstdint>

namespace gaugewatch::reference {

template <typename Acc, typename A, typename B>
inline Acc dot(const A* a, const B* b, int64_t n) {
  constexpr int kLanes = 8;
  Acc partial[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      partial[l] += static_cast<Acc>(a[i + l]) * static_cast<Acc>(b[i + l]);
    }
  }
  Acc tail = 0;
  for (; i < n; ++i) tail += static_cast<Acc>(a[i]) * static_cast<Acc>(b[i]);
  Acc sum = tail;
  for (int l = 0; l < kLanes; ++l) sum += partial[l];
  return sum;
}

// y += a * x
template <typename Acc, typename X>
inline void axpy(Acc a, const X* x, Acc* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * static_cast<Acc>(x[i]);
}

}  // namespace gaugewatch::reference
