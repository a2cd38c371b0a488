// unit/launch/status_text_test.cpp (STUB: to be written)
#include <catch2/catch.hpp>
