"""ddprun, installed from its wheel: the programs are in the environment's scripts folder;
this package finds them, for `python -m ddprun` and `python -m ddprun.launch`."""
import os
import sys
import sysconfig

__all__ = ["program", "run"]


def program(name):
    """The path of one of the wheel's programs (ddprun, ddprund, ddpstore, ddp-train)."""
    for scheme_dir in (os.path.join(sysconfig.get_path("platlib"), "ddprun.scripts"),
                       sysconfig.get_path("scripts"),
                       sysconfig.get_path("scripts", f"{os.name}_user"),
                       os.path.dirname(sys.executable)):
        path = os.path.join(scheme_dir, name)
        if os.access(path, os.X_OK):
            return path
    raise FileNotFoundError(f"{name} is not in this environment's scripts folder "
                            f"({sysconfig.get_path('scripts')}): reinstall the ddprun wheel")


def run(name, args):
    """Replaces this process with the program (its exit code is the caller's)."""
    path = program(name)
    os.execv(path, [path, *args])
