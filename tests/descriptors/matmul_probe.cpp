#include "probe.h"
std::string probe_matmul(const ProbeCase &c) { return "{}"; }
std::string probe_cudnn_last_error(const ProbeCase &c) { return "{}"; }
