#pragma once
// The loop every CPU backend shares: visit each query row of each (batch,
// key/value head) pair once, with per-chunk accumulators for the quantities
// that sum over rows (dK, dV and their corrections).
//
// Rows of a pair are (query head in the GQA group, n): group * N rows. They
// are cut into a number of chunks that depends only on the shape, chunks run
// in parallel, and each chunk's accumulator is folded into the result in
// chunk order. So the FP32 summation order, and every result bit, is the same
// whatever the thread count.

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "kernels/reference/attention_problem.h"
#include "kernels/reference/parallel.h"

namespace gaugewatch::reference {

// Rows below which a pair is one chunk (and pairs run in parallel instead).
inline constexpr int64_t kRowsPerChunkThreshold = 2048;
inline constexpr int64_t kChunksPerLargePair = 8;

// make(): a fresh accumulator; row(acc, b, h, n): one query row of query head
// h; fold(acc, b, hk): add a finished chunk into the output of pair (b, hk),
// called in chunk order and never concurrently with another fold.
template <typename Make, typename Row, typename Fold>
void sweep_rows(const AttentionShape& s, Make make, Row row, Fold fold) {
  const int64_t group = s.group();
  const int64_t rows = group * s.q_len;
  const int64_t pairs = s.batch * s.kv_heads;

  auto run_chunk = [&](int64_t pair, int64_t chunk, int64_t chunks, auto& acc) {
    const int64_t b = pair / s.kv_heads;
    const int64_t hk = pair % s.kv_heads;
    const int64_t begin = rows * chunk / chunks;
    const int64_t end = rows * (chunk + 1) / chunks;
    for (int64_t r = begin; r < end; ++r) {
      row(acc, b, hk * group + r / s.q_len, r % s.q_len);
    }
  };

  if (rows < kRowsPerChunkThreshold) {
    std::mutex fold_mutex;  // folds may also touch per-call scalars (maxima)
    parallel_for(pairs, [&](int64_t pair) {
      auto acc = make();
      run_chunk(pair, 0, 1, acc);
      std::lock_guard lock(fold_mutex);
      fold(acc, pair / s.kv_heads, pair % s.kv_heads);
    });
    return;
  }
  const int64_t chunks = std::min(kChunksPerLargePair, rows);
  for (int64_t pair = 0; pair < pairs; ++pair) {
    // Chunks are handed out in increasing order, so waiting for the previous
    // chunk's fold never deadlocks.
    std::mutex mutex;
    std::condition_variable turn;
    int64_t next_fold = 0;
    parallel_for(chunks, [&](int64_t chunk) {
      auto acc = make();
      run_chunk(pair, chunk, chunks, acc);
      std::unique_lock lock(mutex);
      turn.wait(lock, [&] { return next_fold == chunk; });
      fold(acc, pair / s.kv_heads, pair % s.kv_heads);
      ++next_fold;
      turn.notify_all();
    });
  }
}

}  // namespace gaugewatch::reference
