// The pieces every metrics file writes with (metrics.cpp, metrics_training.cpp): numbers and
// labels in the text format, one family at a time, and the jobs indexed with their label sets.
// Internal to status/views.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/status/metrics.hpp"

namespace ddp::status::detail {

inline void append_number(std::string& out, double v) {
  if (std::isnan(v)) {
    out += "NaN";
    return;
  }
  if (std::isinf(v)) {
    out += v > 0 ? "+Inf" : "-Inf";
    return;
  }
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, r.ptr);
}

inline void append_number(std::string& out, std::int64_t v) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, r.ptr);
}

inline void append_number(std::string& out, std::uint64_t v) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, r.ptr);
}

inline void append_number(std::string& out, int v) { append_number(out, std::int64_t{v}); }

// name="value" (escaped), after a comma unless it opens the set.
inline void append_label(std::string& out, std::string_view name, std::string_view value) {
  if (!out.empty()) out += ',';
  out += name;
  out += "=\"";
  out += escape_label_value(value);
  out += '"';
}

// HELP text: backslash and newline escaped (quotes are not, in HELP).
inline std::string escape_help(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// One family: its samples gathered, then written with its header if it has any.
class Family {
 public:
  Family(std::string& out, std::string_view name, std::string_view type, std::string_view help)
      : out_(out), name_(name), type_(type), help_(help) {}
  Family(const Family&) = delete;
  Family& operator=(const Family&) = delete;
  ~Family() { flush(); }

  // labels: the inside of {...}, already escaped; extra: one more label (name, value) or none.
  template <typename V>
  void sample(std::string_view labels, V value, std::string_view extra_name = {},
              std::string_view extra_value = {}) {
    body_ += name_;
    if (!labels.empty() || !extra_name.empty()) {
      body_ += '{';
      body_ += labels;
      if (!extra_name.empty()) {
        if (!labels.empty()) body_ += ',';
        body_ += extra_name;
        body_ += "=\"";
        body_ += escape_label_value(extra_value);
        body_ += '"';
      }
      body_ += '}';
    }
    body_ += ' ';
    append_number(body_, value);
    body_ += '\n';
  }

 private:
  void flush() {
    if (body_.empty()) return;
    out_ += "# HELP ";
    out_ += name_;
    out_ += ' ';
    out_ += escape_help(help_);
    out_ += "\n# TYPE ";
    out_ += name_;
    out_ += ' ';
    out_ += type_;
    out_ += '\n';
    out_ += body_;
  }

  std::string& out_;
  std::string_view name_, type_, help_;
  std::string body_;
};

struct RankView {
  const RankStatus* r;
  std::string labels;  // run_id, node, rank, local_rank
  bool live;           // its process is there to sample: node not lost, state not final
};

struct NodeView {
  const NodeStatus* n;
  std::string labels;  // run_id, node
  std::vector<RankView> ranks;
};

struct JobView {
  const JobStatus* j;
  std::string labels;  // run_id
  std::vector<NodeView> nodes;
};

// The job-level summary and the workers' own metrics (metrics_training.cpp).
void render_training(std::string& out, const std::vector<JobView>& jobs);

}  // namespace ddp::status::detail
