// etcd v3 JSON gateway bodies (etcd/api.hpp): built and read with nlohmann/json. Every number
// etcd sends may come as a JSON string ("123", grpc-gateway's int64) or a number; both are read.
#include "ddp/rdzv/etcd/api.hpp"

#include <nlohmann/json.hpp>

#include <array>

#include "ddp/proto/error.hpp"

namespace ddp::rdzv::etcd {

using nlohmann::json;

namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int sextet(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

json parse(std::string_view body, const char* what) {
  json j = json::parse(body.begin(), body.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    DDP_THROW(ProtocolError, std::string("etcd ") + what + ": not a JSON object: '" +
                                 std::string(body.substr(0, 200)) + "'");
  }
  if (j.contains("error")) {
    DDP_THROW(ProtocolError, std::string("etcd ") + what + ": " + error_message(body));
  }
  return j;
}

std::int64_t number(const json& j, const char* field, const char* what) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return 0;
  if (it->is_number_integer()) return it->get<std::int64_t>();
  if (it->is_string()) {
    const auto& s = it->get_ref<const std::string&>();
    try {
      std::size_t used = 0;
      const long long v = std::stoll(s, &used);
      if (used == s.size()) return v;
    } catch (const std::exception&) {
    }
  }
  DDP_THROW(ProtocolError, std::string("etcd ") + what + ": field '" + field +
                               "' is not an integer: " + it->dump());
}

std::uint64_t unsigned_number(const json& j, const char* field, const char* what) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return 0;
  if (it->is_number_unsigned() || it->is_number_integer()) return it->get<std::uint64_t>();
  if (it->is_string()) {
    const auto& s = it->get_ref<const std::string&>();
    try {
      std::size_t used = 0;
      const unsigned long long v = std::stoull(s, &used);
      if (used == s.size() && !s.empty() && s[0] != '-') return v;
    } catch (const std::exception&) {
    }
  }
  DDP_THROW(ProtocolError, std::string("etcd ") + what + ": field '" + field +
                               "' is not an unsigned integer: " + it->dump());
}

std::string bytes(const json& j, const char* field, const char* what) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return {};
  if (!it->is_string()) {
    DDP_THROW(ProtocolError,
              std::string("etcd ") + what + ": field '" + field + "' is not a string");
  }
  return base64_decode(it->get_ref<const std::string&>());
}

bool flag(const json& j, const char* field) {
  auto it = j.find(field);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}

Header header_of(const json& j, const char* what) {
  Header h;
  auto it = j.find("header");
  if (it == j.end() || !it->is_object()) return h;
  h.revision = number(*it, "revision", what);
  h.member_id = unsigned_number(*it, "member_id", what);
  h.raft_term = unsigned_number(*it, "raft_term", what);
  return h;
}

KeyValue kv_of(const json& j, const char* what) {
  if (!j.is_object())
    DDP_THROW(ProtocolError, std::string("etcd ") + what + ": a kv is not an object");
  KeyValue kv;
  kv.key = bytes(j, "key", what);
  kv.value = bytes(j, "value", what);
  kv.create_revision = number(j, "create_revision", what);
  kv.mod_revision = number(j, "mod_revision", what);
  kv.version = number(j, "version", what);
  kv.lease = number(j, "lease", what);
  return kv;
}

RangeResult range_of(const json& j, const char* what) {
  RangeResult r;
  r.header = header_of(j, what);
  r.count = number(j, "count", what);
  auto it = j.find("kvs");
  if (it != j.end() && !it->is_null()) {
    if (!it->is_array())
      DDP_THROW(ProtocolError, std::string("etcd ") + what + ": kvs is not a list");
    for (const auto& kv : *it) r.kvs.push_back(kv_of(kv, what));
  }
  return r;
}

WriteResult write_of(const json& j, const char* what) {
  WriteResult w;
  w.header = header_of(j, what);
  w.deleted = number(j, "deleted", what);
  auto it = j.find("prev_kv");
  if (it != j.end() && it->is_object()) w.prev_kv = kv_of(*it, what);
  auto all = j.find("prev_kvs");  // deleterange answers a list
  if (!w.prev_kv && all != j.end() && all->is_array() && !all->empty()) {
    w.prev_kv = kv_of(all->front(), what);
  }
  return w;
}

json op_json(const Op& op) {
  json o;
  o["key"] = base64_encode(op.key);
  if (!op.range_end.empty()) o["range_end"] = base64_encode(op.range_end);
  switch (op.kind) {
    case Op::Kind::range:
      if (op.revision != 0) o["revision"] = std::to_string(op.revision);
      if (op.count_only) o["count_only"] = true;
      if (op.keys_only) o["keys_only"] = true;
      break;
    case Op::Kind::put:
      o["value"] = base64_encode(op.value);
      if (op.lease != 0) o["lease"] = std::to_string(op.lease);
      if (op.prev_kv) o["prev_kv"] = true;
      break;
    case Op::Kind::del:
      if (op.prev_kv) o["prev_kv"] = true;
      break;
  }
  return o;
}

json request_op(const Op& op) {
  switch (op.kind) {
    case Op::Kind::range: return json{{"request_range", op_json(op)}};
    case Op::Kind::put: return json{{"request_put", op_json(op)}};
    case Op::Kind::del: return json{{"request_delete_range", op_json(op)}};
  }
  return {};
}

const char* target_name(Compare::Target t) {
  switch (t) {
    case Compare::Target::version: return "VERSION";
    case Compare::Target::create: return "CREATE";
    case Compare::Target::mod: return "MOD";
    case Compare::Target::value: return "VALUE";
    case Compare::Target::lease: return "LEASE";
  }
  return "VALUE";
}

const char* result_name(Compare::Result r) {
  switch (r) {
    case Compare::Result::equal: return "EQUAL";
    case Compare::Result::greater: return "GREATER";
    case Compare::Result::less: return "LESS";
    case Compare::Result::not_equal: return "NOT_EQUAL";
  }
  return "EQUAL";
}

}  // namespace

std::string base64_encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const auto n = (std::uint32_t(std::uint8_t(in[i])) << 16) |
                   (std::uint32_t(std::uint8_t(in[i + 1])) << 8) | std::uint8_t(in[i + 2]);
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += kAlphabet[(n >> 6) & 63];
    out += kAlphabet[n & 63];
  }
  if (i < in.size()) {
    std::uint32_t n = std::uint32_t(std::uint8_t(in[i])) << 16;
    if (i + 1 < in.size()) n |= std::uint32_t(std::uint8_t(in[i + 1])) << 8;
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += i + 1 < in.size() ? kAlphabet[(n >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string base64_decode(std::string_view in) {
  if (in.size() % 4 != 0) {
    DDP_THROW(ProtocolError, "etcd: base64 text of length " + std::to_string(in.size()) +
                                 " (not a multiple of 4)");
  }
  std::string out;
  out.reserve(in.size() / 4 * 3);
  for (std::size_t i = 0; i < in.size(); i += 4) {
    std::array<int, 4> s{};
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = in[i + static_cast<std::size_t>(k)];
      if (c == '=' && i + 4 == in.size() && k >= 2) {
        s[static_cast<std::size_t>(k)] = 0;
        ++pad;
        continue;
      }
      if (pad > 0 || (s[static_cast<std::size_t>(k)] = sextet(c)) < 0) {
        DDP_THROW(ProtocolError, "etcd: bad base64 character at " + std::to_string(i + k));
      }
    }
    const std::uint32_t n = (std::uint32_t(s[0]) << 18) | (std::uint32_t(s[1]) << 12) |
                            (std::uint32_t(s[2]) << 6) | std::uint32_t(s[3]);
    out += static_cast<char>((n >> 16) & 0xff);
    if (pad < 2) out += static_cast<char>((n >> 8) & 0xff);
    if (pad < 1) out += static_cast<char>(n & 0xff);
  }
  return out;
}

std::string prefix_end(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    auto& c = reinterpret_cast<unsigned char&>(end.back());
    if (c < 0xff) {
      ++c;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

Op Op::range(std::string key, std::string range_end) {
  Op o;
  o.kind = Kind::range;
  o.key = std::move(key);
  o.range_end = std::move(range_end);
  return o;
}

Op Op::put(std::string key, std::string value, std::int64_t lease) {
  Op o;
  o.kind = Kind::put;
  o.key = std::move(key);
  o.value = std::move(value);
  o.lease = lease;
  return o;
}

Op Op::del(std::string key, std::string range_end) {
  Op o;
  o.kind = Kind::del;
  o.key = std::move(key);
  o.range_end = std::move(range_end);
  return o;
}

std::string range_body(const Op& op) { return op_json(op).dump(); }
std::string put_body(const Op& op) { return op_json(op).dump(); }
std::string delete_body(const Op& op) { return op_json(op).dump(); }

std::string txn_body(const std::vector<Compare>& compare, const std::vector<Op>& success,
                     const std::vector<Op>& failure) {
  json t = json::object();
  json c = json::array();
  for (const auto& x : compare) {
    json o{{"key", base64_encode(x.key)},
           {"target", target_name(x.target)},
           {"result", result_name(x.result)}};
    switch (x.target) {
      case Compare::Target::version: o["version"] = std::to_string(x.number); break;
      case Compare::Target::create: o["create_revision"] = std::to_string(x.number); break;
      case Compare::Target::mod: o["mod_revision"] = std::to_string(x.number); break;
      case Compare::Target::lease: o["lease"] = std::to_string(x.number); break;
      case Compare::Target::value: o["value"] = base64_encode(x.value); break;
    }
    c.push_back(std::move(o));
  }
  t["compare"] = std::move(c);
  json s = json::array(), f = json::array();
  for (const auto& op : success) s.push_back(request_op(op));
  for (const auto& op : failure) f.push_back(request_op(op));
  t["success"] = std::move(s);
  t["failure"] = std::move(f);
  return t.dump();
}

std::string lease_grant_body(std::int64_t ttl_s) {
  return json{{"TTL", std::to_string(ttl_s)}, {"ID", "0"}}.dump();
}

std::string lease_id_body(std::int64_t id) { return json{{"ID", std::to_string(id)}}.dump(); }

std::string watch_body(std::string_view key, std::string_view range_end,
                       std::int64_t start_revision, bool prev_kv) {
  json c{{"key", base64_encode(key)}};
  if (!range_end.empty()) c["range_end"] = base64_encode(range_end);
  if (start_revision > 0) c["start_revision"] = std::to_string(start_revision);
  if (prev_kv) c["prev_kv"] = true;
  return json{{"create_request", std::move(c)}}.dump();
}

std::string auth_body(std::string_view user, std::string_view password) {
  return json{{"name", std::string(user)}, {"password", std::string(password)}}.dump();
}

RangeResult parse_range(std::string_view body) { return range_of(parse(body, "range"), "range"); }

WriteResult parse_write(std::string_view body) { return write_of(parse(body, "write"), "write"); }

TxnResult parse_txn(std::string_view body) {
  const json j = parse(body, "txn");
  TxnResult t;
  t.header = header_of(j, "txn");
  t.succeeded = flag(j, "succeeded");
  auto it = j.find("responses");
  if (it != j.end() && it->is_array()) {
    for (const auto& r : *it) {
      if (auto rr = r.find("response_range"); rr != r.end()) {
        t.ranges.push_back(range_of(*rr, "txn"));
      } else if (auto rp = r.find("response_put"); rp != r.end()) {
        t.writes.push_back(write_of(*rp, "txn"));
      } else if (auto rd = r.find("response_delete_range"); rd != r.end()) {
        t.writes.push_back(write_of(*rd, "txn"));
      }
    }
  }
  return t;
}

LeaseGrant parse_lease_grant(std::string_view body) {
  const json j = parse(body, "lease grant");
  LeaseGrant g;
  g.id = number(j, "ID", "lease grant");
  g.ttl = number(j, "TTL", "lease grant");
  if (g.id == 0) DDP_THROW(ProtocolError, "etcd lease grant: no lease ID in the answer");
  return g;
}

std::int64_t parse_keepalive(std::string_view body) {
  const json j = parse(body, "lease keepalive");
  auto it = j.find("result");
  const json& r = (it != j.end() && it->is_object()) ? *it : j;
  return number(r, "TTL", "lease keepalive");
}

std::string parse_auth_token(std::string_view body) {
  const json j = parse(body, "authenticate");
  auto it = j.find("token");
  if (it == j.end() || !it->is_string() || it->get_ref<const std::string&>().empty()) {
    DDP_THROW(ProtocolError, "etcd authenticate: no token in the answer");
  }
  return it->get<std::string>();
}

WatchMessage parse_watch_message(std::string_view line) {
  const json j = parse(line, "watch");
  auto it = j.find("result");
  const json& r = (it != j.end() && it->is_object()) ? *it : j;
  WatchMessage m;
  m.header = header_of(r, "watch");
  m.created = flag(r, "created");
  m.canceled = flag(r, "canceled");
  m.compact_revision = number(r, "compact_revision", "watch");
  if (auto c = r.find("cancel_reason"); c != r.end() && c->is_string()) m.cancel_reason = *c;
  if (auto ev = r.find("events"); ev != r.end() && ev->is_array()) {
    for (const auto& e : *ev) {
      WatchEvent w;
      auto t = e.find("type");
      w.deleted = t != e.end() && t->is_string() && t->get_ref<const std::string&>() == "DELETE";
      if (auto kv = e.find("kv"); kv != e.end()) w.kv = kv_of(*kv, "watch");
      if (auto pk = e.find("prev_kv"); pk != e.end() && pk->is_object()) {
        w.prev_kv = kv_of(*pk, "watch");
      }
      m.events.push_back(std::move(w));
    }
  }
  return m;
}

std::string error_message(std::string_view body) {
  const json j = json::parse(body.begin(), body.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return {};
  auto it = j.find("error");
  if (it == j.end()) return {};
  std::string msg;
  if (it->is_string()) {
    msg = it->get<std::string>();
  } else if (it->is_object()) {  // a stream's error: {"error": {"grpc_code", "message", ...}}
    if (auto m = it->find("message"); m != it->end() && m->is_string()) msg = *m;
  }
  if (msg.empty()) msg = it->dump();
  if (auto c = j.find("code"); c != j.end() && c->is_number()) {
    msg += " (code " + std::to_string(c->get<int>()) + ")";
  }
  return msg;
}

}  // namespace ddp::rdzv::etcd
