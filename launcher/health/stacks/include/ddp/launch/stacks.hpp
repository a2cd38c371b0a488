// Stacks of live workers, taken from outside with the tools found on PATH: py-spy
// (`py-spy dump --pid P --json`) for Python processes, then eu-stack (elfutils, native frames)
// for anything; each optional, each bounded by a timeout, all pids in parallel. What could not
// be taken is said, never guessed. Parsers are pure.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::launch {

struct Frame {
  std::string function;
  std::string file;  // "" for native frames without one
  int line = 0;
};

struct ThreadStack {
  std::string name;
  bool main = false;          // the process's main thread (tid == pid, or py-spy's first)
  std::vector<Frame> frames;  // innermost first
};

struct ProcessStacks {
  pid_t pid = 0;
  std::string tool;  // "py-spy", "eu-stack" or "" when none worked
  std::vector<ThreadStack> threads;
  std::string error;  // why no stack: tool missing, permission, timeout, not Python...
};

std::vector<ThreadStack> parse_py_spy_json(std::string_view text);  // throws ddp::ProtocolError
std::vector<ThreadStack> parse_eu_stack(std::string_view text, pid_t pid);

// The main thread's frames (innermost first); empty when there is none.
const std::vector<Frame>& main_frames(const ProcessStacks& p);

// Takes every pid's stacks in parallel, each tool bounded by `timeout`. `path_var` is the PATH
// to find py-spy and eu-stack on.
std::vector<ProcessStacks> take_stacks(const std::vector<pid_t>& pids, const std::string& path_var,
                                       std::chrono::milliseconds timeout);

// Compact JSON for the store (one node's stacks) and back.
std::string stacks_to_json(const std::vector<ProcessStacks>& stacks);
std::vector<ProcessStacks> stacks_from_json(std::string_view text);  // throws ProtocolError

}  // namespace ddp::launch
