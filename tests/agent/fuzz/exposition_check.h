#pragma once
// Invariants of a /metrics body (Prometheus text format 0.0.4) for the fuzz
// targets: every line is a HELP or TYPE comment or a sample of the family the
// last TYPE declared, label values are quoted and escaped, every value is a
// number, no value is NaN or infinite, counters and histogram parts are >= 0.
// Returns "" when the text holds, else the first broken line and why.

#include <cmath>
#include <cstdlib>
#include <string>
#include <string_view>

namespace gaugewatch::agent::fuzz {

inline bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':'; }
inline bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }

// Reads a metric or label name at `pos`; returns its length (0: none).
inline std::size_t name_length(std::string_view line, std::size_t pos) {
  if (pos >= line.size() || !is_name_start(line[pos])) return 0;
  std::size_t end = pos + 1;
  while (end < line.size() && is_name_char(line[end])) ++end;
  return end - pos;
}

inline std::string check_exposition(std::string_view text) {
  if (!text.empty() && text.back() != '\n') return "the body does not end with a newline";
  std::string family;       // from the last TYPE line
  std::string family_type;  // counter, gauge, histogram, untyped
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t end = text.find('\n', start);
    const std::string_view line = text.substr(start, end - start);
    start = end + 1;
    const auto broken = [&](const std::string& why) { return std::string(line) + ": " + why; };
    if (line.empty()) return broken("empty line");
    if (line[0] == '#') {
      const bool help = line.rfind("# HELP ", 0) == 0;
      const bool type = line.rfind("# TYPE ", 0) == 0;
      if (!help && !type) return broken("a comment that is neither HELP nor TYPE");
      const std::size_t length = name_length(line, 7);
      if (length == 0 || line.size() <= 7 + length || line[7 + length] != ' ') return broken("no metric name");
      if (type) {
        family = std::string(line.substr(7, length));
        family_type = std::string(line.substr(8 + length));
        if (family_type != "counter" && family_type != "gauge" && family_type != "histogram" &&
            family_type != "untyped" && family_type != "summary") {
          return broken("unknown type");
        }
      }
      continue;
    }
    const std::size_t length = name_length(line, 0);
    if (length == 0) return broken("no metric name");
    const std::string_view name = line.substr(0, length);
    std::string_view suffix;
    if (family.empty() || name.substr(0, family.size()) != family) return broken("sample outside its family");
    suffix = name.substr(family.size());
    if (!suffix.empty() && !(family_type == "histogram" && (suffix == "_bucket" || suffix == "_sum" || suffix == "_count")) &&
        !(family_type == "counter" && suffix == "_total")) {
      return broken("sample name does not match family " + family);
    }
    std::size_t pos = length;
    if (pos < line.size() && line[pos] == '{') {
      ++pos;
      while (pos < line.size() && line[pos] != '}') {
        const std::size_t label = name_length(line, pos);
        if (label == 0) return broken("bad label name");
        pos += label;
        if (line.substr(pos, 2) != "=\"") return broken("label without =\"");
        pos += 2;
        while (pos < line.size() && line[pos] != '"') {
          if (line[pos] == '\\') {
            if (pos + 1 >= line.size() || (line[pos + 1] != '\\' && line[pos + 1] != '"' && line[pos + 1] != 'n')) {
              return broken("bad escape in a label value");
            }
            ++pos;
          }
          ++pos;
        }
        if (pos >= line.size()) return broken("unterminated label value");
        ++pos;  // closing quote
        if (pos < line.size() && line[pos] == ',') ++pos;
      }
      if (pos >= line.size()) return broken("unterminated label set");
      ++pos;  // '}'
    }
    if (pos >= line.size() || line[pos] != ' ') return broken("no space before the value");
    const std::string value(line.substr(pos + 1));
    if (value.find(' ') != std::string::npos) return broken("a timestamp (the agent sends none)");
    char* parsed_end = nullptr;
    const double number = std::strtod(value.c_str(), &parsed_end);
    if (value.empty() || parsed_end != value.c_str() + value.size()) return broken("value is not a number");
    if (!std::isfinite(number)) return broken("value is NaN or infinite");
    if ((family_type == "counter" || family_type == "histogram") && number < 0) return broken("negative count");
  }
  return "";
}

}  // namespace gaugewatch::agent::fuzz
