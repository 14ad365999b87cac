// Part 1 of ember::precompiled (precompiled.inc).
#define EMBER_PRECOMPILED_PART 1
#include "precompiled.inc"
