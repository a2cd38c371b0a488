// Where a GPU library is found at run time (issue 33): a CUDA build links none of cuBLAS or NCCL
// (cudart is static), it loads them with dlopen on first use, so a CPU job never needs them and
// a missing one is named with the places looked in. The order is the one a torch process in the
// same environment follows: the library named in its knob (alone), LD_LIBRARY_PATH's folders,
// the `nvidia-*` pip packages of the Python environments ddp-train belongs to
// (site-packages/nvidia/<folder>/lib, <folder> the library's or cu<MAJOR> since CUDA 13),
// then the system's search (ld.so.cache, the default folders). No CUDA header here: the search
// and its messages are compiled, and tested, in every build.
#pragma once

#include <string>
#include <vector>

#include "ddp/proto/knobs.hpp"

namespace ddp::kernels {

struct LibrarySpec {
  std::string what;                      // "cuBLAS"
  std::string soname;                    // "libcublas.so.13"
  std::vector<std::string> pip_folders;  // under site-packages/nvidia/: {"cublas", "cu13"}
  std::string knob;                      // "DDPRUN_CUBLAS_LIBRARY"
  std::string install_hint;              // "pip install nvidia-cublas (as torch does), or ..."
};

struct SearchPlaces {
  std::string named;  // the knob's value: the only candidate when set
  std::vector<std::string> ld_library_path;
  std::vector<std::string> site_packages;  // in order: ddp-train's own environment first
};

struct Candidate {
  std::string path;  // a file path, or the bare soname for the system's search
  std::string from;  // "DDPRUN_CUBLAS_LIBRARY", "LD_LIBRARY_PATH", "pip package in <site>", ...
};

// Every place to try, in order (pure).
std::vector<Candidate> library_candidates(const LibrarySpec& spec, const SearchPlaces& places);

struct Attempt {
  Candidate candidate;
  std::string error;  // "no such file", or dlopen's own words
};

// "cuBLAS (libcublas.so.13) was not found; tried: ...; <install hint>, or name the file in
// <knob>" (pure).
std::string missing_message(const LibrarySpec& spec, const std::vector<Attempt>& attempts);

// The site-packages folders of the Python environments ddp-train belongs to, those that exist:
// the one its executable is installed in (<site>/ddprun.scripts/ of a repaired wheel, or
// <prefix>/bin/ with <prefix>/lib/python3.*/site-packages), then $VIRTUAL_ENV's, $CONDA_PREFIX's
// and $PYTHONPATH's folders.
std::vector<std::string> site_packages_of(const std::string& exe_path, const knobs::Env* env);

// The places for this process: the knob, LD_LIBRARY_PATH and site_packages_of(/proc/self/exe).
SearchPlaces search_places(const LibrarySpec& spec, const knobs::Env* env = nullptr);

struct LoadedLibrary {
  void* handle = nullptr;  // dlopen's, kept open for the process's life
  std::string path;        // the file loaded (dlinfo's origin when found by the system)
  std::string from;
};

// Opens the first candidate that loads (RTLD_NOW | RTLD_LOCAL); throws ddp::ConfigError with
// missing_message() when none does.
LoadedLibrary load_library(const LibrarySpec& spec, const SearchPlaces& places);

}  // namespace ddp::kernels
