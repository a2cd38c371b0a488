// ddprun --help: every flag with its default, grouped as torchrun groups them.
#include <catch2/catch.hpp>
