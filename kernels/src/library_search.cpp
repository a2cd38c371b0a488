// The run-time search for a GPU library (library_search.hpp): the candidates in torch's order,
// the message that names every place tried, and the dlopen over them.
#include "ddp/kernels/library_search.hpp"

#include <dlfcn.h>
#include <glob.h>
#include <link.h>

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "ddp/proto/error.hpp"

namespace ddp::kernels {

namespace {

namespace fs = std::filesystem;

std::vector<std::string> split_paths(const std::string& text) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at <= text.size()) {
    const auto colon = text.find(':', at);
    const auto end = colon == std::string::npos ? text.size() : colon;
    if (end > at) out.push_back(text.substr(at, end - at));  // an empty entry is no folder here
    if (colon == std::string::npos) break;
    at = colon + 1;
  }
  return out;
}

bool is_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec);
}

// <prefix>/lib/python3.*/site-packages and Debian's dist-packages, those that exist.
void add_prefix_sites(const std::string& prefix, std::vector<std::string>& out) {
  for (const char* pattern : {"/lib/python3*/site-packages", "/lib/python3*/dist-packages"}) {
    glob_t g{};
    if (::glob((prefix + pattern).c_str(), GLOB_ONLYDIR, nullptr, &g) == 0) {
      for (std::size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
    }
    ::globfree(&g);
  }
}

std::string loaded_path(void* handle, const std::string& fallback) {
  link_map* map = nullptr;
  if (::dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
      *map->l_name != '\0') {
    return map->l_name;
  }
  return fallback;
}

}  // namespace

std::vector<Candidate> library_candidates(const LibrarySpec& spec, const SearchPlaces& places) {
  if (!places.named.empty()) return {{places.named, spec.knob}};
  std::vector<Candidate> out;
  for (const auto& dir : places.ld_library_path) {
    out.push_back({dir + "/" + spec.soname, "LD_LIBRARY_PATH"});
  }
  for (const auto& site : places.site_packages) {
    for (const auto& folder : spec.pip_folders) {
      out.push_back(
          {site + "/nvidia/" + folder + "/lib/" + spec.soname, "a pip package in " + site});
    }
  }
  out.push_back({spec.soname, "the system's library search (ld.so.cache)"});
  return out;
}

std::string missing_message(const LibrarySpec& spec, const std::vector<Attempt>& attempts) {
  std::string m = spec.what + " (" + spec.soname + ") was not found; tried:";
  for (const auto& a : attempts) {
    m += "\n  " + a.candidate.path + " (" + a.candidate.from + "): " + a.error;
  }
  const bool named = attempts.size() == 1 && attempts[0].candidate.from == spec.knob;
  if (named) return m + "\n" + spec.knob + " names a file that does not load: fix or unset it";
  return m + "\n" + spec.install_hint + ", or name the file in " + spec.knob;
}

std::vector<std::string> site_packages_of(const std::string& exe_path, const knobs::Env* env) {
  std::vector<std::string> out;
  const fs::path dir = fs::path(exe_path).parent_path();
  if (dir.filename() == "ddprun.scripts") {  // auditwheel's place: <site>/ddprun.scripts/
    out.push_back(dir.parent_path().string());
  } else if (dir.filename() == "bin") {
    add_prefix_sites(dir.parent_path().string(), out);
  }
  for (const char* name : {"VIRTUAL_ENV", "CONDA_PREFIX"}) {
    if (auto prefix = knobs::text(name, env); prefix && !prefix->empty()) {
      add_prefix_sites(*prefix, out);
    }
  }
  if (auto pp = knobs::text("PYTHONPATH", env)) {
    for (auto& p : split_paths(*pp)) {
      if (is_dir(p)) out.push_back(p);
    }
  }
  std::vector<std::string> unique;  // the first mention keeps its place
  for (auto& s : out) {
    if (std::find(unique.begin(), unique.end(), s) == unique.end()) unique.push_back(s);
  }
  return unique;
}

SearchPlaces search_places(const LibrarySpec& spec, const knobs::Env* env) {
  SearchPlaces p;
  p.named = knobs::text(spec.knob, env).value_or("");
  p.ld_library_path = split_paths(knobs::text("LD_LIBRARY_PATH", env).value_or(""));
  std::error_code ec;
  const auto exe = fs::read_symlink("/proc/self/exe", ec);
  p.site_packages = site_packages_of(ec ? std::string() : exe.string(), env);
  return p;
}

LoadedLibrary load_library(const LibrarySpec& spec, const SearchPlaces& places) {
  std::vector<Attempt> tried;
  for (const auto& c : library_candidates(spec, places)) {
    const bool file = c.path.find('/') != std::string::npos;
    std::error_code ec;
    if (file && !fs::exists(c.path, ec)) {
      tried.push_back({c, "no such file"});
      continue;
    }
    ::dlerror();
    if (void* h = ::dlopen(c.path.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      return {h, loaded_path(h, c.path), c.from};
    }
    const char* why = ::dlerror();
    tried.push_back({c, why != nullptr ? why : "dlopen failed"});
  }
  throw ConfigError(missing_message(spec, tried));
}

}  // namespace ddp::kernels
