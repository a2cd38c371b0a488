// ddp-train's snapshot file (format in docs/ddp_train.md): magic, a JSON header, the parameters,
// the optimizer state and an FNV-1a 64 checksum. Encoding and parsing are pure; the file is
// written atomically (temporary file, fsync, rename, fsync of the folder).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::train {

struct SnapshotHeader {
  std::string model;
  std::string optimizer;
  std::int64_t epoch = 0;  // the next epoch to run
  std::int64_t step = 0;   // the next batch in that epoch
  std::int64_t global_step = 0;
  std::int64_t adam_t = 0;
  std::uint64_t seed = 0;
  double lr = 0;
  int world_size = 1;
  int batch_size = 0;
};

struct Snapshot {
  SnapshotHeader header;
  std::vector<float> params;
  std::vector<float> opt_state;
};

// The header's fields as JSON and back (header_from_json throws nlohmann::json::exception for
// a missing or mistyped field): one definition for the replicated file and the sharded index.
nlohmann::json header_json(const SnapshotHeader& h);
SnapshotHeader header_from_json(const nlohmann::json& j);

std::uint64_t fnv1a64(const void* data, std::size_t n, std::uint64_t h = 0xcbf29ce484222325ull);

std::string encode_snapshot(const Snapshot& s);
// Throws ddp::ConfigError "<name>: ..." naming what is wrong (magic, header, sizes, checksum).
Snapshot decode_snapshot(std::string_view bytes, const std::string& name);

// Writes the chunks one after another to `path` atomically: a temporary file `.<name>.tmp.<pid>`
// in the same folder, fsync, rename, fsync of the folder. IoError messages start with `what`.
// One process writes a path at a time (rank 0, or each rank its shard), so the temporary files
// of that path left by writers that died (`.<name>.tmp.*`) are removed first.
void write_file_atomically(const std::string& path, const std::vector<std::string_view>& chunks,
                           const std::string& what);
// Tests only (DDP_TRAIN_FAULT's kill@snapshot): called by the next write_file_atomically once
// every byte is in the temporary file, before the rename that commits it; then forgotten.
void set_before_commit_hook(std::function<void()> hook);

void write_snapshot_file(const std::string& path, const Snapshot& s);
// nullopt when the file does not exist; throws ConfigError when it cannot be read or is bad.
std::optional<Snapshot> read_snapshot_file(const std::string& path);

}  // namespace ddp::train
