// unit/status/job_view_test.cpp (STUB: to be written)
#include <catch2/catch.hpp>
