/*
 * main.cpp — the descriptor probe's driver: reads cases from stdin, one per
 * line, and writes one JSON line per case to stdout (see probe.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <iostream>

#include <cublasLt.h>
#include <cudnn.h>

#include "probe.h"

/* The plan caches, as the extension has them, and the conv key they are
 * looked up by. */
#include "kernels/conv_key.c"
#include "kernels/cuda/plan_cache.cu"

#include "kernels/cuda/conv_direct.cuh"

/* What conv.cu's driver calls after cuDNN: kernels the probe has no device
 * for.  The probe runs the driver only as far as it goes without a device
 * (see probe_conv's run=1); a stand-in that is reached answers with its
 * name as the failing call, which shows how far the driver got. */
static ga_status not_in_probe(const char *what)
{
    return ga_status_make(GA_ERR_NOT_SUPPORTED, 0, "probe", "not in the descriptor probe", what,
                          __FILE__, __LINE__);
}

ga_status ga_conv_direct(GaConvOp, const ga_conv_geometry &, const ga_tensor &, const ga_tensor &,
                         const ga_tensor &, const void *, ga_activation, const ga_tensor *,
                         cudaStream_t)
{
    return not_in_probe("ga_conv_direct");
}

extern "C" ga_status ga_cuda_copy(int, const ga_tensor *, const ga_tensor *, ga_stream)
{
    return not_in_probe("ga_cuda_copy");
}

extern "C" ga_status ga_cuda_bias_activation(int, const ga_bias_act_desc *, ga_stream)
{
    return not_in_probe("ga_cuda_bias_activation");
}

bool ProbeCase::parse(const std::string &line, std::string *error)
{
    fields.clear();
    size_t pos = 0;
    while (pos < line.size()) {
        size_t end = line.find(' ', pos);
        if (end == std::string::npos)
            end = line.size();
        std::string word = line.substr(pos, end - pos);
        pos = end + 1;
        if (word.empty())
            continue;
        size_t eq = word.find('=');
        if (eq == std::string::npos || eq == 0) {
            *error = "not key=value: " + word;
            return false;
        }
        fields[word.substr(0, eq)] = word.substr(eq + 1);
    }
    return true;
}

bool ProbeCase::has(const char *key) const
{
    return fields.count(key) != 0;
}

std::string ProbeCase::text(const char *key) const
{
    auto it = fields.find(key);
    return it == fields.end() ? std::string() : it->second;
}

int64_t ProbeCase::integer(const char *key, int64_t fallback) const
{
    auto it = fields.find(key);
    return it == fields.end() ? fallback : strtoll(it->second.c_str(), nullptr, 0);
}

std::vector<int64_t> ProbeCase::integers(const char *key) const
{
    std::vector<int64_t> out;
    std::string s = text(key);
    const char *p = s.c_str();
    while (*p) {
        char *end = nullptr;
        out.push_back(strtoll(p, &end, 0));
        p = *end == ',' ? end + 1 : end;
        if (end == p && *p)
            break;
    }
    return out;
}

ga_dtype ProbeCase::dtype(const char *key) const
{
    static const char *names[GA_NUM_DTYPES] = {"bool",    "uint8",  "int8",    "int16",
                                               "int32",   "int64",  "float16", "bfloat16",
                                               "float32", "float64"};
    std::string s = text(key);
    for (int i = 0; i < GA_NUM_DTYPES; i++)
        if (s == names[i])
            return (ga_dtype)i;
    return GA_NUM_DTYPES;
}

JsonObject &JsonObject::raw(const char *key, const std::string &json)
{
    if (!body_.empty())
        body_ += ", ";
    body_ += json_string(key) + ": " + json;
    return *this;
}

JsonObject &JsonObject::integer(const char *key, int64_t value)
{
    return raw(key, std::to_string(value));
}

JsonObject &JsonObject::number(const char *key, double value)
{
    char buf[64];
    snprintf(buf, sizeof buf, "%.17g", value);
    return raw(key, buf);
}

JsonObject &JsonObject::boolean(const char *key, bool value)
{
    return raw(key, value ? "true" : "false");
}

JsonObject &JsonObject::string(const char *key, const std::string &value)
{
    return raw(key, json_string(value));
}

JsonObject &JsonObject::integers(const char *key, const int64_t *values, int64_t n)
{
    std::vector<std::string> items;
    for (int64_t i = 0; i < n; i++)
        items.push_back(std::to_string(values[i]));
    return raw(key, json_array(items));
}

std::string json_string(const std::string &s)
{
    std::string out = "\"";
    for (unsigned char ch : s) {
        if (ch == '"' || ch == '\\') {
            out += '\\';
            out += (char)ch;
        } else if (ch < 0x20) {
            char buf[8];
            snprintf(buf, sizeof buf, "\\u%04x", ch);
            out += buf;
        } else {
            out += (char)ch;
        }
    }
    return out + "\"";
}

std::string json_array(const std::vector<std::string> &items)
{
    std::string out = "[";
    for (size_t i = 0; i < items.size(); i++)
        out += (i ? ", " : "") + items[i];
    return out + "]";
}

std::string json_status(const ga_status &st)
{
    if (st.error == GA_OK)
        return "null";
    JsonObject o;
    o.integer("error", (int)st.error).integer("code", st.code);
    o.string("name", st.name ? st.name : "").string("message", st.message ? st.message : "");
    o.string("call", st.call ? st.call : "").string("file", st.file ? st.file : "");
    o.integer("line", st.line);
    return o.str();
}

int main()
{
    /* the libraries' versions first, so the test can say what it checked */
    JsonObject versions;
    versions.integer("cudnn", (int64_t)cudnnGetVersion()).integer("cudnn_built", CUDNN_VERSION);
    versions.integer("cublaslt", (int64_t)cublasLtGetVersion());
    std::cout << versions.str() << std::endl;
    std::string line;
    /* the probes by the name a case line gives in probe=<name> */
    static const struct {
        const char *name;
        std::string (*run)(const ProbeCase &);
    } probes[] = {{"conv", probe_conv},
                  {"matmul", probe_matmul},
                  {"cudnn_last_error", probe_cudnn_last_error},
                  {"cudnn_refusal", probe_cudnn_refusal},
                  {"search_budget", probe_search_budget},
                  {"choice", probe_choice}};
    while (std::getline(std::cin, line)) {
        ProbeCase c;
        std::string error, reply;
        if (!c.parse(line, &error)) {
            reply = JsonObject().string("protocol_error", error).str();
        } else {
            reply =
                JsonObject().string("protocol_error", "unknown probe: " + c.text("probe")).str();
            for (const auto &probe : probes)
                if (c.text("probe") == probe.name)
                    reply = probe.run(c);
        }
        std::cout << reply << std::endl;
    }
    return 0;
}
