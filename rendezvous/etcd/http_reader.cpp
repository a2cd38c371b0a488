// ResponseReader (etcd/http_reader.hpp): a small state machine over the bytes fed so far.
#include "ddp/rdzv/etcd/http_reader.hpp"

#include <algorithm>
#include <cctype>

#include "ddp/proto/error.hpp"

namespace ddp::rdzv::etcd {

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

}  // namespace

void ResponseReader::feed(std::string_view bytes) {
  if (state_ == State::done && !bytes.empty()) {
    DDP_THROW(ProtocolError, "etcd HTTP: bytes after the end of the response");
  }
  in_.append(bytes);
  step();
}

std::string ResponseReader::take_body() {
  std::string out;
  out.swap(body_);
  return out;
}

void ResponseReader::parse_headers(std::string_view head) {
  const auto eol = head.find("\r\n");
  const std::string_view status_line = head.substr(0, eol);
  // "HTTP/1.1 200 OK"
  if (status_line.substr(0, 5) != "HTTP/" || status_line.size() < 12 || status_line[8] != ' ') {
    DDP_THROW(ProtocolError,
              "etcd HTTP: not a status line: '" + std::string(status_line.substr(0, 80)) + "'");
  }
  const std::string_view code = status_line.substr(9, 3);
  if (!std::all_of(code.begin(), code.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    DDP_THROW(ProtocolError, "etcd HTTP: bad status code '" + std::string(code) + "'");
  }
  status_ = std::stoi(std::string(code));
  keep_alive_ = status_line.substr(5, 3) == "1.1";
  bool chunked = false, has_length = false;
  std::uint64_t length = 0;
  std::size_t at = eol == std::string_view::npos ? head.size() : eol + 2;
  while (at < head.size()) {
    auto end = head.find("\r\n", at);
    if (end == std::string_view::npos) end = head.size();
    const std::string_view line = head.substr(at, end - at);
    at = end + 2;
    const auto colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    const std::string name = lower(trim(line.substr(0, colon)));
    const std::string value = lower(trim(line.substr(colon + 1)));
    if (name == "transfer-encoding") {
      chunked = value.find("chunked") != std::string::npos;
    } else if (name == "content-length") {
      if (value.empty() || value.size() > 18 ||
          !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        DDP_THROW(ProtocolError, "etcd HTTP: bad Content-Length '" + value + "'");
      }
      has_length = true;
      length = std::stoull(value);
    } else if (name == "connection") {
      if (value == "close") keep_alive_ = false;
      if (value == "keep-alive") keep_alive_ = true;
    }
  }
  if (chunked) {
    state_ = State::chunk_size;
  } else if (has_length) {
    remaining_ = length;
    state_ = length == 0 ? State::done : State::length_body;
  } else if (status_ == 204 || status_ == 304) {
    state_ = State::done;
  } else {
    DDP_THROW(ProtocolError, "etcd HTTP: a response with neither Content-Length nor chunked body");
  }
}

void ResponseReader::step() {
  for (;;) {
    switch (state_) {
      case State::headers: {
        const auto end = in_.find("\r\n\r\n");
        if (end == std::string::npos) {
          if (in_.size() > kMaxHeaderBytes) {
            DDP_THROW(ProtocolError, "etcd HTTP: response headers over " +
                                         std::to_string(kMaxHeaderBytes) + " bytes");
          }
          return;
        }
        parse_headers(std::string_view(in_).substr(0, end));
        in_.erase(0, end + 4);
        break;
      }
      case State::length_body: {
        const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(remaining_, in_.size()));
        body_.append(in_, 0, n);
        in_.erase(0, n);
        remaining_ -= n;
        if (remaining_ > 0) return;
        state_ = State::done;
        break;
      }
      case State::chunk_size: {
        const auto eol = in_.find("\r\n");
        if (eol == std::string::npos) {
          if (in_.size() > 64) DDP_THROW(ProtocolError, "etcd HTTP: chunk-size line over 64 bytes");
          return;
        }
        std::string_view line = std::string_view(in_).substr(0, eol);
        line = line.substr(0, line.find(';'));  // chunk extensions
        line = trim(line);
        if (line.empty() || line.size() > 15 || !std::all_of(line.begin(), line.end(), [](char c) {
              return std::isxdigit(static_cast<unsigned char>(c));
            })) {
          DDP_THROW(ProtocolError, "etcd HTTP: bad chunk size '" + std::string(line) + "'");
        }
        remaining_ = std::stoull(std::string(line), nullptr, 16);
        in_.erase(0, eol + 2);
        state_ = remaining_ == 0 ? State::trailers : State::chunk_data;
        break;
      }
      case State::chunk_data: {
        const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(remaining_, in_.size()));
        body_.append(in_, 0, n);
        in_.erase(0, n);
        remaining_ -= n;
        if (remaining_ > 0) return;
        state_ = State::chunk_data_end;
        break;
      }
      case State::chunk_data_end:
        if (in_.size() < 2) return;
        if (in_.compare(0, 2, "\r\n") != 0) {
          DDP_THROW(ProtocolError, "etcd HTTP: a chunk does not end with CRLF");
        }
        in_.erase(0, 2);
        state_ = State::chunk_size;
        break;
      case State::trailers: {  // trailer lines, then an empty line
        const auto eol = in_.find("\r\n");
        if (eol == std::string::npos) {
          if (in_.size() > kMaxHeaderBytes)
            DDP_THROW(ProtocolError, "etcd HTTP: trailers too long");
          return;
        }
        in_.erase(0, eol + 2);
        if (eol == 0) state_ = State::done;
        break;
      }
      case State::done:
        if (!in_.empty())
          DDP_THROW(ProtocolError, "etcd HTTP: bytes after the end of the response");
        return;
    }
  }
}

}  // namespace ddp::rdzv::etcd
