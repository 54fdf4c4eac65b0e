// A structure-aware mutator for agent_logic_fuzz (libFuzzer's
// LLVMFuzzerCustomMutator): controller inputs are mutated record by record
// (logic_fuzz_input.h) so that the framing stays intact: a record's body
// mutated by libFuzzer, its action or stream changed, a record duplicated or
// dropped. HTTP inputs, and one controller input in eight, get libFuzzer's
// plain byte mutations. Only linked into the libFuzzer build.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/agent/fuzz/logic_fuzz_input.h"

extern "C" std::size_t LLVMFuzzerMutate(std::uint8_t* data, std::size_t size, std::size_t max_size);

namespace {

using namespace gaugewatch::agent::fuzz;

struct OwnedRecord {
  Action action;
  unsigned stream;
  std::string body;
};

}  // namespace

extern "C" std::size_t LLVMFuzzerCustomMutator(std::uint8_t* data, std::size_t size, std::size_t max_size,
                                               unsigned int seed) {
  std::minstd_rand random(seed);
  const bool controller =
      size > 0 && data[0] % static_cast<unsigned>(Target::kCount) == static_cast<unsigned>(Target::kController);
  if (!controller || random() % 8 == 0) return LLVMFuzzerMutate(data, size, max_size);

  std::vector<OwnedRecord> records;
  RecordReader reader(data + 1, size - 1);
  for (Record record; reader.next(record);) records.push_back({record.action, record.stream, std::string(record.body)});
  const auto pick = [&] { return static_cast<std::size_t>(random() % records.size()); };
  switch (records.empty() ? 2 : random() % 4) {
    case 0: {  // the body of one record
      OwnedRecord& record = records[pick()];
      const std::size_t room = std::max<std::size_t>(record.body.size() * 2, 64);
      std::string body = record.body;
      body.resize(room);
      body.resize(LLVMFuzzerMutate(reinterpret_cast<std::uint8_t*>(body.data()), record.body.size(), room));
      record.body = body;
      break;
    }
    case 1: {  // what a record does, and on which stream
      OwnedRecord& record = records[pick()];
      record.action = static_cast<Action>(random() % static_cast<unsigned>(Action::kCount));
      record.stream = static_cast<unsigned>(random() % kStreams);
      break;
    }
    case 2: {  // one more record: a copy of another, or an empty one
      OwnedRecord copy = records.empty()
                             ? OwnedRecord{static_cast<Action>(random() % static_cast<unsigned>(Action::kCount)),
                                           static_cast<unsigned>(random() % kStreams), {}}
                             : records[pick()];
      records.insert(records.begin() + static_cast<std::ptrdiff_t>(records.empty() ? 0 : pick()), copy);
      break;
    }
    default:  // one record fewer
      records.erase(records.begin() + static_cast<std::ptrdiff_t>(pick()));
      break;
  }
  RecordWriter writer(Target::kController);
  for (const auto& record : records) writer.add(record.action, record.stream, record.body);
  if (writer.bytes().size() > max_size) return LLVMFuzzerMutate(data, size, max_size);
  std::memcpy(data, writer.bytes().data(), writer.bytes().size());
  return writer.bytes().size();
}
