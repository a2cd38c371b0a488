// Snapshot encoding, checking and atomic writing (see snapshot.hpp).
#include "snapshot.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <utility>
#include <nlohmann/json.hpp>

#include "ddp/proto/error.hpp"

namespace ddp::train {
namespace {

constexpr char kMagic[8] = {'D', 'D', 'P', 'S', 'N', 'A', 'P', '1'};

void put_u32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_u64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
std::uint64_t get_le(std::string_view b, std::size_t off, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) {
    v |= std::uint64_t{static_cast<std::uint8_t>(b[off + static_cast<std::size_t>(i)])} << (8 * i);
  }
  return v;
}

}  // namespace

std::uint64_t fnv1a64(const void* data, std::size_t n, std::uint64_t h) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  for (std::size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

nlohmann::json header_json(const SnapshotHeader& h) {
  return {{"model", h.model},
          {"optimizer", h.optimizer},
          {"epoch", h.epoch},
          {"step", h.step},
          {"global_step", h.global_step},
          {"adam_t", h.adam_t},
          {"seed", h.seed},
          {"lr", h.lr},
          {"world_size", h.world_size},
          {"batch_size", h.batch_size}};
}

SnapshotHeader header_from_json(const nlohmann::json& j) {
  SnapshotHeader h;
  h.model = j.at("model").get<std::string>();
  h.optimizer = j.at("optimizer").get<std::string>();
  h.epoch = j.at("epoch").get<std::int64_t>();
  h.step = j.at("step").get<std::int64_t>();
  h.global_step = j.at("global_step").get<std::int64_t>();
  h.adam_t = j.at("adam_t").get<std::int64_t>();
  h.seed = j.at("seed").get<std::uint64_t>();
  h.lr = j.at("lr").get<double>();
  h.world_size = j.at("world_size").get<int>();
  h.batch_size = j.at("batch_size").get<int>();
  return h;
}

std::string encode_snapshot(const Snapshot& s) {
  nlohmann::json j = header_json(s.header);  // keys are written sorted, as before
  j["params"] = s.params.size();
  j["opt_state"] = s.opt_state.size();
  const std::string header = j.dump();
  std::string out(kMagic, sizeof kMagic);
  put_u32(out, static_cast<std::uint32_t>(header.size()));
  out += header;
  // f32 little-endian: the in-memory layout on the machines we build for.
  static_assert(sizeof(float) == 4);
  if (!s.params.empty()) {
    out.append(reinterpret_cast<const char*>(s.params.data()), s.params.size() * 4);
  }
  if (!s.opt_state.empty()) {
    out.append(reinterpret_cast<const char*>(s.opt_state.data()), s.opt_state.size() * 4);
  }
  put_u64(out, fnv1a64(out.data(), out.size()));
  return out;
}

Snapshot decode_snapshot(std::string_view b, const std::string& name) {
  auto bad = [&](const std::string& what) {
    return ConfigError(std::string("snapshot ").append(name).append(": ").append(what));
  };
  if (b.size() < 8 + 4 + 8 || std::memcmp(b.data(), kMagic, 8) != 0) {
    throw bad("not a ddp-train snapshot (no DDPSNAP1 magic)");
  }
  const std::uint64_t stored = get_le(b, b.size() - 8, 8);
  if (fnv1a64(b.data(), b.size() - 8) != stored) {
    throw bad("checksum mismatch (truncated or corrupt file)");
  }
  const std::size_t hlen = get_le(b, 8, 4);
  if (12 + hlen + 8 > b.size())
    throw bad("header length " + std::to_string(hlen) + " runs past the end");
  Snapshot s;
  nlohmann::json j;
  std::size_t np = 0;
  std::size_t ns = 0;
  try {
    j = nlohmann::json::parse(b.substr(12, hlen));
    s.header = header_from_json(j);
    np = j.at("params").get<std::size_t>();
    ns = j.at("opt_state").get<std::size_t>();
  } catch (const nlohmann::json::exception& e) {
    throw bad(std::string("bad header: ") + e.what());
  }
  if (s.header.epoch < 0 || s.header.step < 0 || s.header.global_step < 0) {
    throw bad("negative epoch, step or global_step in the header");
  }
  const std::size_t body = b.size() - 12 - hlen - 8;
  if (np > body / 4 || ns > body / 4 || (np + ns) * 4 != body) {
    throw bad("the header says " + std::to_string(np) + " + " + std::to_string(ns) +
              " floats, the file holds " + std::to_string(body) + " bytes");
  }
  s.params.resize(np);
  s.opt_state.resize(ns);
  // An empty vector's data() may be null, which memcpy must not get even for 0 bytes.
  if (np > 0) std::memcpy(s.params.data(), b.data() + 12 + hlen, np * 4);
  if (ns > 0) std::memcpy(s.opt_state.data(), b.data() + 12 + hlen + np * 4, ns * 4);
  return s;
}

namespace {
std::function<void()>& before_commit_hook() {
  static std::function<void()> hook;
  return hook;
}

// Removes `.<name>.tmp.*` in dir: what writers of this path that died left.
void remove_stale_temporaries(const std::filesystem::path& dir, const std::string& prefix) {
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.starts_with(prefix)) std::filesystem::remove(it->path(), ec);
  }
}
}  // namespace

void set_before_commit_hook(std::function<void()> hook) { before_commit_hook() = std::move(hook); }

void write_file_atomically(const std::string& path, const std::vector<std::string_view>& chunks,
                           const std::string& what) {
  namespace fs = std::filesystem;
  fs::path target(path);
  fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string prefix = "." + target.filename().string() + ".tmp.";
  remove_stale_temporaries(dir, prefix);
  const std::string tmp = (dir / (prefix + std::to_string(::getpid()))).string();
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError(what + ": cannot create " + tmp + ": " + std::strerror(errno));
  for (const std::string_view bytes : chunks) {
    std::size_t off = 0;
    while (off < bytes.size()) {
      const ssize_t n = ::write(fd, bytes.data() + off, bytes.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = errno;
        ::close(fd);
        ::unlink(tmp.c_str());
        throw IoError(what + ": write failed: " + std::strerror(err));
      }
      off += static_cast<std::size_t>(n);
    }
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw IoError(what + ": fsync/close failed: " + std::strerror(errno));
  }
  if (auto hook = std::exchange(before_commit_hook(), nullptr)) hook();
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw IoError(what + ": rename failed: " + std::strerror(err));
  }
  if (int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void write_snapshot_file(const std::string& path, const Snapshot& s) {
  const std::string bytes = encode_snapshot(s);
  write_file_atomically(path, {std::string_view(bytes)}, "snapshot " + path);
}

std::optional<Snapshot> read_snapshot_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (!std::filesystem::exists(path)) return std::nullopt;
    throw ConfigError("snapshot " + path + ": cannot be read");
  }
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return decode_snapshot(bytes, path);
}

}  // namespace ddp::train
