#pragma once
// The byte layout agent_logic_fuzz reads, shared with the seed generator
// (agent_fuzz_seeds.cpp) so that the committed seeds speak it.
//
//   byte 0       the part under test: kController or kHttp (modulo kTargetCount)
//   kController  records until the input ends, each
//                  1 byte   (action << 2) | trainer stream slot (0..3)
//                  2 bytes  body length, little endian (cut to what is left)
//                  body     a serialized protobuf message (which one: Action)
//   kHttp        the raw bytes sent to the agent's HTTP port
//
// libFuzzer mutates the bytes of the bodies; the seeds start every body as a
// valid message, so mutations explore fields rather than framing.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <google/protobuf/message_lite.h>

namespace gaugewatch::agent::fuzz {

enum class Target : std::uint8_t { kController = 0, kHttp = 1, kCount = 2 };

enum class Action : std::uint8_t {
  kMessage = 0,  // TrainerMessage on the slot's stream (unparseable: refused as the transport does)
  kAck = 1,      // CommandAck whose command_id picks one of the slot's pending commands
  kReconnect = 2,  // the slot's stream ends; a new one opens
  kExpire = 3,     // the housekeeping pass: silent ranks expire
  kQuery = 4,      // ListRunsRequest: list_runs, status and list_decisions
  kDecide = 5,     // SetBackendRequest: an operator's switch, checked as the admin service checks it
  kCount = 6,
};

inline constexpr unsigned kStreams = 4;

class RecordWriter {
 public:
  explicit RecordWriter(Target target) { bytes_.push_back(static_cast<char>(target)); }
  RecordWriter& add(Action action, unsigned stream, std::string_view body = {}) {
    bytes_.push_back(static_cast<char>((static_cast<unsigned>(action) << 2) | (stream % kStreams)));
    const std::size_t size = body.size() > 0xffff ? 0xffff : body.size();
    bytes_.push_back(static_cast<char>(size & 0xff));
    bytes_.push_back(static_cast<char>(size >> 8));
    bytes_.append(body.substr(0, size));
    return *this;
  }
  RecordWriter& add(Action action, unsigned stream, const google::protobuf::MessageLite& body) {
    return add(action, stream, body.SerializeAsString());
  }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

struct Record {
  Action action = Action::kMessage;
  unsigned stream = 0;
  std::string_view body;
};

// Reads the records after the target byte.
class RecordReader {
 public:
  RecordReader(const std::uint8_t* data, std::size_t size)
      : data_(reinterpret_cast<const char*>(data)), size_(size) {}
  bool next(Record& record) {
    if (size_ - offset_ < 3) return false;
    const auto op = static_cast<std::uint8_t>(data_[offset_]);
    std::size_t length = static_cast<std::uint8_t>(data_[offset_ + 1]) |
                         (static_cast<std::size_t>(static_cast<std::uint8_t>(data_[offset_ + 2])) << 8);
    offset_ += 3;
    if (length > size_ - offset_) length = size_ - offset_;
    record.action = static_cast<Action>((op >> 2) % static_cast<unsigned>(Action::kCount));
    record.stream = op % kStreams;
    record.body = std::string_view(data_ + offset_, length);
    offset_ += length;
    return true;
  }

 private:
  const char* data_;
  std::size_t size_;
  std::size_t offset_ = 0;
};

}  // namespace gaugewatch::agent::fuzz
