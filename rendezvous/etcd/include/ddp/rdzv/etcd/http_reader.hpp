// The HTTP/1.1 response side of the etcd client, as a pure byte-fed parser: the status line and
// headers, then a body by Content-Length or chunked transfer encoding (trailers skipped), handed
// out as it is decoded so that a watch stream's lines can be read while the response goes on.
// Bounded: headers up to kMaxHeaderBytes, a chunk-size line up to 64 bytes; anything malformed
// throws ddp::ProtocolError naming what was wrong. No sockets (etcd/http.hpp feeds it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ddp::rdzv::etcd {

class ResponseReader {
 public:
  static constexpr std::size_t kMaxHeaderBytes = 64 * 1024;

  // Takes the next bytes read from the connection.
  void feed(std::string_view bytes);

  bool headers_done() const { return state_ != State::headers; }
  int status() const { return status_; }
  // The decoded body bytes received so far and not yet taken.
  std::string take_body();
  std::size_t body_pending() const { return body_.size(); }
  // The whole response has been read (the body's last byte, or the chunked terminator).
  bool complete() const { return state_ == State::done; }
  // The connection stays usable for the next request (no "Connection: close").
  bool keep_alive() const { return keep_alive_; }

 private:
  enum class State { headers, length_body, chunk_size, chunk_data, chunk_data_end, trailers, done };
  void parse_headers(std::string_view head);
  void step();

  State state_ = State::headers;
  std::string in_;    // bytes fed and not yet parsed
  std::string body_;  // decoded, not yet taken
  int status_ = 0;
  bool keep_alive_ = true;
  std::uint64_t remaining_ = 0;  // of the Content-Length body or of the current chunk
};

}  // namespace ddp::rdzv::etcd
