#include "probe.h"
std::string probe_matmul(const ProbeCase &c) { return "{}"; }
