/*
 * graph.h — gpuaccel.Graph (graph.c).
 */
#ifndef GPUACCEL_GRAPH_H
#define GPUACCEL_GRAPH_H

#include "alloc.h"
#include "stream.h"

extern PyType_Spec ga_graph_spec;

#endif
