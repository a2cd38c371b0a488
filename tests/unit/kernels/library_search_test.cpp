// The run-time search for cuBLAS and NCCL (library_search.hpp), without CUDA: the order of the
// candidates (a named file alone; LD_LIBRARY_PATH, the pip packages, the system), the message
// that names each place tried, the Python environments found from the executable's place and
// the environment, and real dlopen()s of a library (the stand-in NVML) planted in a fake
// site-packages tree.
#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "ddp/kernels/library_search.hpp"
#include "ddp/proto/error.hpp"
#include "support/temp_dir.hpp"

namespace fs = std::filesystem;
using namespace ddp::kernels;

namespace {

LibrarySpec spec(const std::string& soname = "libcublas.so.13") {
  return {"cuBLAS", soname, {"cublas", "cu13"}, "DDPRUN_CUBLAS_LIBRARY", "pip install it"};
}

std::vector<std::string> paths(const std::vector<Candidate>& cs) {
  std::vector<std::string> out;
  for (const auto& c : cs) out.push_back(c.path);
  return out;
}

void mkdirs(const std::string& p) { fs::create_directories(p); }

}  // namespace

TEST_CASE("library search: LD_LIBRARY_PATH, then the pip packages, then the system",
          "[unit][kernels]") {
  SearchPlaces p;
  p.ld_library_path = {"/opt/a", "/opt/b"};
  p.site_packages = {"/venv/site", "/conda/site"};
  const auto cs = library_candidates(spec(), p);
  CHECK(paths(cs) == std::vector<std::string>{"/opt/a/libcublas.so.13", "/opt/b/libcublas.so.13",
                                              "/venv/site/nvidia/cublas/lib/libcublas.so.13",
                                              "/venv/site/nvidia/cu13/lib/libcublas.so.13",
                                              "/conda/site/nvidia/cublas/lib/libcublas.so.13",
                                              "/conda/site/nvidia/cu13/lib/libcublas.so.13",
                                              "libcublas.so.13"});
  CHECK(cs[0].from == "LD_LIBRARY_PATH");
  CHECK(cs[2].from == "a pip package in /venv/site");
  CHECK(cs.back().from.find("system") != std::string::npos);
  // Nothing set: the system's search alone.
  CHECK(paths(library_candidates(spec(), {})) == std::vector<std::string>{"libcublas.so.13"});
}

TEST_CASE("library search: a named file is the only candidate", "[unit][kernels]") {
  SearchPlaces p;
  p.named = "/opt/cublas/libcublas.so.13.4";
  p.ld_library_path = {"/opt/a"};
  p.site_packages = {"/venv/site"};
  const auto cs = library_candidates(spec(), p);
  REQUIRE(cs.size() == 1);
  CHECK(cs[0].path == "/opt/cublas/libcublas.so.13.4");
  CHECK(cs[0].from == "DDPRUN_CUBLAS_LIBRARY");
}

TEST_CASE("library search: the message names every place tried and what to do", "[unit][kernels]") {
  std::vector<Attempt> tried{
      {{"/venv/site/nvidia/cu13/lib/libcublas.so.13", "a pip package"}, "no such file"},
      {{"libcublas.so.13", "the system's library search"},
       "libcublas.so.13: cannot open shared object file"}};
  const auto m = missing_message(spec(), tried);
  CHECK_THAT(m, Catch::StartsWith("cuBLAS (libcublas.so.13) was not found; tried:"));
  CHECK_THAT(m, Catch::Contains("/venv/site/nvidia/cu13/lib/libcublas.so.13 (a pip package): "
                                "no such file"));
  CHECK_THAT(m, Catch::Contains("cannot open shared object file"));
  CHECK_THAT(m, Catch::EndsWith("pip install it, or name the file in DDPRUN_CUBLAS_LIBRARY"));
  // A named file that does not load: the knob is the thing to fix.
  const auto named = missing_message(
      spec(), {{{"/x/libcublas.so", "DDPRUN_CUBLAS_LIBRARY"}, "invalid ELF header"}});
  CHECK_THAT(named, Catch::Contains("/x/libcublas.so (DDPRUN_CUBLAS_LIBRARY): invalid ELF header"));
  CHECK_THAT(named, Catch::EndsWith("DDPRUN_CUBLAS_LIBRARY names a file that does not load: fix "
                                    "or unset it"));
}

TEST_CASE("library search: the Python environments of the executable and of the environment",
          "[unit][kernels]") {
  ddp::test::TempDir t("ddp_libsearch");
  const std::string venv = t.path + "/venv", conda = t.path + "/conda";
  mkdirs(venv + "/lib/python3.11/site-packages");
  mkdirs(conda + "/lib/python3.12/site-packages");
  mkdirs(t.path + "/extra");
  mkdirs(t.path + "/wheel/site/ddprun.scripts");
  ddp::knobs::Env env;
  // <prefix>/bin/ddp-train: the prefix's site-packages.
  CHECK(site_packages_of(venv + "/bin/ddp-train", &env) ==
        std::vector<std::string>{venv + "/lib/python3.11/site-packages"});
  // auditwheel's <site>/ddprun.scripts/ddp-train: that site itself.
  CHECK(site_packages_of(t.path + "/wheel/site/ddprun.scripts/ddp-train", &env) ==
        std::vector<std::string>{t.path + "/wheel/site"});
  // A build tree's bin/ has no site-packages: the environment's places only, in order, each once;
  // a PYTHONPATH folder that does not exist is left out.
  env["VIRTUAL_ENV"] = venv;
  env["CONDA_PREFIX"] = conda;
  env["PYTHONPATH"] = t.path + "/extra::" + t.path + "/missing";
  CHECK(site_packages_of(t.path + "/build/bin/ddp-train", &env) ==
        std::vector<std::string>{venv + "/lib/python3.11/site-packages",
                                 conda + "/lib/python3.12/site-packages", t.path + "/extra"});
  CHECK(site_packages_of(venv + "/bin/ddp-train", &env).front() ==
        venv + "/lib/python3.11/site-packages");
  CHECK(site_packages_of(venv + "/bin/ddp-train", &env).size() == 3);
}

TEST_CASE("library search: dlopen finds the pip package's copy and names what failed",
          "[unit][kernels]") {
  ddp::test::TempDir t("ddp_libsearch_load");
  const std::string soname = "libddp_fake_cublas.so.13";
  const std::string site = t.path + "/site";
  mkdirs(site + "/nvidia/cu13/lib");
  fs::copy_file(DDP_FAKE_NVML, site + "/nvidia/cu13/lib/" + soname);
  SearchPlaces p;
  p.ld_library_path = {t.path + "/empty"};
  p.site_packages = {site};
  const auto lib = load_library(spec(soname), p);
  CHECK(lib.handle != nullptr);
  CHECK(lib.path == site + "/nvidia/cu13/lib/" + soname);
  CHECK(lib.from == "a pip package in " + site);

  // Nowhere: every place is in the error, the system's own words last.
  p.site_packages = {t.path + "/nothing"};
  try {
    load_library(spec("libddp_no_such_library.so.9"), p);
    FAIL("no error");
  } catch (const ddp::ConfigError& e) {
    const std::string m = e.what();
    CHECK_THAT(m, Catch::Contains(t.path + "/empty/libddp_no_such_library.so.9 (LD_LIBRARY_PATH): "
                                           "no such file"));
    CHECK_THAT(m, Catch::Contains(t.path + "/nothing/nvidia/cublas/lib/"));
    CHECK_THAT(m, Catch::Contains("libddp_no_such_library.so.9 (the system's library search "
                                  "(ld.so.cache)): libddp_no_such_library.so.9: cannot open"));
  }
  // A named file that is no library: dlopen's words, and no other place tried.
  p.named = t.write("not_a_library.so", "text");
  try {
    load_library(spec(soname), p);
    FAIL("no error");
  } catch (const ddp::ConfigError& e) {
    CHECK_THAT(e.what(), Catch::Contains("not_a_library.so (DDPRUN_CUBLAS_LIBRARY): "));
    CHECK_THAT(e.what(), Catch::Contains("names a file that does not load"));
    CHECK_THAT(e.what(), !Catch::Contains("pip package"));
  }
}
