// torchrun's error-file format, written atomically (see error_file.hpp).
#include "ddp/worker/error_file.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace ddp::worker {

bool write_error_file(const std::string& path, const std::string& error_type,
                      const std::string& what, const std::string& trace) {
  if (path.empty()) return true;
  const auto now = std::chrono::duration_cast<std::chrono::seconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  nlohmann::json j = {
      {"message",
       {{"message", error_type + ": " + what},
        {"extraInfo", {{"py_callstack", trace}, {"timestamp", std::to_string(now)}}}}}};
  const std::string text = j.dump();
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "we");  // close-on-exec
  if (f == nullptr) return false;
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  ok = std::fclose(f) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return false;
  }
  return true;
}

}  // namespace ddp::worker
