// Part 0 of ember::precompiled (precompiled.inc).
#define EMBER_PRECOMPILED_PART 0
#include "precompiled.inc"
