// The machine's NVIDIA GPUs from the driver's /proc folder and the ones CUDA_VISIBLE_DEVICES
// leaves visible, with the rules torch 2.15's device count applies (torch/cuda/__init__.py
// _parse_visible_devices, _transform_uuid_to_ordinals, _device_count_nvml; checked there against
// the 525 driver): see gpu_devices.hpp. Pure: text in, lists out; nothing is opened but the folder.
#include "ddp/launch/gpu_devices.hpp"

#include <algorithm>
#include <cctype>
#include <climits>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string_view>

#include "ddp/proto/knobs.hpp"

namespace ddp::launch {
namespace {

std::string_view trim(std::string_view s) {
  // Python's str.strip() on ASCII text: these are its whitespace characters.
  constexpr std::string_view kSpace = " \t\n\r\v\f\x1c\x1d\x1e\x1f";
  const auto b = s.find_first_not_of(kSpace);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(kSpace) - b + 1);
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (true) {
    const auto comma = s.find(',', start);
    out.push_back(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// The value of "Key: value" in the driver's information file; nullopt when the key is absent.
std::optional<std::string> field(const std::string& text, std::string_view key) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!starts_with(line, key)) continue;
    auto rest = std::string_view(line).substr(key.size());
    if (rest.empty() || rest.front() != ':') continue;
    return std::string(trim(rest.substr(1)));
  }
  return std::nullopt;
}

// torch's _strtoul: the integer an entry starts with (an optional sign, then digits: "1gpu2"
// is 1), or -1 when it starts with none. A sign alone is -1 (torch raises there).
long long leading_integer(std::string_view s) {
  std::size_t i = 0;
  bool negative = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    negative = s[0] == '-';
    i = 1;
  }
  const std::size_t digits_from = i;
  long long value = 0;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i) {
    value = value > (LLONG_MAX - 9) / 10 ? LLONG_MAX : value * 10 + (s[i] - '0');
  }
  if (i == digits_from) return -1;
  return negative ? -value : value;
}

// torch's parse_list_with_prefix: the leading entries that carry `prefix`, as written; a repeated
// entry makes the list empty.
std::vector<std::string> prefixed_entries(const std::vector<std::string>& entries,
                                          std::string_view prefix) {
  std::vector<std::string> out;
  for (const auto& e : entries) {
    if (std::find(out.begin(), out.end(), e) != out.end()) return {};
    if (!starts_with(e, prefix)) break;
    out.push_back(e);
  }
  return out;
}

// Ordinals: the first invalid (negative, non-numeric) entry ends the list, a repeated one
// empties it, and the first index past the machine's GPUs ends it (_device_count_nvml).
std::vector<GpuDevice> by_index(const std::vector<GpuDevice>& machine,
                                const std::vector<std::string>& entries) {
  std::vector<long long> indices;
  for (const auto& e : entries) {
    const long long x = leading_integer(trim(e));
    if (std::find(indices.begin(), indices.end(), x) != indices.end()) return {};
    if (x < 0) break;
    indices.push_back(x);
  }
  std::vector<GpuDevice> out;
  for (long long x : indices) {
    if (x >= static_cast<long long>(machine.size())) break;
    out.push_back(machine[static_cast<std::size_t>(x)]);
  }
  return out;
}

// UUIDs and unique prefixes of them ("GPU-8f6e"): an unknown or ambiguous one ends the list, one
// naming an already listed GPU empties it. A GPU whose UUID the driver did not show cannot be
// matched: an unmatched entry then stands for one of those (as many as there are).
std::vector<GpuDevice> by_uuid(const std::vector<GpuDevice>& machine,
                               const std::vector<std::string>& candidates) {
  const auto unknown = std::count_if(machine.begin(), machine.end(),
                                     [](const GpuDevice& g) { return g.uuid.empty(); });
  std::vector<std::size_t> picked;
  std::vector<GpuDevice> out;
  long long stand_ins = 0;
  for (const auto& c : candidates) {
    std::optional<std::size_t> match;
    bool ambiguous = false;
    for (std::size_t i = 0; i < machine.size(); ++i) {
      if (machine[i].uuid.empty() || !starts_with(machine[i].uuid, c)) continue;
      ambiguous = ambiguous || match.has_value();
      match = i;
    }
    if (ambiguous) break;
    if (!match) {
      if (stand_ins == unknown) break;
      ++stand_ins;
      out.push_back(GpuDevice{"", c});
      continue;
    }
    if (std::find(picked.begin(), picked.end(), *match) != picked.end()) return {};
    picked.push_back(*match);
    out.push_back(machine[*match]);
  }
  return out;
}

// MIG devices: counted as listed (torch leaves them to the CUDA runtime). The old form
// "MIG-GPU-<uuid>/gi/ci" names its GPU, whose bus id it gets; the new "MIG-<uuid>" does not.
std::vector<GpuDevice> by_mig(const std::vector<GpuDevice>& machine,
                              const std::vector<std::string>& entries) {
  if (machine.empty()) return {};
  std::vector<GpuDevice> out;
  for (const auto& e : entries) {
    GpuDevice d{"", e};
    if (starts_with(e, "MIG-GPU-")) {
      const std::string parent =
          e.substr(4, e.find('/') == std::string::npos ? std::string::npos : e.find('/') - 4);
      for (const auto& g : machine) {
        if (g.uuid == parent) d.pci_bus_id = g.pci_bus_id;
      }
    }
    out.push_back(d);
  }
  return out;
}

}  // namespace

std::vector<GpuDevice> machine_gpus(const std::string& root) {
  namespace fs = std::filesystem;
  std::vector<GpuDevice> gpus;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    std::error_code dir_ec;
    if (!entry.is_directory(dir_ec)) continue;
    std::ifstream in(entry.path() / "information");
    std::stringstream text;
    text << in.rdbuf();
    // Excluded GPUs (NVreg_ExcludedGpus) are listed but neither CUDA nor NVML uses them.
    const auto excluded = field(text.str(), "GPU Excluded");
    if (excluded && starts_with(*excluded, "Yes")) continue;
    GpuDevice g;
    g.pci_bus_id = entry.path().filename().string();
    std::transform(g.pci_bus_id.begin(), g.pci_bus_id.end(), g.pci_bus_id.begin(),
                   [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    // "GPU-????????-..." (not yet read by the driver) counts as not said.
    g.uuid = field(text.str(), "GPU UUID").value_or("");
    if (!starts_with(g.uuid, "GPU-") || g.uuid.find('?') != std::string::npos) g.uuid.clear();
    gpus.push_back(std::move(g));
  }
  std::sort(gpus.begin(), gpus.end(),
            [](const GpuDevice& a, const GpuDevice& b) { return a.pci_bus_id < b.pci_bus_id; });
  return gpus;
}

std::vector<GpuDevice> visible_gpus(const std::vector<GpuDevice>& machine,
                                    const std::map<std::string, std::string>& env) {
  const auto it = env.find("CUDA_VISIBLE_DEVICES");
  if (it == env.end()) return machine;
  const std::string& var = it->second;
  const auto entries = split_commas(var);
  if (starts_with(var, "GPU-")) return by_uuid(machine, prefixed_entries(entries, "GPU-"));
  if (starts_with(var, "MIG-")) return by_mig(machine, prefixed_entries(entries, "MIG-"));
  return by_index(machine, entries);
}

std::string nvidia_gpus_dir(const std::map<std::string, std::string>& env) {
  auto root = knobs::text("DDPRUN_NVIDIA_GPUS_DIR", &env).value_or("");
  return root.empty() ? std::string(knobs::declared("DDPRUN_NVIDIA_GPUS_DIR").fallback) : root;
}

std::vector<GpuDevice> usable_gpus(const std::map<std::string, std::string>& env) {
  return visible_gpus(machine_gpus(nvidia_gpus_dir(env)), env);
}

}  // namespace ddp::launch
