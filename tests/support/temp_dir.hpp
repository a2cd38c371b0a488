// A fresh folder under /tmp for one test, removed with everything in it at the end.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <system_error>

namespace ddp::test {

struct TempDir {
  std::string path;
  // `prefix` names the test in /tmp ("ddp_lm_data" gives /tmp/ddp_lm_data_XXXXXX).
  explicit TempDir(const std::string& prefix) {
    std::string tmpl = "/tmp/" + prefix + "_XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp " + tmpl + " failed");
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  // Writes `text` to the file `name` in the folder; its path.
  std::string write(const std::string& name, const std::string& text) const {
    const std::string p = path + "/" + name;
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
};

}  // namespace ddp::test
