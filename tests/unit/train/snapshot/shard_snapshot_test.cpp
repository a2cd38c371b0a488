// Sharded snapshots: a model written at world 4 reads back at worlds 1 to 8, a replicated one
// reads back sharded, a bad index or shard file is a ConfigError naming it, a commit removes the
// previous step's folder and no write leaves a temporary file behind.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ddp/proto/error.hpp"
#include "support/temp_dir.hpp"
#include "support/layer_slots.hpp"
#include "shard_layout.hpp"
#include "shard_snapshot.hpp"
#include "snapshot.hpp"

namespace fs = std::filesystem;
using namespace ddp::train;
using ddp::test::slots_of;
using ddp::test::TempDir;

namespace {

const std::vector<std::size_t> kSizes = {7, 13, 0, 1, 40};  // an empty and a tiny slot
constexpr int kPieces = 2;

struct Whole {
  std::vector<LayerSlot> slots = slots_of(kSizes);
  std::size_t n = 61;
  std::vector<float> params;
  std::vector<float> state;  // kPieces arrays of n
  explicit Whole(float base) {
    for (std::size_t i = 0; i < n; ++i) params.push_back(base + static_cast<float>(i) + 0.5f);
    for (std::size_t i = 0; i < kPieces * n; ++i) state.push_back(-base - static_cast<float>(i));
  }
  // What rank `layout.rank` holds: its parameters and kPieces arrays of shard_size.
  void shard(const ShardLayout& l, std::vector<float>& p, std::vector<float>& s) const {
    p.assign(l.shard_size, 0.0f);
    s.assign(kPieces * l.shard_size, 0.0f);
    for (std::size_t k = 0; k < slots.size(); ++k) {
      for (std::size_t i = l.lo[k]; i < l.hi[k]; ++i) {
        const std::size_t at = l.local[k] + i - l.lo[k];
        p[at] = params[slots[k].w + i];
        for (std::size_t j = 0; j < kPieces; ++j)
          s[j * l.shard_size + at] = state[j * n + slots[k].w + i];
      }
    }
  }
};

SnapshotHeader header_at(std::int64_t step) {
  SnapshotHeader h;
  h.model = "test-mlp";
  h.optimizer = "adam";
  h.epoch = 2;
  h.step = 3;
  h.global_step = step;
  h.adam_t = step;
  h.seed = 42;
  h.lr = 0.01;
  h.world_size = 4;
  h.batch_size = 8;
  return h;
}

void save_sharded(const std::string& path, const Whole& w, std::int64_t step, int world) {
  std::vector<std::uint64_t> sums;
  for (int r = 0; r < world; ++r) {
    const ShardLayout l = make_shard_layout(w.slots, world, r);
    std::vector<float> p;
    std::vector<float> s;
    w.shard(l, p, s);
    sums.push_back(write_shard_file(path, header_at(step), l, p.data(), s.data(), kPieces));
  }
  commit_sharded_snapshot(path, header_at(step), w.slots, world, kPieces, "fsdp", sums);
}

// Every rank of every world size reads exactly the whole's elements.
void check_reads(const SnapshotReader& r, const Whole& w) {
  for (int world : {1, 2, 3, 4, 5, 8}) {
    for (int rank = 0; rank < world; ++rank) {
      const ShardLayout l = make_shard_layout(w.slots, world, rank);
      std::vector<float> want_p;
      std::vector<float> want_s;
      w.shard(l, want_p, want_s);
      std::vector<float> p(l.shard_size, -1.0f);
      std::vector<float> s(kPieces * l.shard_size, -1.0f);
      r.read_shard(l, p.data(), s.data());
      CHECK(p == want_p);
      CHECK(s == want_s);
      std::vector<float> only(l.shard_size, -1.0f);
      r.read_shard(l, only.data(), nullptr);  // the state skipped
      CHECK(only == want_p);
    }
  }
}

std::string config_error(const std::string& path, const std::vector<LayerSlot>& slots) {
  try {
    SnapshotReader::open(path, slots);
  } catch (const ddp::ConfigError& e) {
    return e.what();
  }
  FAIL("no ConfigError for " << path);
  return "";
}

bool temp_files_in(const std::string& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.path().filename().string().find(".tmp.") != std::string::npos) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("shard snapshot: written at world 4, read at worlds 1 to 8",
          "[unit][train][shard_snapshot]") {
  TempDir dir("ddp_shard_snapshot");
  const std::string path = dir.path + "/ckpt.bin";
  const Whole w(1000.0f);
  CHECK_FALSE(SnapshotReader::open(path, w.slots).has_value());
  save_sharded(path, w, 7, 4);
  CHECK(fs::exists(dir.path + "/ckpt.bin.shards/step-7/rank-3-of-4.bin"));
  CHECK(shard_file_path(path, 7, 3, 4) == dir.path + "/ckpt.bin.shards/step-7/rank-3-of-4.bin");
  auto r = SnapshotReader::open(path, w.slots);
  REQUIRE(r.has_value());
  CHECK(r->sharded());
  CHECK(r->world() == 4);
  CHECK(r->pieces() == kPieces);
  CHECK(r->sharding() == "fsdp");
  CHECK(r->header().model == "test-mlp");
  CHECK(r->header().optimizer == "adam");
  CHECK(r->header().global_step == 7);
  CHECK(r->header().epoch == 2);
  CHECK(r->header().lr == 0.01);
  check_reads(*r, w);

  // Every range of the largest slot, across the old ranks' parts.
  const std::size_t k = 4;
  for (std::size_t lo = 0; lo <= kSizes[k]; ++lo) {
    for (std::size_t hi = lo; hi <= kSizes[k]; ++hi) {
      std::vector<float> p(hi - lo);
      std::vector<float> m(hi - lo);
      std::vector<float> v(hi - lo);
      r->read(k, lo, hi, p.data(), {m.data(), v.data()});
      for (std::size_t i = lo; i < hi; ++i) {
        REQUIRE(p[i - lo] == w.params[w.slots[k].w + i]);
        REQUIRE(v[i - lo] == w.state[w.n + w.slots[k].w + i]);
      }
    }
  }
  float one = 0;
  CHECK_THROWS_AS(r->read(k, 0, 1, &one, {&one}), ddp::ConfigError);  // 1 piece of 2
  CHECK_THROWS_AS(r->read(k, 3, 41, &one, {}), ddp::ConfigError);
  CHECK_FALSE(temp_files_in(dir.path));
}

TEST_CASE("shard snapshot: a replicated snapshot reads back sharded",
          "[unit][train][shard_snapshot]") {
  TempDir dir("ddp_shard_snapshot");
  const std::string path = dir.path + "/replicated.bin";
  const Whole w(-50.0f);
  Snapshot s;
  s.header = header_at(11);
  s.header.world_size = 6;
  s.params = w.params;
  s.opt_state = w.state;
  write_snapshot_file(path, s);
  auto r = SnapshotReader::open(path, w.slots);
  REQUIRE(r.has_value());
  CHECK_FALSE(r->sharded());
  CHECK(r->sharding() == "none");
  CHECK(r->pieces() == kPieces);
  CHECK(r->world() == 6);
  CHECK(r->header().global_step == 11);
  for (int rank = 0; rank < 3; ++rank) {
    const ShardLayout l = make_shard_layout(w.slots, 3, rank);
    std::vector<float> want_p;
    std::vector<float> want_s;
    w.shard(l, want_p, want_s);
    std::vector<float> p(l.shard_size);
    std::vector<float> st(kPieces * l.shard_size);
    r->read_shard(l, p.data(), st.data());
    CHECK(p == want_p);
    CHECK(st == want_s);
  }
  CHECK_THROWS_WITH(SnapshotReader::open(path, slots_of({7, 13, 0, 2, 40})),
                    Catch::Contains(path) && Catch::Contains("61 parameters"));
  CHECK_FALSE(temp_files_in(dir.path));
}

TEST_CASE("shard snapshot: a bad index or shard file is a ConfigError naming it",
          "[unit][train][shard_snapshot]") {
  TempDir dir("ddp_shard_snapshot");
  const Whole w(3.0f);
  auto fresh = [&](const std::string& name) {
    const std::string path = dir.path + "/" + name;
    save_sharded(path, w, 5, 4);
    return path;
  };
  SECTION("a missing shard file") {
    const std::string path = fresh("a.bin");
    fs::remove(dir.path + "/a.bin.shards/step-5/rank-2-of-4.bin");
    const std::string msg = config_error(path, w.slots);
    CHECK_THAT(msg, Catch::Contains(path) && Catch::Contains("rank-2-of-4.bin") &&
                        Catch::Contains("missing"));
  }
  SECTION("a corrupted byte in a shard file") {
    const std::string path = fresh("b.bin");
    const std::string shard = dir.path + "/b.bin.shards/step-5/rank-1-of-4.bin";
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(shard)) - 20);  // a parameter's byte
    f.put('\x7f');
    f.close();
    const std::string msg = config_error(path, w.slots);
    CHECK_THAT(msg, Catch::Contains(shard) && Catch::Contains("checksum"));
  }
  SECTION("a truncated shard file") {
    const std::string path = fresh("c.bin");
    const std::string shard = dir.path + "/c.bin.shards/step-5/rank-0-of-4.bin";
    fs::resize_file(shard, fs::file_size(shard) - 3);
    CHECK_THAT(config_error(path, w.slots), Catch::Contains(shard) && Catch::Contains("bytes"));
  }
  SECTION("a truncated index") {
    const std::string path = fresh("d.bin");
    fs::resize_file(path, fs::file_size(path) / 2);
    CHECK_THAT(config_error(path, w.slots), Catch::Contains(path) && Catch::Contains("checksum"));
    fs::resize_file(path, 5);
    CHECK_THAT(config_error(path, w.slots), Catch::Contains(path) && Catch::Contains("magic"));
  }
  SECTION("a slot size that does not match the model") {
    const std::string path = fresh("e.bin");
    const std::string msg = config_error(path, slots_of({7, 13, 0, 2, 40}));
    CHECK_THAT(msg, Catch::Contains(path) && Catch::Contains("layer 3 holds 1 floats") &&
                        Catch::Contains("2 in the model"));
    CHECK_THAT(config_error(path, slots_of({7, 13})), Catch::Contains("5 layers"));
  }
  SECTION("not a snapshot, or a shard file given for the index") {
    const std::string path = dir.path + "/garbage.bin";
    std::ofstream(path) << "hello world, this is not a snapshot at all";
    CHECK_THAT(config_error(path, w.slots), Catch::Contains(path) && Catch::Contains("magic"));
    fresh("f.bin");
    const std::string shard = dir.path + "/f.bin.shards/step-5/rank-0-of-4.bin";
    CHECK_THAT(config_error(shard, w.slots), Catch::Contains(shard) && Catch::Contains("magic"));
  }
}

TEST_CASE("shard snapshot: a commit removes the previous step, a step saved again is replaced",
          "[unit][train][shard_snapshot]") {
  TempDir dir("ddp_shard_snapshot");
  const std::string path = dir.path + "/run.bin";
  const std::string shards = dir.path + "/run.bin.shards";
  const Whole w(10.0f);
  save_sharded(path, w, 5, 4);
  // A crash before the next commit: the new step's files are there, the index still says 5.
  const Whole w2(20.0f);
  const ShardLayout l0 = make_shard_layout(w2.slots, 4, 0);
  std::vector<float> p;
  std::vector<float> s;
  w2.shard(l0, p, s);
  write_shard_file(path, header_at(9), l0, p.data(), s.data(), kPieces);
  auto before = SnapshotReader::open(path, w.slots);
  REQUIRE(before.has_value());
  CHECK(before->header().global_step == 5);
  check_reads(*before, w);

  save_sharded(path, w2, 9, 4);
  CHECK_FALSE(fs::exists(shards + "/step-5"));
  CHECK(fs::exists(shards + "/step-9/rank-0-of-4.bin"));
  auto after = SnapshotReader::open(path, w2.slots);
  REQUIRE(after.has_value());
  CHECK(after->header().global_step == 9);
  check_reads(*after, w2);

  // The same step saved again, at world 3 (a resumed run): the world-4 files go.
  save_sharded(path, w2, 9, 3);
  CHECK_FALSE(fs::exists(shards + "/step-9/rank-0-of-4.bin"));
  CHECK(fs::exists(shards + "/step-9/rank-2-of-3.bin"));
  auto again = SnapshotReader::open(path, w2.slots);
  REQUIRE(again.has_value());
  CHECK(again->world() == 3);
  check_reads(*again, w2);
  // And at the same world: overwritten in place, still valid.
  save_sharded(path, w2, 9, 3);
  REQUIRE(SnapshotReader::open(path, w2.slots).has_value());

  // A commit whose ranks did not all write (or not to a shared folder) is refused.
  CHECK_THROWS_AS(commit_sharded_snapshot(path, header_at(12), w.slots, 2, kPieces, "fsdp", {1, 2}),
                  ddp::IoError);
  CHECK_FALSE(temp_files_in(dir.path));
}
