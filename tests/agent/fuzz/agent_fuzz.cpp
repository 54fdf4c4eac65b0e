// libFuzzer target over everything the agent parses from outside: trainer
// messages (protobuf bytes -> validation -> metric extraction), the YAML
// configuration and the command line (CLI11). The first byte picks the parser;
// the seeds (tests/agent/fuzz/corpus) hold every message type
// (agent_fuzz_seeds.cpp). agent_logic_fuzz goes past the parsers.
//
// Build: -DGAUGEWATCH_ENABLE_FUZZ=ON with clang; run: agent_fuzz CORPUS_DIR
// (CTest runs it for a bounded time, see tests/agent/CMakeLists.txt).

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <google/protobuf/stubs/logging.h>

#include "agent/config/agent_config.h"
#include "agent/server/message_validator.h"
#include "agent/state/metric_fields.h"
#include "gaugewatch/v1/hook_service.pb.h"

namespace {

using namespace gaugewatch::agent;
namespace v1 = gaugewatch::v1;

void fuzz_message(const std::uint8_t* data, std::size_t size) {
  v1::TrainerMessage message;
  if (!message.ParseFromArray(data, static_cast<int>(size))) return;
  Limits limits;
  limits.max_layers = 64;
  limits.max_batch_samples = 64;
  switch (message.payload_case()) {
    case v1::TrainerMessage::kHello:
      (void)validate_hello(message.hello(), limits);
      break;
    case v1::TrainerMessage::kSamples:
      for (std::uint32_t layers : {0u, 1u, 64u}) {
        const Verdict verdict = validate_batch(message.samples(), layers, limits);
        if (verdict.ok()) {
          // What the agent does with an accepted batch.
          for (const auto& sample : message.samples().samples()) {
            const MetricValues values = to_values(sample.metrics());
            v1::LayerMetrics round_trip;
            to_proto(values, round_trip);
            if (round_trip.ByteSizeLong() > sample.metrics().ByteSizeLong()) __builtin_trap();
          }
        }
      }
      break;
    case v1::TrainerMessage::kAck:
      (void)validate_ack(message.ack());
      break;
    default:
      break;
  }
}

void fuzz_yaml(const std::uint8_t* data, std::size_t size) {
  AgentConfig config;
  try {
    apply_yaml(std::string_view(reinterpret_cast<const char*>(data), size), config);
    (void)effective_rules(config);
    check_config(config);
  } catch (const ConfigError&) {
  }
}

void fuzz_flags(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> args;
  std::string current;
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      args.push_back(current);
      current.clear();
    } else {
      current += static_cast<char>(data[i]);
    }
  }
  args.push_back(current);
  for (const auto& arg : args) {
    // These two read files; the fuzzer must not wander the file system.
    if (arg.find("config") != std::string::npos || arg.find("token") != std::string::npos) return;
  }
  CommandLine command_line;
  try {
    (void)load_config(args, [](const char*) -> const char* { return nullptr; }, command_line);
  } catch (const ConfigError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // protobuf logs every string field that is not UTF-8; the fuzzer makes many.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  switch (data[0] % 3) {
    case 0: fuzz_message(data + 1, size - 1); break;
    case 1: fuzz_yaml(data + 1, size - 1); break;
    default: fuzz_flags(data + 1, size - 1); break;
  }
  return 0;
}
