#pragma once
// A fresh directory under $TMPDIR (or /tmp), removed with its contents.
// Unix socket paths must stay under 108 bytes, so the name is short.

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace gaugewatch::agent {

class TempDir {
 public:
  TempDir() {
    std::string pattern = "/tmp/gwa-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace gaugewatch::agent
