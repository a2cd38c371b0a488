// The values of torch 2.12-2.15's newer flags and ddprun's hang flags (see cli_values.hpp).
// --logs-specs names a Python plugin ddprun cannot load: an error, as torchrun's for one it
// cannot find.
#include "cli_values.hpp"

#include <pwd.h>

#include <cstdlib>

#include "ddp/launch/limits.hpp"
#include "ddp/proto/error.hpp"
#include "ddp/proto/number.hpp"
#include "ddp/rdzv/access.hpp"

namespace ddp::launch {

namespace {

// A user name's uid (the system's user database), for --store-allow-uids.
std::optional<std::uint32_t> user_uid(const std::string& name) {
  const passwd* p = ::getpwnam(name.c_str());
  if (p == nullptr) return std::nullopt;
  return static_cast<std::uint32_t>(p->pw_uid);
}

}  // namespace

// torch 2.15's comma_separated_list: "a,b" -> {a, b}; ",," is a comma inside an item.
std::vector<std::string> comma_separated_list(const std::string& text) {
  std::vector<std::string> out(1);
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != ',') {
      out.back().push_back(text[i]);
    } else if (i + 1 < text.size() && text[i + 1] == ',') {
      out.back().push_back(',');
      ++i;
    } else {
      out.emplace_back();
    }
  }
  return out;
}

void fill_newer_flags(LaunchConfig& c, const std::map<std::string, std::string>& raw) {
  if (raw.at("shutdown_timeout") != kUnset) {
    c.shutdown_timeout_s = static_cast<int>(
        parse_int(raw.at("shutdown_timeout"), "--shutdown-timeout", 0, kMaxSeconds));
  }
  const std::string& numa = raw.at("numa_binding");
  if (!numa.empty() && numa != "node" && numa != "socket" && numa != "exclusive" &&
      numa != "core-complex") {
    throw ConfigError("--numa-binding: invalid choice '" + numa +
                      "' (choose from node, socket, exclusive, core-complex)");
  }
  c.numa_binding = numa;
  if (raw.at("duplicate_stdout_filters") != kUnset) {
    c.duplicate_stdout_filters = comma_separated_list(raw.at("duplicate_stdout_filters"));
  }
  if (raw.at("duplicate_stderr_filters") != kUnset) {
    c.duplicate_stderr_filters = comma_separated_list(raw.at("duplicate_stderr_filters"));
  }
  c.hang_timeout_s =
      static_cast<double>(
          parse_seconds(raw.at("hang_timeout"), "--hang-timeout", 0, kMaxSeconds).count()) /
      1000.0;
  c.on_hang = raw.at("on_hang");
  if (c.on_hang != "report" && c.on_hang != "dump" && c.on_hang != "restart" &&
      c.on_hang != "stop") {
    throw ConfigError("--on-hang: invalid choice '" + c.on_hang +
                      "' (choose from report, dump, restart, stop)");
  }
  const std::string& sf = raw.at("straggler_factor");
  char* end = nullptr;
  c.straggler_factor = std::strtod(sf.c_str(), &end);
  if (sf.empty() || end != sf.c_str() + sf.size() || !(c.straggler_factor >= 0) ||
      c.straggler_factor > 1000) {
    throw ConfigError("--straggler-factor: '" + sf + "' is not a number in [0, 1000]");
  }
  if (c.straggler_factor > 0 && c.straggler_factor <= 1) {
    throw ConfigError("--straggler-factor: " + raw.at("straggler_factor") +
                      " must be above 1 (or 0: off)");
  }
  c.status_interval_s =
      static_cast<double>(
          parse_seconds(raw.at("status_interval"), "--status-interval", 0, 3600).count()) /
      1000.0;
  if (c.status_interval_s > 0 && c.status_interval_s < 0.1) {
    throw ConfigError("--status-interval: " + raw.at("status_interval") +
                      " is below 0.1 s (0: off)");
  }
  c.store_outage_grace_s =
      static_cast<double>(parse_seconds(raw.at("store_outage_grace"), "--store-outage-grace", 0,
                                        kMaxOutageGraceSeconds)
                              .count()) /
      1000.0;
  if (raw.at("http_port") != kUnset && raw.at("http_port") != "off") {
    c.http_port = static_cast<int>(parse_int(raw.at("http_port"), "--http-port", 0, 65535));
  }
  if (raw.at("http_host") != kUnset) {
    if (raw.at("http_host").empty()) throw ConfigError("--http-host: empty");
    c.http_host = raw.at("http_host");
  }
  if (raw.at("store_allow") != kUnset) {
    c.store_allow = rdzv::parse_cidrs(raw.at("store_allow"), "--store-allow");
  }
  if (raw.at("http_token_file") != kUnset) {
    if (raw.at("http_token_file").empty()) throw ConfigError("--http-token-file: empty file name");
    c.http_token_file = raw.at("http_token_file");
  }
  for (const char* k : {"http_tls_cert", "http_tls_key"}) {
    if (raw.at(k) == kUnset) continue;
    if (raw.at(k).empty()) throw ConfigError(std::string("--") + k + ": empty file name");
    (std::string_view(k) == "http_tls_cert" ? c.http_tls_cert : c.http_tls_key) = raw.at(k);
  }
  if (raw.at("store_allow_uids") != kUnset) {
    c.store_allow_uids =
        rdzv::parse_uids(raw.at("store_allow_uids"), "--store-allow-uids", user_uid);
  }
  if (raw.at("gpu_job_mapping_dir") != kUnset) {
    if (raw.at("gpu_job_mapping_dir").empty()) {
      throw ConfigError("--gpu-job-mapping-dir: empty folder name");
    }
    c.gpu_job_mapping_dir = raw.at("gpu_job_mapping_dir");
  }
  if (raw.at("trace") != kUnset) {
    if (raw.at("trace").empty()) throw ConfigError("--trace: empty file name");
    c.trace_path = raw.at("trace");
  }
  c.progress = raw.at("progress");
  if (c.progress != "auto" && c.progress != "tty" && c.progress != "lines" && c.progress != "off") {
    throw ConfigError("--progress: invalid choice '" + c.progress +
                      "' (choose from auto, tty, lines, off)");
  }
  if (raw.at("logs_specs") != kUnset) {
    throw ConfigError("--logs-specs: Could not find entrypoint under 'torchrun.logs_specs[" +
                      raw.at("logs_specs") +
                      "]' key (ddprun cannot load torchrun's Python LogsSpecs plugins; its own "
                      "logs are set with --log-dir, --redirects, --tee and --local-ranks-filter)");
  }
}

}  // namespace ddp::launch
