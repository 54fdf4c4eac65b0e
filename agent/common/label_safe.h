#pragma once
// The characters a run id may use, so it is safe as a Prometheus label value,
// a file name part and a log field: [A-Za-z0-9_.:-]{1,max_bytes}.

#include <cstddef>
#include <string_view>

namespace gaugewatch::agent {

inline bool is_label_safe(std::string_view text, std::size_t max_bytes) {
  if (text.empty() || text.size() > max_bytes) return false;
  for (unsigned char ch : text) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                    ch == '_' || ch == '.' || ch == ':' || ch == '-';
    if (!ok) return false;
  }
  return true;
}

}  // namespace gaugewatch::agent
