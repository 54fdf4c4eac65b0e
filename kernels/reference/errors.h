#pragma once
// Error measures used by tests, the audit table and the metrics.

#include <cmath>
#include <cstdint>
#include <vector>

namespace gaugewatch::reference {

// ||x - ref|| / ||ref|| (Frobenius). When ||ref|| is 0 (e.g. every row sees a
// single key, so the exact gradient vanishes) the absolute norm ||x|| is
// returned instead: the gradient should then be exactly zero too.
template <typename X, typename R>
double relative_error(const std::vector<X>& x, const std::vector<R>& ref) {
  long double diff = 0, norm = 0;
  const size_t n = x.size() < ref.size() ? x.size() : ref.size();
  for (size_t i = 0; i < n; ++i) {
    const long double d = static_cast<long double>(x[i]) - static_cast<long double>(ref[i]);
    diff += d * d;
    norm += static_cast<long double>(ref[i]) * static_cast<long double>(ref[i]);
  }
  if (x.size() != ref.size()) return INFINITY;
  if (norm == 0) return static_cast<double>(std::sqrt(diff));
  return static_cast<double>(std::sqrt(diff / norm));
}

}  // namespace gaugewatch::reference
