// --run-path: the script runs as torchrun runs it, under torch's error recording. torchrun
// calls run_script_path (torch/distributed/run.py) in a spawned child wrapped by record(): it
// sets sys.argv = [script, *args] and runs runpy.run_path(script, run_name="__main__"); an
// exception writes $TORCHELASTIC_ERROR_FILE (ErrorHandler.record_exception's JSON, with the
// traceback) and the child exits 1; SystemExit keeps its code. The child's sys.path is
// torchrun's own, so sys.path[0] is the directory of the `torchrun` command, which is the
// interpreter's bin directory: the script's own directory is not on sys.path.
// ddprun runs `python -u -c <bootstrap> script args...`, a bootstrap that does the same
// without importing torch (it works where torch is not installed).
#pragma once

#include <string>

namespace ddp::launch {

// The Python code of the bootstrap: `python -u -c <it> script args...` (worker_argv).
const std::string& run_path_bootstrap();

}  // namespace ddp::launch
