#pragma once
// The bearer token in a token file, as every reader (agent, gaugewatchctl)
// takes it: surrounding whitespace dropped (so "token\r\n" from an editor on
// Windows works), and anything that cannot travel in an HTTP/2 header value
// refused with a message instead of aborting inside gRPC.

#include <stdexcept>
#include <string>
#include <string_view>

namespace gaugewatch::agent {

inline std::string token_from_file_contents(std::string_view contents, std::string_view what) {
  const auto space = [](char ch) { return ch == ' ' || ch == '\t' || ch == '\r' || ch == '\n'; };
  while (!contents.empty() && space(contents.front())) contents.remove_prefix(1);
  while (!contents.empty() && space(contents.back())) contents.remove_suffix(1);
  for (const char ch : contents) {
    const auto byte = static_cast<unsigned char>(ch);
    if (byte < 0x21 || byte > 0x7e) {
      throw std::invalid_argument(std::string(what) +
                                  ": the token must be one line of printable ASCII without spaces");
    }
  }
  return std::string(contents);
}

}  // namespace gaugewatch::agent
