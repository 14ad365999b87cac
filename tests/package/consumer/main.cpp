#include <ember/config.hpp>

int main() { return EMBER_VERSION_MAJOR >= 0 ? 0 : 1; }
