// unit/status/record_test.cpp (STUB: to be written)
#include <catch2/catch.hpp>
