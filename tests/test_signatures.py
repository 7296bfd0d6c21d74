"""The C functions and types carry text signatures (inspect.signature,
help(), IDEs), and each signature names the arguments the C parser takes:
a name in the signature that the function refused as unknown, or a
parameter the function takes that the signature does not show, fails."""

import inspect

import pytest

import gpuaccel
import gpuaccel._C as C

# arguments the parsers take that are gpuaccel's own plumbing (gpuaccel.torch
# passes them), left out of the public signatures on purpose
PRIVATE_ARGS = {"preactivation_out"}


def _public_callables():
    found = []
    for name in sorted(dir(C)):
        obj = getattr(C, name)
        if callable(obj) and not isinstance(obj, type) and not name.startswith("__"):
            found.append((name, obj))
    for type_name in ("Array", "Stream", "Event", "Device", "Graph"):
        t = getattr(C, type_name)
        found.append((type_name, t))
        for name in sorted(vars(t)):
            obj = getattr(t, name)
            public = not name.startswith("_") or name in ("__dlpack__", "__dlpack_device__", "__array__")
            if public and callable(obj) and not isinstance(obj, type):
                found.append(("%s.%s" % (type_name, name), obj))
    return found


@pytest.mark.parametrize("name,obj", _public_callables(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_c_function_has_a_text_signature(name, obj):
    if name == "Array":
        pytest.skip("Array has no public constructor: gpuaccel.asarray / empty / ... make them")
    sig = inspect.signature(obj)
    assert all(p.name != "$module" for p in sig.parameters.values())
    assert obj.__doc__ and not obj.__doc__.startswith(name.split(".")[-1] + "(")


KEYWORD_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def _unknown_keyword(exc):
    text = str(exc)
    return "unexpected keyword" in text or "invalid keyword" in text


@pytest.mark.parametrize("name", ["matmul", "linear", "linear_backward", "conv2d", "conv2d_backward",
                                  "asarray", "from_dlpack", "empty", "zeros", "ones", "full",
                                  "memory_stats", "set_memory_limit", "current_stream", "synchronize"])
def test_signature_names_are_the_names_the_parser_takes(name):
    fn = getattr(gpuaccel, name)
    sig = inspect.signature(fn)
    required = [p for p in sig.parameters.values()
                if p.default is inspect.Parameter.empty and p.kind in KEYWORD_KINDS]
    for param in sig.parameters.values():
        if param.kind not in KEYWORD_KINDS:
            continue
        # values no parameter accepts, the required ones included (a parser
        # that misses one says so before it looks at unknown keywords): the
        # call fails, but not because a keyword is unknown
        kwargs = {p.name: object() for p in required}
        kwargs[param.name] = object()
        with pytest.raises(Exception) as info:  # any refusal but "unknown keyword"
            fn(**kwargs)
        assert not _unknown_keyword(info.value), (name, param.name, info.value)
    with pytest.raises(TypeError):
        fn(no_such_argument_anywhere=1)


def test_no_private_argument_leaks_into_a_signature():
    for name, obj in _public_callables():
        if name == "Array":
            continue
        assert not PRIVATE_ARGS & set(inspect.signature(obj).parameters), name
