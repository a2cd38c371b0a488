// The agent's lines to a worker (regroup.hpp): format and parse, every field checked.
#include "ddp/proto/regroup.hpp"

#include <array>
#include <optional>

#include "ddp/proto/error.hpp"
#include "ddp/proto/number.hpp"

namespace ddp {

namespace {

constexpr std::int64_t kMaxRanks = 1 << 24;  // ranks and nodes of one job
constexpr std::size_t kMaxLine = 512;        // an address of 253 bytes fits with room
constexpr std::string_view kWord = "regroup";

// The next space-separated field of `rest` (which moves past it); nullopt at the end.
std::optional<std::string_view> next_field(std::string_view& rest) {
  const auto sp = rest.find_first_not_of(' ');
  if (sp == std::string_view::npos) return std::nullopt;
  rest = rest.substr(sp);
  const auto end = rest.find(' ');
  const std::string_view field = rest.substr(0, end);
  rest = end == std::string_view::npos ? std::string_view() : rest.substr(end);
  return field;
}

}  // namespace

std::string format_regroup(const Regroup& r) {
  return std::string(kWord) + " round=" + std::to_string(r.round) +
         " rank=" + std::to_string(r.rank) + " world=" + std::to_string(r.world) +
         " local_rank=" + std::to_string(r.local_rank) +
         " local_world=" + std::to_string(r.local_world) +
         " group_rank=" + std::to_string(r.group_rank) +
         " group_world=" + std::to_string(r.group_world) + " master=" + r.master_addr + ":" +
         std::to_string(r.master_port) + " joining=" + std::to_string(r.joining) + "\n";
}

Regroup parse_regroup(std::string_view line) {
  if (line.size() > kMaxLine) throw ConfigError("regroup line longer than 512 bytes");
  if (line.substr(0, kWord.size()) != kWord ||
      (line.size() > kWord.size() && line[kWord.size()] != ' ')) {
    throw ConfigError("not a regroup line: '" + std::string(line.substr(0, 40)) + "'");
  }
  Regroup r;
  constexpr std::array<std::string_view, 9> kKeys = {"round",       "rank",        "world",
                                                     "local_rank",  "local_world", "group_rank",
                                                     "group_world", "master",      "joining"};
  std::array<bool, kKeys.size()> seen{};
  std::string_view rest = line.substr(kWord.size());
  while (const auto next = next_field(rest)) {
    const std::string_view field = *next;
    const auto eq = field.find('=');
    if (eq == std::string_view::npos) {
      throw ConfigError("regroup line: '" + std::string(field) + "' is not key=value");
    }
    const std::string_view key = field.substr(0, eq);
    const std::string_view value = field.substr(eq + 1);
    std::size_t k = 0;
    while (k < kKeys.size() && kKeys[k] != key) ++k;
    if (k == kKeys.size())
      throw ConfigError("regroup line: unknown field '" + std::string(key) + "'");
    if (seen[k]) throw ConfigError("regroup line: field '" + std::string(key) + "' given twice");
    seen[k] = true;
    const std::string what = "regroup " + std::string(key);
    switch (k) {
      case 0: r.round = static_cast<int>(parse_int(value, what, 0, kMaxRanks)); break;
      case 1: r.rank = static_cast<int>(parse_int(value, what, 0, kMaxRanks)); break;
      case 2: r.world = static_cast<int>(parse_int(value, what, 1, kMaxRanks)); break;
      case 3: r.local_rank = static_cast<int>(parse_int(value, what, 0, kMaxRanks)); break;
      case 4: r.local_world = static_cast<int>(parse_int(value, what, 1, kMaxRanks)); break;
      case 5: r.group_rank = static_cast<int>(parse_int(value, what, 0, kMaxRanks)); break;
      case 6: r.group_world = static_cast<int>(parse_int(value, what, 1, kMaxRanks)); break;
      case 8: r.joining = static_cast<int>(parse_int(value, what, 0, kMaxRanks)); break;
      default: {
        const auto colon = value.rfind(':');
        if (colon == std::string_view::npos || colon == 0) {
          throw ConfigError("regroup master '" + std::string(value) + "' is not <addr>:<port>");
        }
        r.master_addr = std::string(value.substr(0, colon));
        r.master_port = static_cast<std::uint16_t>(
            parse_int(value.substr(colon + 1), "regroup master port", 1, 65535));
      }
    }
  }
  for (std::size_t k = 0; k < kKeys.size(); ++k) {
    if (!seen[k]) throw ConfigError("regroup line: field '" + std::string(kKeys[k]) + "' missing");
  }
  if (r.rank >= r.world) throw ConfigError("regroup line: rank is not below world");
  if (r.local_rank >= r.local_world) {
    throw ConfigError("regroup line: local_rank is not below local_world");
  }
  if (r.group_rank >= r.group_world) {
    throw ConfigError("regroup line: group_rank is not below group_world");
  }
  if (r.joining >= r.world) throw ConfigError("regroup line: joining is not below world");
  if (r.local_world > r.world || r.group_world > r.world) {
    throw ConfigError("regroup line: local_world and group_world cannot exceed world");
  }
  return r;
}

std::string format_peer_lost(const PeerLost& p) {
  return "peer_lost rank=" + std::to_string(p.rank) + " heal=" + std::to_string(p.heal) + "\n";
}

PeerLost parse_peer_lost(std::string_view line) {
  if (line.size() > kMaxLine) throw ConfigError("peer_lost line longer than 512 bytes");
  if (agent_line_kind(line) != "peer_lost") {
    throw ConfigError("not a peer_lost line: '" + std::string(line.substr(0, 40)) + "'");
  }
  PeerLost p;
  bool seen[2] = {false, false};
  std::string_view rest = line.substr(std::string_view("peer_lost").size());
  while (const auto next = next_field(rest)) {
    const std::string_view field = *next;
    const auto eq = field.find('=');
    const std::string_view key = field.substr(0, eq);
    const int k = key == "rank" ? 0 : key == "heal" ? 1 : -1;
    if (eq == std::string_view::npos || k < 0) {
      throw ConfigError("peer_lost line: '" + std::string(field) + "' is not rank= or heal=");
    }
    if (seen[k]) throw ConfigError("peer_lost line: field '" + std::string(key) + "' given twice");
    seen[k] = true;
    const auto v = parse_int(field.substr(eq + 1), "peer_lost " + std::string(key), k, kMaxRanks);
    (k == 0 ? p.rank : p.heal) = static_cast<int>(v);
  }
  if (!seen[0] || !seen[1]) {
    throw ConfigError(std::string("peer_lost line: field '") + (seen[0] ? "heal" : "rank") +
                      "' missing");
  }
  return p;
}

std::string_view agent_line_kind(std::string_view line) {
  for (const std::string_view word : {std::string_view("regroup"), std::string_view("peer_lost")}) {
    if (line.substr(0, word.size()) == word &&
        (line.size() == word.size() || line[word.size()] == ' ')) {
      return word;
    }
  }
  return {};
}

}  // namespace ddp
