// StoreServer: the TCPStore-compatible server, embeddable in any process (the launcher hosts
// it on the master node) and wrapped by the ddprund daemon. Asio stays behind the pimpl.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "ddp/proto/opcodes.hpp"

namespace ddp::rdzv {

struct ServerOptions {
  std::string host = "127.0.0.1";  // bound as given; "0.0.0.0" or "::" for every interface
  std::uint16_t port = 0;          // 0: the OS picks a free port; read it back with port()
  unsigned threads = 0;            // event-loop threads; 0: half the cores, 1 to 4
  proto::Limits limits;
  std::size_t max_connections = 65536;
  // Keys, values and queued items together, each counted with 64 bytes of overhead. A write
  // past it closes that client's connection with the reason; 0 disables the cap.
  std::size_t max_store_bytes = std::size_t{1} << 30;
  int backlog = 65535;  // capped by the kernel's net.core.somaxconn
};

struct ServerStats {
  std::uint64_t connections_open = 0;
  std::uint64_t connections_total = 0;
  std::uint64_t connections_refused = 0;  // over max_connections
  std::uint64_t requests = 0;
  std::uint64_t protocol_errors = 0;  // connections closed for a bad request
};

class StoreServer {
 public:
  explicit StoreServer(ServerOptions options);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  // Binds and starts the event loops; throws ddp::IoError if the address cannot be bound.
  void start();
  // Closes the listener and every connection, joins the loops. Idempotent.
  void stop();

  std::uint16_t port() const;
  const std::string& host() const;
  ServerStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp::rdzv
