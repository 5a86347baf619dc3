// tests/test_main.cpp — doctest's main, compiled once and linked into every suite.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
