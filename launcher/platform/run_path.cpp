// The --run-path bootstrap (see run_path.hpp): torch's run_script_path under record(), in a
// few lines of plain Python. The error file is what torch's ErrorHandler.record_exception
// writes: {"message": {"message": "<Type>: <text>", "extraInfo": {"py_callstack":
// traceback.format_exc(), "timestamp": str(int(time.time()))}}}.
#include "ddp/launch/run_path.hpp"

namespace ddp::launch {

const std::string& run_path_bootstrap() {
  static const std::string code = R"PY(import faulthandler, os, sys
try:
    faulthandler.enable(all_threads=True)
except Exception:
    pass
sys.argv = sys.argv[1:]
sys.path[0] = os.path.dirname(sys.executable)
del faulthandler, os


def _ddprun_run_path():
    import runpy
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except Exception as e:
        import json, os, time, traceback
        path = os.environ.get("TORCHELASTIC_ERROR_FILE")
        if path:
            data = {"message": {"message": f"{type(e).__name__}: {e}", "extraInfo": {
                "py_callstack": traceback.format_exc(),
                "timestamp": str(int(time.time()))}}}
            with open(path, "w") as fp:
                json.dump(data, fp)
        raise


_ddprun_run_path()
)PY";
  return code;
}

}  // namespace ddp::launch
