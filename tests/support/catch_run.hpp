// Runs the Catch2 session of a test executable (tests/support/catch_impl.cpp): the suites' main()
// (catch_main.cpp) and the GPU tests' (tests/gpu/gpu_main.cpp) call it.
#pragma once

int ddp_catch_run(int argc, char** argv);
