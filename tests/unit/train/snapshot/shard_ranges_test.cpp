// Ranged shard files (issue 20's mesh): the tiling check on its own; a 2x2-mesh-like snapshot
// (halves cut again, slots held by two of four files, empty ranges) written, committed and read
// back whole, in every slice and as even-cut shards of other world sizes; a bad ranged index or
// file is a ConfigError naming it; an even-cut snapshot still reads, with no layout.
#include "shard_ranges.hpp"

#include <catch2/catch.hpp>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
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
using nlohmann::json;

namespace {

const std::vector<std::size_t> kSizes = {12, 9, 5, 0, 7, 1, 10};

// Four files as a dp=2 x tp=2 mesh could hold them: slots 0, 1 and 6 cut in halves, each half
// cut again in 2 (the files in no particular order); slots 2, 4 and 5 held by two files only
// (replicated across tp), the others holding empty ranges anywhere in the slot.
const std::vector<FileRanges> kMesh = {
    {{6, 9}, {7, 9}, {0, 3}, {0, 0}, {7, 7}, {0, 0}, {0, 1}},
    {{0, 3}, {5, 7}, {2, 2}, {0, 0}, {0, 4}, {1, 1}, {1, 5}},
    {{9, 12}, {3, 5}, {3, 5}, {0, 0}, {3, 3}, {0, 1}, {5, 10}},
    {{3, 6}, {0, 3}, {0, 0}, {0, 0}, {4, 7}, {0, 0}, {10, 10}},
};
const std::string kLayout = R"({"dp":2,"mesh":"dp=2,tp=2","tp":2})";

SnapshotHeader header_at(std::int64_t step) {
  SnapshotHeader h;
  h.model = "test-lm";
  h.optimizer = "adam";
  h.epoch = 1;
  h.step = 4;
  h.global_step = step;
  h.adam_t = step;
  h.seed = 7;
  h.lr = 0.001;
  h.world_size = 4;
  h.batch_size = 16;
  return h;
}

// The whole model: parameters and `pieces` arrays of optimizer state, in the flat layout.
struct Whole {
  std::vector<LayerSlot> slots = slots_of(kSizes);
  std::size_t n = slots.front().end;
  int pieces;
  std::vector<float> params;
  std::vector<float> state;
  Whole(float base, int p) : pieces(p) {
    for (std::size_t i = 0; i < n; ++i) params.push_back(base + static_cast<float>(i) + 0.25f);
    for (std::size_t i = 0; i < n * static_cast<std::size_t>(p); ++i)
      state.push_back(-base - static_cast<float>(i));
  }
  float param(std::size_t k, std::size_t i) const { return params[slots[k].w + i]; }
  float piece(std::size_t j, std::size_t k, std::size_t i) const {
    return state[j * n + slots[k].w + i];
  }
  // What a ranged file holds: its ranges' elements in slot order, then each piece alike.
  void held(const FileRanges& r, std::vector<float>& p, std::vector<float>& s) const {
    p.clear();
    s.assign(ranged_size(r) * static_cast<std::size_t>(pieces), 0.0f);
    for (std::size_t k = 0; k < r.size(); ++k) {
      for (std::size_t i = r[k].lo; i < r[k].hi; ++i) p.push_back(param(k, i));
    }
    for (std::size_t j = 0, at = 0; j < static_cast<std::size_t>(pieces); ++j) {
      for (std::size_t k = 0; k < r.size(); ++k) {
        for (std::size_t i = r[k].lo; i < r[k].hi; ++i) s[at++] = piece(j, k, i);
      }
    }
  }
  // What rank `l.rank` holds under the even cut: its parameters and pieces arrays.
  void shard(const ShardLayout& l, std::vector<float>& p, std::vector<float>& s) const {
    p.assign(l.shard_size, 0.0f);
    s.assign(static_cast<std::size_t>(pieces) * l.shard_size, 0.0f);
    for (std::size_t k = 0; k < slots.size(); ++k) {
      for (std::size_t i = l.lo[k]; i < l.hi[k]; ++i) {
        const std::size_t at = l.local[k] + i - l.lo[k];
        p[at] = param(k, i);
        for (std::size_t j = 0; j < static_cast<std::size_t>(pieces); ++j)
          s[j * l.shard_size + at] = piece(j, k, i);
      }
    }
  }
};

void save_ranged(const std::string& path, const Whole& w, std::int64_t step,
                 const std::vector<FileRanges>& ranges) {
  const int world = static_cast<int>(ranges.size());
  std::vector<std::uint64_t> sums;
  for (int q = 0; q < world; ++q) {
    std::vector<float> p;
    std::vector<float> s;
    w.held(ranges[static_cast<std::size_t>(q)], p, s);
    sums.push_back(write_ranged_shard_file(path, header_at(step), q, world, w.slots,
                                           ranges[static_cast<std::size_t>(q)], p.data(),
                                           w.pieces > 0 ? s.data() : nullptr, w.pieces));
  }
  commit_ranged_snapshot(path, header_at(step), w.slots, world, w.pieces, "mesh", ranges, kLayout,
                         sums);
}

// Every slot whole and in every slice [lo, hi), with and without the optimizer state.
void check_slices(const SnapshotReader& r, const Whole& w) {
  const auto pieces = static_cast<std::size_t>(w.pieces);
  for (std::size_t k = 0; k < w.slots.size(); ++k) {
    for (std::size_t lo = 0; lo <= kSizes[k]; ++lo) {
      for (std::size_t hi = lo; hi <= kSizes[k]; ++hi) {
        std::vector<float> p(hi - lo, -1.0f);
        std::vector<std::vector<float>> s(pieces, std::vector<float>(hi - lo, -1.0f));
        std::vector<float*> opt;
        for (auto& v : s) opt.push_back(v.data());
        r.read(k, lo, hi, p.data(), opt);
        for (std::size_t i = lo; i < hi; ++i) {
          REQUIRE(p[i - lo] == w.param(k, i));
          for (std::size_t j = 0; j < pieces; ++j) REQUIRE(s[j][i - lo] == w.piece(j, k, i));
        }
        std::vector<float> only(hi - lo, -1.0f);
        r.read(k, lo, hi, only.data(), {});  // the state skipped
        REQUIRE(only == p);
      }
    }
  }
}

// Every rank of an even-cut world reads exactly its shard (an FSDP run resuming).
void check_shards(const SnapshotReader& r, const Whole& w, int world) {
  for (int rank = 0; rank < world; ++rank) {
    const ShardLayout l = make_shard_layout(w.slots, world, rank);
    std::vector<float> want_p;
    std::vector<float> want_s;
    w.shard(l, want_p, want_s);
    std::vector<float> p(l.shard_size, -1.0f);
    std::vector<float> s(static_cast<std::size_t>(w.pieces) * l.shard_size, -1.0f);
    r.read_shard(l, p.data(), w.pieces > 0 ? s.data() : nullptr);
    CHECK(p == want_p);
    CHECK(s == want_s);
  }
}

// The index's JSON header, and the index written again with the header changed by `edit`
// (a valid checksum: only the reader's checks of the content can catch it).
json index_json(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  const std::string b{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  REQUIRE(b.size() > 20);
  std::size_t len = 0;
  for (int i = 0; i < 4; ++i) len |= std::size_t{static_cast<std::uint8_t>(b[8 + i])} << (8 * i);
  return json::parse(b.substr(12, len));
}
template <class Edit>
void rewrite_index(const std::string& path, Edit edit) {
  json j = index_json(path);
  edit(j);
  const std::string text = j.dump();
  std::string out = "DDPSIDX1";
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((text.size() >> (8 * i)) & 0xff));
  out += text;
  const std::uint64_t fnv = fnv1a64(out.data(), out.size());
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((fnv >> (8 * i)) & 0xff));
  std::ofstream(path, std::ios::binary | std::ios::trunc) << out;
}

// The ConfigError's message of f() (a failure when it throws none).
template <class F>
std::string config_error_of(F f) {
  try {
    f();
  } catch (const ddp::ConfigError& e) {
    return e.what();
  }
  FAIL("no ConfigError");
  return "";
}
std::string config_error(const std::string& path, const std::vector<LayerSlot>& slots) {
  return config_error_of([&] { SnapshotReader::open(path, slots); });
}

}  // namespace

TEST_CASE("shard ranges: check_tiling accepts exact tilings in any order of files",
          "[unit][train][shard_ranges]") {
  const std::vector<LayerSlot> slots = slots_of(kSizes);
  CHECK_NOTHROW(check_tiling(slots, kMesh));
  CHECK_NOTHROW(check_tiling({}, {{}}));  // no slots
  CHECK_NOTHROW(check_tiling(slots, {{{0, 12}, {0, 9}, {0, 5}, {0, 0}, {0, 7}, {0, 1}, {0, 10}}}));
  for (int world = 1; world <= 13; ++world) {
    std::vector<FileRanges> even;
    for (int q = 0; q < world; ++q) even.push_back(even_ranges(slots, world, q));
    CHECK_NOTHROW(check_tiling(slots, even));
    for (int q = 0; q < world; ++q) {  // the same cut ShardLayout makes
      const ShardLayout l = make_shard_layout(slots, world, q);
      for (std::size_t k = 0; k < slots.size(); ++k) {
        CHECK(even[static_cast<std::size_t>(q)][k] == SlotRange{l.lo[k], l.hi[k]});
      }
      CHECK(ranged_size(even[static_cast<std::size_t>(q)]) == l.shard_size);
    }
  }
  CHECK(ranged_size(kMesh[1]) == 3 + 2 + 4 + 4);
  CHECK_THROWS_AS(even_ranges(slots, 2, 2), ddp::ConfigError);
}

TEST_CASE("shard ranges: check_tiling names the slot of a gap, an overlap or a bad range",
          "[unit][train][shard_ranges]") {
  const std::vector<LayerSlot> slots = slots_of({6, 4});
  auto err = [&](const std::vector<FileRanges>& r) {
    return config_error_of([&] { check_tiling(slots, r, "test"); });
  };
  using Catch::Contains;
  CHECK_THAT(err({}), Contains("test") && Contains("no ranks"));
  CHECK_THAT(err({{{0, 6}}}), Contains("rank 0 has 1 ranges for 2 slots"));
  CHECK_THAT(err({{{0, 6}, {3, 2}}}), Contains("slot 1") && Contains("[3, 2)"));
  CHECK_THAT(err({{{0, 7}, {0, 4}}}), Contains("slot 0") && Contains("[0, 7)"));
  CHECK_THAT(err({{{1, 6}, {0, 4}}}), Contains("slot 0") && Contains("[0, 1) are held by no rank"));
  CHECK_THAT(err({{{0, 6}, {0, 2}}, {{0, 0}, {3, 4}}}),
             Contains("slot 1") && Contains("[2, 3) are held by no rank"));
  CHECK_THAT(err({{{0, 5}, {0, 4}}, {{0, 0}, {4, 4}}}),
             Contains("slot 0 (6 elements)") && Contains("[5, 6) are held by no rank"));
  CHECK_THAT(err({{{0, 4}, {0, 4}}, {{3, 6}, {4, 4}}}),
             Contains("slot 0") && Contains("[3, 4) are held by both rank 0 and rank 1"));
  // A replicated slot held whole by two files is an overlap too.
  CHECK_THAT(err({{{0, 6}, {0, 4}}, {{0, 0}, {0, 4}}}),
             Contains("slot 1") && Contains("[0, 4) are held by both"));
  CHECK_THAT(err({{{0, 6}, {0, 4}}, {{2, 4}, {4, 4}}}), Contains("slot 0") && Contains("[2, 4)"));
}

TEST_CASE("shard ranges: a 2x2-mesh snapshot reads back whole, in slices and resharded",
          "[unit][train][shard_ranges]") {
  const int pieces = GENERATE(0, 1, 2);
  CAPTURE(pieces);
  TempDir dir("ddp_shard_ranges");
  const std::string path = dir.path + "/lm.bin";
  const Whole w(100.0f, pieces);
  save_ranged(path, w, 12, kMesh);
  CHECK(fs::exists(shard_file_path(path, 12, 3, 4)));
  const json index = index_json(path);
  CHECK(index.at("layout") == json::parse(kLayout));
  CHECK(index.at("ranges").size() == 4);
  CHECK(index.at("ranges")[2][1] == json::array({3, 5}));

  auto r = SnapshotReader::open(path, w.slots);
  REQUIRE(r.has_value());
  CHECK(r->sharded());
  CHECK(r->world() == 4);
  CHECK(r->pieces() == pieces);
  CHECK(r->sharding() == "mesh");
  CHECK(r->layout() == kLayout);
  CHECK(r->header().model == "test-lm");
  CHECK(r->header().global_step == 12);
  check_slices(*r, w);
  for (int world : {1, 2, 3, 4, 5}) check_shards(*r, w, world);
  float one = 0;
  CHECK_THROWS_AS(r->read(0, 3, 13, &one, {}), ddp::ConfigError);
  CHECK_THROWS_AS(r->read(7, 0, 0, &one, {}), ddp::ConfigError);

  // The even cut written as ranges reads the same.
  const std::string even_path = dir.path + "/even.bin";
  std::vector<FileRanges> even;
  for (int q = 0; q < 3; ++q) even.push_back(even_ranges(w.slots, 3, q));
  save_ranged(even_path, w, 12, even);
  auto e = SnapshotReader::open(even_path, w.slots);
  REQUIRE(e.has_value());
  check_shards(*e, w, 3);
  check_shards(*e, w, 2);
}

TEST_CASE("shard ranges: the commit refuses ranges that do not tile, bad layouts, absent files",
          "[unit][train][shard_ranges]") {
  TempDir dir("ddp_shard_ranges");
  const std::string path = dir.path + "/c.bin";
  const Whole w(5.0f, 1);
  save_ranged(path, w, 3, kMesh);
  const std::vector<std::uint64_t> sums = {1, 2, 3, 4};
  using Catch::Contains;
  std::vector<FileRanges> gap = kMesh;
  gap[2][6] = {5, 9};
  CHECK_THAT(config_error_of([&] {
               commit_ranged_snapshot(path, header_at(3), w.slots, 4, 1, "mesh", gap, "", sums);
             }),
             Contains(path) && Contains("slot 6") && Contains("[9, 10) are held by no rank"));
  CHECK_THAT(config_error_of([&] {
               commit_ranged_snapshot(path, header_at(3), w.slots, 3, 1, "mesh", kMesh, "", sums);
             }),
             Contains("ranges of 4 ranks for a world of 3"));
  CHECK_THAT(config_error_of([&] {
               commit_ranged_snapshot(path, header_at(3), w.slots, 4, 1, "mesh", kMesh, "{dp=2",
                                      sums);
             }),
             Contains("layout is not JSON"));
  CHECK_THROWS_AS(write_ranged_shard_file(path, header_at(3), 0, 4, w.slots, {{0, 1}}, &w.params[0],
                                          &w.state[0], 1),
                  ddp::ConfigError);
  CHECK_THROWS_AS(write_ranged_shard_file(path, header_at(3), 4, 4, w.slots, kMesh[0], &w.params[0],
                                          &w.state[0], 1),
                  ddp::ConfigError);
  // Files of step 3 but the commit says step 4: not there.
  CHECK_THROWS_AS(
      commit_ranged_snapshot(path, header_at(4), w.slots, 4, 1, "mesh", kMesh, kLayout, sums),
      ddp::IoError);
  // None of the refused commits touched the committed snapshot.
  auto r = SnapshotReader::open(path, w.slots);
  REQUIRE(r.has_value());
  CHECK(r->header().global_step == 3);
  check_slices(*r, w);
}

TEST_CASE("shard ranges: a bad ranged index or shard file is a ConfigError naming it",
          "[unit][train][shard_ranges]") {
  TempDir dir("ddp_shard_ranges");
  const Whole w(3.0f, 2);
  auto fresh = [&](const std::string& name) {
    const std::string path = dir.path + "/" + name;
    save_ranged(path, w, 5, kMesh);
    return path;
  };
  using Catch::Contains;
  SECTION("a flipped byte in a shard file") {
    const std::string path = fresh("a.bin");
    const std::string shard = shard_file_path(path, 5, 2, 4);
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(shard)) - 12);  // optimizer state
    f.put('\x55');
    f.close();
    CHECK_THAT(config_error(path, w.slots), Contains(shard) && Contains("checksum"));
  }
  SECTION("a truncated shard file") {
    const std::string path = fresh("b.bin");
    const std::string shard = shard_file_path(path, 5, 1, 4);
    fs::resize_file(shard, fs::file_size(shard) - 4);
    CHECK_THAT(config_error(path, w.slots), Contains(shard) && Contains("bytes"));
  }
  SECTION("a missing shard file") {
    const std::string path = fresh("c.bin");
    const std::string shard = shard_file_path(path, 5, 3, 4);
    fs::remove(shard);
    CHECK_THAT(config_error(path, w.slots), Contains(shard) && Contains("missing"));
  }
  SECTION("index ranges that overlap") {
    const std::string path = fresh("d.bin");
    rewrite_index(path, [](json& j) { j["ranges"][0][0] = {6, 10}; });
    CHECK_THAT(config_error(path, w.slots),
               Contains(path) && Contains("slot 0") && Contains("held by both rank 0 and rank 2"));
  }
  SECTION("index ranges that tile but give a file another size") {
    const std::string path = fresh("e.bin");
    rewrite_index(path, [](json& j) {
      j["ranges"][0][1] = {0, 3};
      j["ranges"][3][1] = {7, 9};
    });
    CHECK_THAT(config_error(path, w.slots),
               Contains(shard_file_path(path, 5, 0, 4)) && Contains("bytes"));
  }
  SECTION("index ranges that tile, sizes alike, but not what the file holds") {
    const std::string path = fresh("f.bin");
    rewrite_index(path, [](json& j) {
      j["ranges"][1][0] = {3, 6};
      j["ranges"][3][0] = {0, 3};
    });
    CHECK_THAT(config_error(path, w.slots),
               Contains(shard_file_path(path, 5, 1, 4)) && Contains("does not match the index"));
  }
  SECTION("index ranges of the wrong shape") {
    const std::string path = fresh("g.bin");
    rewrite_index(path, [](json& j) { j["ranges"][2][4] = {1}; });
    CHECK_THAT(config_error(path, w.slots), Contains(path) && Contains("[lo, hi]"));
    const std::string fewer = fresh("h.bin");
    rewrite_index(fewer, [](json& j) { j["ranges"].erase(1); });
    CHECK_THAT(config_error(fewer, w.slots), Contains(fewer) && Contains("3 entries for 4"));
    const std::string short_file = fresh("i.bin");
    rewrite_index(short_file, [](json& j) { j["ranges"][3].erase(6); });
    CHECK_THAT(config_error(short_file, w.slots),
               Contains(short_file) && Contains("rank 3 has 6 ranges for 7 slots"));
  }
}

TEST_CASE("shard ranges: an even-cut or replicated snapshot still reads, with no layout",
          "[unit][train][shard_ranges]") {
  TempDir dir("ddp_shard_ranges");
  const Whole w(-8.0f, 2);
  const std::string path = dir.path + "/old.bin";
  std::vector<std::uint64_t> sums;
  for (int q = 0; q < 3; ++q) {
    const ShardLayout l = make_shard_layout(w.slots, 3, q);
    std::vector<float> p;
    std::vector<float> s;
    w.shard(l, p, s);
    sums.push_back(write_shard_file(path, header_at(9), l, p.data(), s.data(), 2));
  }
  commit_sharded_snapshot(path, header_at(9), w.slots, 3, 2, "fsdp", sums);
  const json index = index_json(path);
  CHECK_FALSE(index.contains("ranges"));
  CHECK_FALSE(index.contains("layout"));
  auto r = SnapshotReader::open(path, w.slots);
  REQUIRE(r.has_value());
  CHECK(r->layout().empty());
  CHECK(r->sharding() == "fsdp");
  check_slices(*r, w);
  for (int world : {1, 4}) check_shards(*r, w, world);

  Snapshot s;
  s.header = header_at(2);
  s.params = w.params;
  s.opt_state = w.state;
  write_snapshot_file(dir.path + "/rep.bin", s);
  auto rep = SnapshotReader::open(dir.path + "/rep.bin", w.slots);
  REQUIRE(rep.has_value());
  CHECK(rep->layout().empty());
  check_slices(*rep, w);
}
