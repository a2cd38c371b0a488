// Tests of gpu_devices.hpp: the driver's folder read from a fake one in a temp dir, and
// CUDA_VISIBLE_DEVICES applied with torch 2.15's rules (its own test cases among them:
// test/test_cuda_nvml_based_avail.py, TestVisibleDeviceParses).
#include "ddp/launch/gpu_devices.hpp"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

using namespace ddp::launch;
namespace fs = std::filesystem;

namespace {

// A folder laid out like /proc/driver/nvidia/gpus, removed at the end of the test.
struct FakeDriver {
  fs::path root;
  FakeDriver() {
    root = fs::temp_directory_path() /
           ("ddp-gpus-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++));
    fs::remove_all(root);
    fs::create_directories(root);
  }
  ~FakeDriver() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
  static int& counter() {
    static int n = 0;
    return n;
  }
  void add(const std::string& bus, const std::string& information) const {
    fs::create_directories(root / bus);
    std::ofstream(root / bus / "information") << information;
  }
  void add_gpu(const std::string& bus, const std::string& uuid, int minor) const {
    add(bus, "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 77\nGPU UUID: \t " + uuid +
                 "\nVideo BIOS: \t 96.00.74.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n"
                 "Bus Location: \t " +
                 bus + "\nDevice Minor: \t " + std::to_string(minor) + "\nGPU Excluded:\t No\n");
  }
};

// Eight GPUs with torch's test UUIDs, in bus order 0..7 (listed out of order on disk).
const char* const kUuids[] = {
    "GPU-9942190a-aa31-4ff1-4aa9-c388d80f85f1", "GPU-9e8d35e3-a134-0fdd-0e01-23811fdbd293",
    "GPU-e429a63e-c61c-4795-b757-5132caeb8e70", "GPU-eee1dfbc-0a0f-6ad8-5ff6-dc942a8b9d98",
    "GPU-bbcd6503-5150-4e92-c266-97cc4390d04e", "GPU-472ea263-58d7-410d-cc82-f7fdece5bd28",
    "GPU-e56257c4-947f-6a5b-7ec9-0f45567ccf4e", "GPU-1c20e77d-1c1a-d9ed-fe37-18b8466a78ad"};

std::string bus(int i) { return "0000:" + std::to_string(18 + i) + ":00.0"; }

std::vector<GpuDevice> eight() {
  std::vector<GpuDevice> m;
  for (int i = 0; i < 8; ++i) m.push_back({bus(i), kUuids[i]});
  return m;
}

// The machine indices (positions in `machine`) of the visible GPUs.
std::vector<int> visible(const std::vector<GpuDevice>& machine, const std::string& cvd) {
  std::vector<int> out;
  for (const auto& g : visible_gpus(machine, {{"CUDA_VISIBLE_DEVICES", cvd}})) {
    int at = -1;
    for (std::size_t i = 0; i < machine.size(); ++i) {
      if (machine[i].pci_bus_id == g.pci_bus_id && machine[i].uuid == g.uuid) {
        at = static_cast<int>(i);
      }
    }
    out.push_back(at);
  }
  return out;
}

using V = std::vector<int>;

}  // namespace

TEST_CASE("the driver's folder: one GPU per bus id, sorted, UUIDs read", "[unit][launch][gpu]") {
  FakeDriver d;
  d.add_gpu("0000:3B:00.0", kUuids[1], 1);
  d.add_gpu("0000:1a:00.0", kUuids[0], 0);
  d.add_gpu("0000:db:00.0", kUuids[3], 3);
  d.add_gpu("0000:5e:00.0", kUuids[2], 2);
  std::ofstream(d.root / "not-a-gpu") << "a stray file is not a GPU";
  const auto m = machine_gpus(d.root.string());
  REQUIRE(m.size() == 4);
  CHECK(m[0].pci_bus_id == "0000:1a:00.0");
  CHECK(m[1].pci_bus_id == "0000:3b:00.0");  // lower case, sorted as such
  CHECK(m[2].pci_bus_id == "0000:5e:00.0");
  CHECK(m[3].pci_bus_id == "0000:db:00.0");
  CHECK(m[0].uuid == kUuids[0]);
  CHECK(m[1].uuid == kUuids[1]);
  CHECK(m[3].uuid == kUuids[3]);
}

TEST_CASE("the driver's folder: excluded GPUs, unknown UUIDs, no driver", "[unit][launch][gpu]") {
  FakeDriver d;
  d.add_gpu("0000:1a:00.0", kUuids[0], 0);
  d.add("0000:3b:00.0", std::string("GPU UUID: \t ") + kUuids[1] + "\nGPU Excluded:\t Yes\n");
  d.add("0000:5e:00.0", "Model: \t NVIDIA A100\nGPU UUID: \t GPU-\?\?\?\?\?\?\?\?-\?\?\?\?\n");
  d.add("0000:db:00.0", "");  // no information at all: a GPU whose UUID is not known
  const auto m = machine_gpus(d.root.string());
  REQUIRE(m.size() == 3);
  CHECK(m[0].uuid == kUuids[0]);
  CHECK(m[1].pci_bus_id == "0000:5e:00.0");
  CHECK(m[1].uuid.empty());
  CHECK(m[2].uuid.empty());
  CHECK(machine_gpus((d.root / "missing").string()).empty());
}

TEST_CASE("CUDA_VISIBLE_DEVICES unset: every GPU, empty: none", "[unit][launch][gpu]") {
  const auto m = eight();
  CHECK(visible_gpus(m, {}).size() == 8);
  CHECK(visible_gpus(m, {{"SLURM_STEP_GPUS", "0,1"}}).size() == 8);  // CUDA does not read it
  CHECK(visible(m, "").empty());
  CHECK(visible_gpus({}, {}).empty());
  CHECK(visible_gpus({}, {{"CUDA_VISIBLE_DEVICES", "0,1"}}).empty());
}

TEST_CASE("CUDA_VISIBLE_DEVICES indices, as the driver (and torch) read them",
          "[unit][launch][gpu]") {
  const auto m = eight();
  CHECK(visible(m, "3,1") == V{3, 1});                 // CUDA's order is the list's
  CHECK(visible(m, "1gpu2,2ampere") == V{1, 2});       // the rest of an entry is ignored
  CHECK(visible(m, "0, 1, 2, -1, 3") == V{0, 1, 2});   // a negative ends the list
  CHECK(visible(m, "0, 1, 2, 1").empty());             // a repeated index: no GPU at all
  CHECK(visible(m, "2, +3, -0, 5") == V{2, 3, 0, 5});  // unary signs
  CHECK(visible(m, "one,two,3,4").empty());            // a word first: nothing
  CHECK(visible(m, "4,3,two,one") == V{4, 3});         // a word ends the list
  CHECK(visible(m, "1,,2") == V{1});                   // so does an empty entry
  CHECK(visible(m, "+,1").empty());                    // and a sign alone
  CHECK(visible(m, "1,2,").size() == 2);
}

TEST_CASE("CUDA_VISIBLE_DEVICES: an index past the machine's GPUs ends the list",
          "[unit][launch][gpu]") {
  const std::vector<GpuDevice> two = {{bus(0), kUuids[0]}, {bus(1), kUuids[1]}};
  CHECK(visible(two, "1, 0") == V{1, 0});
  CHECK(visible(two, "1, 5, 0") == V{1});  // torch's test_ordinal_parse_visible_devices
  CHECK(visible(two, "7").empty());
  CHECK(visible(two, "99999999999999999999999,0").empty());
  CHECK(visible(two, "1,5,1").empty());  // repeats are seen before the machine's size
}

TEST_CASE("CUDA_VISIBLE_DEVICES UUIDs and unique prefixes", "[unit][launch][gpu]") {
  const auto m = eight();
  CHECK(visible(m, "GPU-9e8d35e3") == V{1});
  CHECK(visible(m, "GPU-e4,GPU-9e8d35e3") == V{2, 1});
  CHECK(visible(m, "GPU-9e8d35e3,GPU-1,GPU-47") == V{1, 7, 5});
  CHECK(visible(m, std::string(kUuids[6]) + "," + kUuids[0]) == V{6, 0});  // whole UUIDs
  // The first unknown UUID ends the list.
  CHECK(visible(m, "GPU-123,GPU-9e8d35e3").empty());
  CHECK(visible(m, "GPU-9e8d35e3,GPU-123,GPU-47") == V{1});
  // So does the first ambiguous prefix.
  CHECK(visible(m, "GPU-9e8d35e3,GPU-e,GPU-47") == V{1});
  // Two entries naming one GPU, or the same entry twice: no GPU at all.
  CHECK(visible(m, "GPU-9e8d35e3,GPU-47,GPU-9e8").empty());
  CHECK(visible(m, "GPU-47,GPU-47").empty());
  // The forms never mix: an index after UUIDs ends the list, and the other way round.
  CHECK(visible(m, "GPU-9e8d35e3, 2") == V{1});
  CHECK(visible(m, "GPU-9e8d35e3,2") == V{1});
  CHECK(visible(m, std::string("2,") + kUuids[0]) == V{2});
  CHECK(visible(m, " GPU-9e8d35e3").empty());  // a UUID list starts with "GPU-" exactly
}

TEST_CASE("CUDA_VISIBLE_DEVICES UUIDs when the driver did not show every UUID",
          "[unit][launch][gpu]") {
  std::vector<GpuDevice> m = {{bus(0), kUuids[0]}, {bus(1), ""}, {bus(2), ""}};
  // A known UUID resolves; an unmatched one stands for one of the unknown GPUs, while any
  // are left.
  const auto v = visible_gpus(m, {{"CUDA_VISIBLE_DEVICES", "GPU-aaaa,GPU-9942,GPU-bbbb,GPU-cc"}});
  REQUIRE(v.size() == 3);
  CHECK(v[0].pci_bus_id.empty());
  CHECK(v[0].uuid == "GPU-aaaa");
  CHECK(v[1].pci_bus_id == bus(0));
  CHECK(v[2].uuid == "GPU-bbbb");
}

TEST_CASE("CUDA_VISIBLE_DEVICES MIG devices are counted as listed", "[unit][launch][gpu]") {
  const auto m = eight();
  const auto v =
      visible_gpus(m, {{"CUDA_VISIBLE_DEVICES", std::string("MIG-GPU-") + (kUuids[3] + 4) +
                                                    "/1/0,MIG-0c2bd5a7-1d3b-5a46,0,MIG-x"}});
  REQUIRE(v.size() == 2);            // the index ends the list
  CHECK(v[0].pci_bus_id == bus(3));  // the old form names its GPU
  CHECK(v[1].pci_bus_id.empty());
  CHECK(v[1].uuid == "MIG-0c2bd5a7-1d3b-5a46");
  CHECK(visible_gpus(m, {{"CUDA_VISIBLE_DEVICES", "MIG-a,MIG-a"}}).empty());
  CHECK(visible_gpus({}, {{"CUDA_VISIBLE_DEVICES", "MIG-a"}}).empty());  // no GPU, no MIG
}

TEST_CASE("usable_gpus reads DDPRUN_NVIDIA_GPUS_DIR, else the driver's /proc folder",
          "[unit][launch][gpu]") {
  FakeDriver d;
  for (int i = 0; i < 4; ++i) d.add_gpu(bus(i), kUuids[i], i);
  const std::string dir = d.root.string();
  CHECK(nvidia_gpus_dir({}) == "/proc/driver/nvidia/gpus");
  CHECK(nvidia_gpus_dir({{"DDPRUN_NVIDIA_GPUS_DIR", ""}}) == "/proc/driver/nvidia/gpus");
  CHECK(nvidia_gpus_dir({{"DDPRUN_NVIDIA_GPUS_DIR", dir}}) == dir);
  CHECK(usable_gpus({{"DDPRUN_NVIDIA_GPUS_DIR", dir}}).size() == 4);
  const auto v =
      usable_gpus({{"DDPRUN_NVIDIA_GPUS_DIR", dir}, {"CUDA_VISIBLE_DEVICES", "GPU-e42,GPU-99,3"}});
  REQUIRE(v.size() == 2);
  CHECK(v[0].pci_bus_id == bus(2));
  CHECK(v[1].pci_bus_id == bus(0));
}
