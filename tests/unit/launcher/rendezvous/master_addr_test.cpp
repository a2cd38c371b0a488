// The workers' MASTER_ADDR rules (master_addr.hpp): Python's getfqdn() pick, the c10d and
// --standalone choice with its listening address, the static backend's host, and which keys
// of an agent's store are the workers'.
#include "ddp/launch/master_addr.hpp"

#include <catch2/catch.hpp>

using namespace ddp::launch;

TEST_CASE("pick_fqdn follows Python's getfqdn: the first name with a dot, else the name",
          "[launch][master_addr]") {
  CHECK(pick_fqdn("localhost", {}) == "localhost");
  CHECK(pick_fqdn("node1", {"node1.cluster", "n1.other"}) == "node1.cluster");
  CHECK(pick_fqdn("node1.cluster", {"alias.x"}) == "node1.cluster");
  CHECK(pick_fqdn("node1", {"n1", "n2"}) == "node1");
}

TEST_CASE("is_loopback_address takes numeric IPv4 and IPv6 loopbacks only",
          "[launch][master_addr]") {
  CHECK(is_loopback_address("127.0.0.1"));
  CHECK(is_loopback_address("127.0.1.1"));
  CHECK(is_loopback_address("::1"));
  CHECK_FALSE(is_loopback_address("10.0.0.5"));
  CHECK_FALSE(is_loopback_address("::ffff:10.0.0.5"));
  CHECK_FALSE(is_loopback_address("localhost"));  // a name, not an address
  CHECK_FALSE(is_loopback_address(""));
}

TEST_CASE("flag --local-addr is MASTER_ADDR, as under torchrun", "[launch][master_addr]") {
  auto w = choose_workers_addr("10.1.2.3", true, "node1.cluster", {"10.1.2.3"});
  CHECK(w.master_addr == "10.1.2.3");
  CHECK(w.bind == "0.0.0.0");
  w = choose_workers_addr("127.0.0.1", false, "node1.cluster", {});
  CHECK(w.master_addr == "127.0.0.1");
  CHECK(w.bind == "127.0.0.1");
}

TEST_CASE("across machines, MASTER_ADDR is the fqdn and the store listens everywhere",
          "[launch][master_addr]") {
  auto w = choose_workers_addr("", false, "node1.cluster", {});
  CHECK(w.master_addr == "node1.cluster");
  CHECK(w.bind == "0.0.0.0");
}

TEST_CASE("on one machine, the fqdn is kept when it names loopback, and listened on",
          "[launch][master_addr]") {
  auto w = choose_workers_addr("", true, "localhost", {"::1", "127.0.0.1"});
  CHECK(w.master_addr == "localhost");
  CHECK(w.bind == "127.0.0.1");                                     // the IPv4 one first
  w = choose_workers_addr("", true, "box.example", {"127.0.1.1"});  // Debian's /etc/hosts
  CHECK(w.master_addr == "box.example");
  CHECK(w.bind == "127.0.1.1");
  w = choose_workers_addr("", true, "v6only", {"::1"});
  CHECK(w.bind == "::1");
}

TEST_CASE("on one machine, an fqdn off loopback gives 127.0.0.1: the store stays private",
          "[launch][master_addr]") {
  auto w = choose_workers_addr("", true, "node1.cluster", {"10.0.0.5"});
  CHECK(w.master_addr == "127.0.0.1");
  CHECK(w.bind == "127.0.0.1");
  w = choose_workers_addr("", true, "mixed", {"127.0.0.1", "10.0.0.5"});
  CHECK(w.master_addr == "127.0.0.1");
  w = choose_workers_addr("", true, "unresolved", {});
  CHECK(w.master_addr == "127.0.0.1");
}

TEST_CASE("static: MASTER_ADDR is the host as written, without IPv6 brackets",
          "[launch][master_addr]") {
  CHECK(static_master_addr("127.0.0.1") == "127.0.0.1");
  CHECK(static_master_addr("localhost") == "localhost");
  CHECK(static_master_addr("node0.cluster") == "node0.cluster");
  CHECK(static_master_addr("[::1]") == "::1");
  CHECK(static_master_addr("::1") == "::1");
}

TEST_CASE("the workers' keys are all but the agents' /ddprun/ namespace", "[launch][master_addr]") {
  CHECK(is_worker_key("default_pg/0//rank_0"));
  CHECK(is_worker_key("init/"));
  CHECK(is_worker_key("attempt0_marker"));
  CHECK(is_worker_key("ddprun/x"));
  CHECK(is_worker_key(""));
  CHECK_FALSE(is_worker_key("/ddprun/none/round"));
  CHECK_FALSE(is_worker_key("/ddprun/job/r3/master"));
}
