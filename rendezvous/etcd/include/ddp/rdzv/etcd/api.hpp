// etcd v3's JSON gateway (issue 21), as pure functions: the request bodies ddprun sends and the
// responses it reads, for KV (range, put, delete, txn), leases and watches. No sockets: the HTTP
// transport is etcd/http.hpp. Keys and values travel base64-encoded and 64-bit numbers as JSON
// strings, as grpc-gateway writes them; fields at their zero value are left out of responses.
// A body that does not parse, or a field of the wrong type, throws ddp::ProtocolError naming it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::rdzv::etcd {

std::string base64_encode(std::string_view bytes);
// Throws ddp::ProtocolError on a character outside the alphabet or a bad length.
std::string base64_decode(std::string_view text);

// The range_end that selects every key starting with prefix (etcd's "prefix + 1"); "\0" (all
// keys) for an empty prefix or one of only 0xff bytes.
std::string prefix_end(std::string_view prefix);

struct Header {
  std::int64_t revision = 0;
  std::uint64_t member_id = 0;
  std::uint64_t raft_term = 0;
};

struct KeyValue {
  std::string key;
  std::string value;
  std::int64_t create_revision = 0;
  std::int64_t mod_revision = 0;
  std::int64_t version = 0;
  std::int64_t lease = 0;
};

// One operation, as a request of its own or inside a txn.
struct Op {
  enum class Kind { range, put, del };
  Kind kind = Kind::range;
  std::string key;
  std::string range_end;      // range/del: empty for the key alone
  std::string value;          // put
  std::int64_t lease = 0;     // put: attach to this lease
  std::int64_t revision = 0;  // range: read at this revision (0: latest)
  bool count_only = false;    // range
  bool keys_only = false;     // range
  bool prev_kv = false;       // put/del: return what was there

  static Op range(std::string key, std::string range_end = {});
  static Op put(std::string key, std::string value, std::int64_t lease = 0);
  static Op del(std::string key, std::string range_end = {});
};

struct Compare {
  enum class Target { version, create, mod, value, lease };
  enum class Result { equal, greater, less, not_equal };
  std::string key;
  Target target = Target::value;
  Result result = Result::equal;
  std::int64_t number = 0;  // version / create / mod / lease
  std::string value;        // value
};

struct RangeResult {
  Header header;
  std::vector<KeyValue> kvs;
  std::int64_t count = 0;
};

// A put's or delete's answer (prev_kv when asked for; deleted counts keys).
struct WriteResult {
  Header header;
  std::optional<KeyValue> prev_kv;
  std::int64_t deleted = 0;
};

struct TxnResult {
  Header header;
  bool succeeded = false;
  // One per op of the branch taken, in order; range answers in ranges (put/delete: empty).
  std::vector<RangeResult> ranges;
  std::vector<WriteResult> writes;
};

struct LeaseGrant {
  std::int64_t id = 0;
  std::int64_t ttl = 0;
};

struct WatchEvent {
  bool deleted = false;  // else a put
  KeyValue kv;
  std::optional<KeyValue> prev_kv;
};

struct WatchMessage {
  Header header;
  bool created = false;
  bool canceled = false;
  std::int64_t compact_revision = 0;  // > 0: the start revision was compacted away
  std::string cancel_reason;
  std::vector<WatchEvent> events;
};

// Request bodies (JSON text) for POST /v3/<path>; the path is each one's comment.
std::string range_body(const Op& op);   // kv/range
std::string put_body(const Op& op);     // kv/put
std::string delete_body(const Op& op);  // kv/deleterange
std::string txn_body(const std::vector<Compare>& compare, const std::vector<Op>& success,
                     const std::vector<Op>& failure);  // kv/txn
std::string lease_grant_body(std::int64_t ttl_s);      // lease/grant
std::string lease_id_body(std::int64_t id);            // lease/keepalive, lease/revoke
std::string watch_body(std::string_view key, std::string_view range_end,
                       std::int64_t start_revision, bool prev_kv);        // watch
std::string auth_body(std::string_view user, std::string_view password);  // auth/authenticate

// Responses. An {"error": ...} body throws ddp::ProtocolError with etcd's message (callers that
// map HTTP status first see it there).
RangeResult parse_range(std::string_view body);
WriteResult parse_write(std::string_view body);
TxnResult parse_txn(std::string_view body);
LeaseGrant parse_lease_grant(std::string_view body);
// A keepalive's answer: the lease's remaining TTL in seconds, 0 when it has expired. The
// gateway wraps it as {"result": {...}}.
std::int64_t parse_keepalive(std::string_view body);
std::string parse_auth_token(std::string_view body);
// One message of a watch stream ({"result": {...}}; an {"error": ...} throws).
WatchMessage parse_watch_message(std::string_view line);

// etcd's error text of an error body ({"error": "...", "code": N, "message": "..."}), or empty
// when the body is not one.
std::string error_message(std::string_view body);

}  // namespace ddp::rdzv::etcd
