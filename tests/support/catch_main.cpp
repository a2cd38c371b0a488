// Catch2 v2's main(), compiled once and shared by the test executables.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
