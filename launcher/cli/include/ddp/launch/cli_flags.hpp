// The one table of ddprun's flags: names, torchrun's PET_<DEST> rule, group, default and help.
// The parser (cli.cpp), `--help`, `--print-completion` and the table in docs/launcher.md are
// all made from it (the docs table is checked against it by a unit test).
#pragma once

#include <span>
#include <string>

namespace ddp::launch {

// torchrun's groups (the comment headings of run.py's get_args_parser), then ddprun's own.
enum class FlagGroup { size, rendezvous, user_code, compat, completion, ddprun };
const char* group_title(FlagGroup g);

struct FlagSpec {
  const char* dest;   // argparse's dest: PET_<DEST> and the config field
  const char* names;  // CLI11's names, short first: "-r,--redirects"
  bool is_switch;     // takes no value
  bool from_env;      // torchrun reads PET_<DEST> for it (action=env / check_env)
  FlagGroup group;
  const char* metavar;   // "" for switches
  const char* fallback;  // the default as --help shows it
  const char* help;
};

std::span<const FlagSpec> flag_specs();

// "--nproc-per-node": the first long name.
std::string long_name(const FlagSpec& s);

// Every name of a flag, spelled as on the command line: "-r, --redirects".
std::string spelled_names(const FlagSpec& s);

// `ddprun --help`: usage, then each group with every flag, its metavar, meaning and default.
std::string help_text();

// docs/launcher.md's flag table (Markdown), one row per flag, in --help's order.
std::string markdown_flag_table();

// `--print-completion SHELL` (bash, zsh or tcsh): a completion script for ddprun made from the
// table; throws ConfigError for another shell.
std::string completion_script(const std::string& shell);

}  // namespace ddp::launch
