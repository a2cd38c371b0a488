// --run-path: the script runs under torchrun's error recording (runpy.run_path in a wrapper).
#pragma once
