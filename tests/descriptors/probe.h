/*
 * probe.h — what the descriptor probe's files share (tests/descriptors,
 * built and run by tests/test_cuda_descriptors.py).
 *
 * The probe includes kernels/cuda/conv.cu and kernels/cuda/matmul.cu (one
 * file each, since both keep their code in an anonymous namespace), calls
 * their own descriptor-building functions against the real cuDNN and
 * cuBLASLt with no GPU, reads every finalized attribute back, and prints
 * what it read as one JSON object per case.  It judges nothing: the test
 * compares what it prints with the math the case asks for.
 *
 * A case is one line of "key=value" words; its reply one line of JSON.
 */
#ifndef GPUACCEL_TESTS_DESCRIPTORS_PROBE_H
#define GPUACCEL_TESTS_DESCRIPTORS_PROBE_H

#include <stdint.h>

#include <map>
#include <string>
#include <vector>

#include "kernels/kernels.h"

struct ProbeCase {
    std::map<std::string, std::string> fields;

    /* false, with a message in *error, for a word that is not key=value */
    bool parse(const std::string &line, std::string *error);
    bool has(const char *key) const;
    std::string text(const char *key) const; /* "" when absent */
    int64_t integer(const char *key, int64_t fallback) const;
    std::vector<int64_t> integers(const char *key) const; /* "1,2,3" */
    ga_dtype dtype(const char *key) const;                /* a name: "float16", ... */
};

/* A JSON object written field by field; values are JSON text already. */
class JsonObject
{
  public:
    JsonObject &raw(const char *key, const std::string &json);
    JsonObject &integer(const char *key, int64_t value);
    JsonObject &number(const char *key, double value);
    JsonObject &boolean(const char *key, bool value);
    JsonObject &string(const char *key, const std::string &value);
    JsonObject &integers(const char *key, const int64_t *values, int64_t n);
    std::string str() const
    {
        return "{" + body_ + "}";
    }

  private:
    std::string body_;
};

std::string json_string(const std::string &s);
std::string json_array(const std::vector<std::string> &items);

/* An activation by the name the Python API takes (kernels.h's
 * ga_activation_name); GA_ACT_NONE for any other word. */
static inline ga_activation activation_by_name(const std::string &name)
{
    for (int a = GA_ACT_NONE; a < GA_ACT_COUNT; a++)
        if (name == ga_activation_name((ga_activation)a))
            return (ga_activation)a;
    return GA_ACT_NONE;
}

/* A ga_status as JSON ("null" when it is ga_ok()). */
std::string json_status(const ga_status &st);

/* The replies of the two halves. */
std::string probe_conv(const ProbeCase &c);
std::string probe_matmul(const ProbeCase &c);
std::string probe_cudnn_last_error(const ProbeCase &c);
std::string probe_cudnn_refusal(const ProbeCase &c);
std::string probe_search_budget(const ProbeCase &c);
std::string probe_choice(const ProbeCase &c);

#endif
