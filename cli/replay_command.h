#pragma once
// `gaugewatch audit --input FILE --device cpu|cuda`: replays one captured
// attention call through every backward the machine has (SDPA's flash,
// cuDNN, efficient and math; gaugewatch's bf16, gproj, pivot, center and
// fp32 ops) and prints each one's dQ/dK/dV error against FP64 and its time.
// SDPA's backwards exist only inside PyTorch, so the sweep is
// tools/replay_capture.py, run by the Python that has torch; this verb finds
// it, the ops library of this build or install, and hands over.

#include <string>

namespace gaugewatch::cli {

struct ReplayOptions {
  std::string input;
  std::string device;  // "cpu" or "cuda"
  long repeat = 20;
  bool json = false;
};

// Replaces this process with the replay (exec); returns only on failure,
// with the exit code to use after printing why.
int run_replay(const ReplayOptions& options);

}  // namespace gaugewatch::cli
