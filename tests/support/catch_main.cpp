// main() of the test suites: the Catch2 session with the command line (catch_impl.cpp).
#include "support/catch_run.hpp"

int main(int argc, char** argv) { return ddp_catch_run(argc, argv); }
