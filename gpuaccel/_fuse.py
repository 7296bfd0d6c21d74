"""gpuaccel.torch.fuse: a model's fusable layer chains replaced by gpuaccel's
fused layers, in one call, computing the same function in train and eval
mode.

What is fused, found in the model's torch.fx graph (symbolic_trace):

- Linear -> activation and Conv2d -> activation: FusedLinear / FusedConv2d,
  in both modes;
- Conv2d -> BatchNorm2d (-> activation): FusedConv2dBN, which folds the
  BatchNorm into the conv while the BatchNorm is in eval mode and runs the
  three as before while it is in training mode (batch statistics cannot
  fold; the running statistics are updated as before);

activations as modules (nn.ReLU(inplace=True) too), functions (F.relu,
torch.relu, F.gelu(approximate=...), F.silu, F.hardswish, torch.sigmoid, ...)
or tensor methods (x.relu()), where gpuaccel's build has the activation.

Why a model is traced with every module that holds no Conv2d or Linear (and
every torch.nn module but Sequential) as one call: such modules (dropout,
stochastic depth, attention) may branch on ``self.training`` or on their
input, which a trace would freeze.  A forward that still branches on the
mode is caught by tracing in both modes; it, and a forward that cannot be
traced at all, is fused child by child instead.
"""

import copy
import operator

import torch
from torch import nn

from . import torch as gt  # gpuaccel.torch imports this module at its end, once its layers are defined

F = nn.functional

__all__ = ["FuseReport", "FusedConv2dBN", "fuse"]


# ------------------------------------------------------------ activations
# torch's spellings of an activation -> its kind.  A kind is fused when
# gpuaccel's build has it (_activation_names); the others are named in the
# report.

_MODULE_KINDS = {nn.ReLU: "relu", nn.SiLU: "silu", nn.Hardswish: "hardswish", nn.Sigmoid: "sigmoid",
                 nn.Hardsigmoid: "hardsigmoid", nn.ReLU6: "relu6", nn.Tanh: "tanh", nn.LeakyReLU: "leaky_relu",
                 nn.ELU: "elu", nn.Mish: "mish", nn.Softplus: "softplus", nn.SELU: "selu", nn.CELU: "celu",
                 nn.PReLU: "prelu"}
_FUNCTION_KINDS = {F.relu: "relu", torch.relu: "relu", torch.relu_: "relu", F.relu_: "relu", F.silu: "silu",
                   F.hardswish: "hardswish", torch.sigmoid: "sigmoid", F.sigmoid: "sigmoid",
                   torch.special.expit: "sigmoid", F.hardsigmoid: "hardsigmoid", F.relu6: "relu6",
                   torch.tanh: "tanh", F.tanh: "tanh", F.leaky_relu: "leaky_relu", F.elu: "elu", F.mish: "mish",
                   F.softplus: "softplus", F.selu: "selu", F.celu: "celu"}
_METHOD_KINDS = {"relu": "relu", "relu_": "relu", "sigmoid": "sigmoid", "sigmoid_": "sigmoid", "tanh": "tanh",
                 "tanh_": "tanh"}


def _gelu_kind(approximate):
    return "gelu_tanh" if approximate == "tanh" else "gelu"


def _activation_names():
    """kind -> the activation's name in gpuaccel's fused layers (the same
    word: the layers name their activations as torch's kinds above), for
    the kinds this build fuses."""
    return {name: name for name in gt._ACTIVATIONS.values() if name != "none"}


# the name a fused layer's constructor takes for an activation, where it is
# not the layer's own: "gelu" (the exact erf form) warns once that it meant
# the tanh form in earlier versions, "gelu_erf" is the same activation
# without the warning (fuse chose it from nn.GELU(), not from an old script)
_CONSTRUCTOR_NAMES = {"gelu": "gelu_erf"}


def _first_input(node):
    return node.args[0] if node.args else node.kwargs.get("input", node.kwargs.get("self"))


def _activation_kind(node, modules):
    """The kind of activation node computes of its first input, or None
    when it is not an activation."""
    if node.op == "call_module":
        module = modules[node.target]
        if type(module) is nn.GELU:
            return _gelu_kind(module.approximate)
        return _MODULE_KINDS.get(type(module))
    if node.op == "call_function":
        if node.target is F.gelu:
            approximate = node.args[1] if len(node.args) > 1 else node.kwargs.get("approximate", "none")
            return _gelu_kind(approximate)
        try:
            return _FUNCTION_KINDS.get(node.target)
        except TypeError:  # an unhashable target
            return None
    if node.op == "call_method":
        return _METHOD_KINDS.get(node.target)
    return None


# ------------------------------------------------------------------ report

class FuseReport:
    """What fuse() did: ``fused`` (one entry per fused chain: its module
    names, what each is, what replaced them), ``unfused`` (every Conv2d and
    Linear left as it was, by name, with the reason), ``notes`` (how the
    model was traced, adds left as torch ops, parameter names).  ``str()``
    prints it."""

    def __init__(self, model_name):
        self.model_name = model_name
        self.traced = []  # names of the modules replaced by a traced graph ('' for the whole model)
        self.fallbacks = []  # (name, why it was fused child by child)
        self.fused = []  # dicts: names, kinds, into, activation, batchnorm
        self.unfused = {}  # name -> reason
        self.notes = []
        self.state_dict_compatible = True

    def _fused_lines(self):
        rows = []
        for entry in self.fused:
            what = "%s(%s)" % (entry["into"], entry["activation"])
            if entry["batchnorm"] is not None:
                what += ", BatchNorm " + ("runs unfused until eval()" if entry["batchnorm_training"] else "folded")
            if entry["note"]:
                what += "; " + entry["note"]
            rows.append((" -> ".join(entry["names"]), " -> ".join(entry["kinds"]), what))
        widths = [max((len(r[k]) for r in rows), default=0) for k in range(2)]
        return ["  %-*s  %-*s  => %s" % (widths[0], a, widths[1], b, c) for a, b, c in rows]

    def __str__(self):
        lines = ["gpuaccel.torch.fuse report for %s" % self.model_name]
        how = ", ".join(name or "the whole model" for name in self.traced) or "nothing"
        lines.append("traced with torch.fx: %s" % how)
        for name, why in self.fallbacks:
            lines.append("fused child by child: %s (%s)" % (name or "the whole model", why))
        lines.append("")
        lines.append("fused (%d):" % len(self.fused))
        lines += self._fused_lines()
        lines.append("")
        lines.append("Conv2d / Linear left unfused (%d):" % len(self.unfused))
        width = max((len(n) for n in self.unfused), default=0)
        lines += ["  %-*s  %s" % (width, name, why) for name, why in self.unfused.items()]
        if self.notes:
            lines.append("")
            lines.append("notes:")
            lines += ["  - " + note for note in self.notes]
        return "\n".join(lines)

    __repr__ = __str__


# ---------------------------------------------------- the Conv2d->BN module

def _fold(weight, bias, bn):
    """(w', b') = (w·γ/σ, (b − μ)·γ/σ + β), σ = sqrt(running_var + eps),
    computed in float64 and returned in the weight's dtype; differentiable
    in weight, bias, γ and β."""
    dtype = weight.dtype
    scale = torch.rsqrt(bn.running_var.double() + bn.eps)
    if bn.weight is not None:
        scale = scale * bn.weight.double()
    folded_bias = -bn.running_mean.double() if bias is None else bias.double() - bn.running_mean.double()
    folded_bias = folded_bias * scale
    if bn.bias is not None:
        folded_bias = folded_bias + bn.bias.double()
    return (weight.double() * scale.reshape(-1, 1, 1, 1)).to(dtype), folded_bias.to(dtype)


def _fold_inputs(conv, bn):
    """What the fold reads, and num_batches_tracked: a training forward
    updates the running statistics inside torch's kernel, which does not
    count it in their version, but BatchNorm's forward counts the batch."""
    return (conv.weight, conv.bias, bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.num_batches_tracked)


class FusedConv2dBN(gt.FusedConv2d):
    """Conv2d -> BatchNorm2d (-> activation), as fuse() writes it.

    While the BatchNorm is in eval mode (with running statistics): one
    fused conv whose weight and bias have the BatchNorm folded in, w' =
    w·γ/σ and b' = (b − μ)·γ/σ + β, computed in float64 and kept until a
    parameter or statistic changes (or computed in each call, with
    autograd, when a gradient of them is asked for).  While it is in
    training mode: the conv, the BatchNorm module itself (batch
    statistics, running statistics updated) and the activation, as the
    model ran them.

    The weight and bias are the conv's own Parameters (state_dict keys
    as nn.Conv2d); the BatchNorm stays in the model where it was, which
    owns its parameters and statistics, and this module refers to it:
    a state_dict of the original model loads into the fused one, and
    ``model.train()`` / ``model.eval()`` switch the BatchNorm as before.
    """

    def __init__(self, conv, batchnorm, activation=None):
        super().__init__(conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride,
                         padding=conv.padding, dilation=conv.dilation, groups=conv.groups,
                         bias=conv.bias is not None, padding_mode=conv.padding_mode, device="meta",
                         dtype=conv.weight.dtype, activation=activation)
        _share_parameters(self, conv)
        # a tuple, not an attribute: the BatchNorm must stay registered
        # where it is (its state_dict keys), not become a child here
        self._batchnorm = (batchnorm,)
        self._fold_cache = None

    @property
    def batchnorm(self):
        return self._batchnorm[0]

    def _folded(self, bn):
        inputs = _fold_inputs(self, bn)
        if gt._transforms_active() or (gt._grad_enabled() and any(
                t is not None and t.requires_grad for t in inputs[:4])):
            return _fold(self.weight, self.bias, bn)  # under torch.func, or differentiable
        # a parameter or statistic replaced, moved, or changed in place
        # (an optimizer step, load_state_dict, a training forward) changes
        # its identity, pointer or version: fold again
        key = tuple(None if t is None else (id(t), t.data_ptr(), t._version, t.dtype, t.device)
                    for t in inputs) + (bn.eps,)
        cache = self._fold_cache
        if cache is None or cache[0] != key:
            with torch.inference_mode(False), torch.no_grad():
                cache = self._fold_cache = (key, _fold(self.weight, self.bias, bn), inputs)
        return cache[1]

    def forward(self, x):
        bn = self._batchnorm[0]
        stride, padding, dilation = self._geometry
        if bn.training or bn.running_mean is None:  # batch statistics: as the model ran it
            self._fold_cache = None
            y = gt._conv2d_checked(x, self.weight, self.bias, stride, padding, dilation, self.groups, "none")
            return gt._torch_activation(bn(y), self.activation)
        if gt._is_compiling():
            return self._compiled(x, bn, stride, padding, dilation)
        weight, bias = self._folded(bn)
        return gt._conv2d_checked(x, weight, bias, stride, padding, dilation, self.groups, self.activation)

    def _compiled(self, x, bn, stride, padding, dilation):
        """The eval-mode layer in a compiled (or exported) graph, which
        cannot keep the fold between calls (its key is tensor versions and
        pointers): the graph either folds in every call, a pass over the
        weight, or applies the BatchNorm to the conv's output as the
        compiled original does, a pass over the output that the compiler
        fuses with the activation.  Whichever pass is smaller, chosen when
        the graph is traced (the shapes are in the graph's guards)."""
        n, k, height, width = gt._conv_out_shape(x if x.dim() == 4 else x.unsqueeze(0), self.weight, stride,
                                                 padding, dilation)
        if n * k * height * width > self.weight.numel():
            weight, bias = _fold(self.weight, self.bias, bn)
            return gt._conv2d_checked(x, weight, bias, stride, padding, dilation, self.groups, self.activation)
        y = gt._conv2d_checked(x, self.weight, self.bias, stride, padding, dilation, self.groups, "none")
        y = torch.nn.functional.batch_norm(y, bn.running_mean, bn.running_var, bn.weight, bn.bias, False, 0.0,
                                           bn.eps)
        return gt._torch_activation(y, self.activation)

    def __getstate__(self):
        # copies and pickles leave the fold behind (its key holds ids)
        state = self.__dict__.copy()
        state["_fold_cache"] = None
        return state

    def extra_repr(self):
        return super().extra_repr() + ", batchnorm=%s" % type(self._batchnorm[0]).__name__


def _share_parameters(fused, layer):
    """fused takes layer's Parameter objects (an optimizer built on the
    original parameters trains the fused model) and its mode."""
    fused.weight = layer.weight
    fused.bias = layer.bias
    fused.train(layer.training)


# ------------------------------------------------------------------ tracing

def _holds_layers(module):
    return any(isinstance(m, (nn.Conv2d, nn.Linear)) for m in module.modules())


class _Tracer(torch.fx.Tracer):
    """torch.fx's tracer with every module that holds no Conv2d or Linear
    kept as one call (see the module's docstring)."""

    def __init__(self):
        super().__init__()
        self._holds = {}

    def is_leaf_module(self, m, module_qualified_name):
        if isinstance(m, (gt.FusedLinear, gt.FusedConv2d)):
            return True
        if super().is_leaf_module(m, module_qualified_name):
            return True
        key = id(m)
        if key not in self._holds:
            self._holds[key] = _holds_layers(m)
        return not self._holds[key]


def _set_modes(model, modes):
    for module, mode in modes.items():
        module.training = mode


def _trace(model):
    """A GraphModule of model's forward, the same in both modes; raises
    torch.fx's error when it cannot be traced, ValueError when its forward
    (outside the modules kept as calls) depends on the mode."""
    modes = {m: m.training for m in model.modules()}
    graphs = []
    try:
        for mode in (True, False):
            _set_modes(model, dict.fromkeys(modes, mode))
            tracer = _Tracer()
            graph = tracer.trace(model)
            graphs.append((tracer, graph))
    finally:
        _set_modes(model, modes)
    codes = [graph.python_code("self").src for _, graph in graphs]
    if codes[0] != codes[1]:
        raise ValueError("its forward depends on the training mode outside the modules it calls")
    tracer, graph = graphs[1]
    return torch.fx.GraphModule(tracer.root, graph, type(model).__name__)


# ----------------------------------------------------------------- matching

def _hooked(module):
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks or
                getattr(module, "_backward_pre_hooks", None))


def _layer_problem(module):
    """Why a Conv2d/Linear cannot become a fused layer, or None."""
    if isinstance(module, (gt.FusedLinear, gt.FusedConv2d)):
        return "already a gpuaccel fused layer"
    if torch.nn.utils.parametrize.is_parametrized(module):
        return "its weight is parametrized (torch.nn.utils.parametrize)"
    if isinstance(module, nn.Linear):
        if type(module).forward is not nn.Linear.forward:
            return "%s has its own forward" % type(module).__name__
    elif type(module).forward is not nn.Conv2d.forward or type(module)._conv_forward is not nn.Conv2d._conv_forward:
        return "%s has its own forward" % type(module).__name__
    elif module.padding_mode != "zeros":
        return "padding_mode=%r (the fused conv pads with zeros)" % (module.padding_mode,)
    if _hooked(module):
        return "it has hooks, which a fused layer would not call"
    if isinstance(module.weight, nn.parameter.UninitializedParameter):
        return "a lazy module not yet initialised"
    return None


def _batchnorm_problem(bn, conv):
    if not isinstance(bn, (nn.BatchNorm2d, nn.SyncBatchNorm)) or type(bn).forward not in (
            nn.BatchNorm2d.forward, nn.SyncBatchNorm.forward):
        return "%s has its own forward" % type(bn).__name__
    if bn.num_features != conv.out_channels:
        return "its BatchNorm has %d features for %d channels" % (bn.num_features, conv.out_channels)
    if _hooked(bn):
        return "its BatchNorm has hooks"
    return None


def _describe(node, modules):
    if node.op == "call_module":
        return "%s (%s)" % (node.target, type(modules[node.target]).__name__)
    if node.op == "call_function":
        return getattr(node.target, "__name__", str(node.target))
    if node.op == "call_method":
        return "." + node.target + "()"
    if node.op == "output":
        return "the model's output"
    return node.op


def _only_user(node):
    return next(iter(node.users)) if len(node.users) == 1 else None


def _activation_arguments_ok(node, source):
    """An activation node applies to source alone (its other arguments are
    inplace flags or GELU's approximation)."""
    if _first_input(node) is not source:
        return False
    others = list(node.args[1:]) + [v for k, v in node.kwargs.items() if k not in ("input", "self")]
    return all(not isinstance(v, torch.fx.Node) for v in others)


def _label(node, modules):
    """What a node computes, in a word: a module's class, a function's name."""
    if node.op == "call_module":
        return type(modules[node.target]).__name__
    return _describe(node, modules)


class _Rewriter:
    """Finds the chains of one GraphModule and replaces each by one call of
    a fused module, installed under the layer's own name."""

    def __init__(self, gm, report, prefix):
        self.gm = gm
        self.report = report
        self.prefix = prefix
        self.modules = dict(gm.named_modules())
        self.names = _activation_names()
        self.calls = {}
        for node in gm.graph.nodes:
            if node.op == "call_module":
                self.calls[node.target] = self.calls.get(node.target, 0) + 1

    def run(self):
        """The names (in the graph) of the Conv2d/Linear it saw."""
        seen = set()
        for node in list(self.gm.graph.nodes):
            if node.op != "call_module" or not isinstance(self.modules[node.target], (nn.Conv2d, nn.Linear)):
                continue
            seen.add(node.target)
            why = self.fuse_at(node)
            if why is not None:
                self.report.unfused[self.prefix + node.target] = why
        self.gm.graph.lint()
        self.gm.recompile()
        return seen

    def fuse_at(self, node):
        """Fuses the chain that starts at a Conv2d/Linear node; the reason
        when there is none."""
        layer = self.modules[node.target]
        why = _layer_problem(layer) or self.call_problem(node, "")
        if why is not None:
            return why
        chain = self.chain(node)
        if isinstance(chain, str):
            return chain
        nodes, batchnorm, activation, act_note = chain
        if batchnorm is None and activation == "none":
            return "followed by " + act_note if act_note else self.follower(node)
        given = _CONSTRUCTOR_NAMES.get(activation, activation)
        try:
            if batchnorm is not None:
                fused = FusedConv2dBN(layer, batchnorm, activation=given)
            elif isinstance(layer, nn.Conv2d):
                fused = _fused_conv(layer, given)
            else:
                fused = _fused_linear(layer, given)
        except ValueError as error:  # a geometry the fused conv refuses (padding='same' with an even kernel)
            return str(error)
        entry = {"names": [self.prefix + n.target if n.op == "call_module" else n.name for n in nodes],
                 "kinds": [_label(n, self.modules) for n in nodes], "into": type(fused).__name__,
                 "activation": activation, "batchnorm": None, "batchnorm_training": None, "note": None}
        self.replace(nodes, fused)
        if batchnorm is not None:
            entry["batchnorm"] = self.prefix + nodes[1].target
            entry["batchnorm_training"] = batchnorm.training
        if act_note is not None:
            entry["note"] = "then, as a torch op, " + act_note
        self.report.fused.append(entry)
        return None

    def call_problem(self, node, what):
        if self.calls[node.target] > 1:
            return "%sthe same module is called %d times" % (what, self.calls[node.target])
        if not (len(node.args) == 1 and not node.kwargs):
            return "%scalled with other arguments than its input" % what
        return None

    def chain(self, node):
        """(nodes, batchnorm or None, activation name, why an activation
        after it is not fused or None), or the reason there is no chain."""
        layer = self.modules[node.target]
        nodes, batchnorm = [node], None
        after = _only_user(node)
        if after is None:
            return self.follower(node)
        if isinstance(layer, nn.Conv2d) and after.op == "call_module" and isinstance(
                self.modules[after.target], nn.modules.batchnorm._BatchNorm):
            bn = self.modules[after.target]
            why = _batchnorm_problem(bn, layer) or self.call_problem(after, "its BatchNorm: ")
            if why is not None:
                return why
            nodes.append(after)
            batchnorm = bn
            after = _only_user(after)
        if after is None:
            return nodes, batchnorm, "none", None
        kind = _activation_kind(after, self.modules)
        if kind is None or not _activation_arguments_ok(after, nodes[-1]):
            return nodes, batchnorm, "none", None
        if after.op == "call_module" and _hooked(self.modules[after.target]):
            return nodes, batchnorm, "none", "%s: it has hooks" % _describe(after, self.modules)
        if kind not in self.names:
            return nodes, batchnorm, "none", "%s: %s is not among this build's fused activations (%s)" % (
                _describe(after, self.modules), kind, ", ".join(sorted(self.names)))
        nodes.append(after)
        return nodes, batchnorm, self.names[kind], None

    def replace(self, nodes, fused):
        """The layer's node calls the fused module (under the layer's name);
        the rest of the chain leaves the graph."""
        target = nodes[0].target
        parent_name, _, attr = target.rpartition(".")
        setattr(self.gm.get_submodule(parent_name) if parent_name else self.gm, attr, fused)
        self.modules[target] = fused
        nodes[-1].replace_all_uses_with(nodes[0])
        for dead in reversed(nodes[1:]):
            self.gm.graph.erase_node(dead)

    def follower(self, node):
        users = list(node.users)
        if not users:
            return "its output is not used"
        if len(users) > 1:
            return "its output is used %d times (%s)" % (
                len(users), ", ".join(_describe(u, self.modules) for u in users[:3]))
        return "followed by %s: no activation or BatchNorm to fuse" % _describe(users[0], self.modules)


def _fused_conv(conv, activation):
    fused = gt.FusedConv2d(conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride,
                           padding=conv.padding, dilation=conv.dilation, groups=conv.groups,
                           bias=conv.bias is not None, device="meta", dtype=conv.weight.dtype, activation=activation)
    _share_parameters(fused, conv)
    return fused


def _fused_linear(linear, activation):
    fused = gt.FusedLinear(linear.in_features, linear.out_features, bias=linear.bias is not None,
                           activation=activation, device="meta", dtype=linear.weight.dtype)
    _share_parameters(fused, linear)
    return fused


# -------------------------------------------------------- the graph's notes

_ADDS = (operator.add, operator.iadd, torch.add)


def _residual_note(gm, report):
    """Adds of a fused layer's output that an activation follows: what a
    conv with a residual input would fuse.  Said in the report."""
    modules = dict(gm.named_modules())
    count = 0
    for node in gm.graph.nodes:
        if not (node.op == "call_function" and node.target in _ADDS) and not (
                node.op == "call_method" and node.target in ("add", "add_")):
            continue
        fed = any(isinstance(a, torch.fx.Node) and a.op == "call_module" and isinstance(
            modules.get(a.target), (gt.FusedConv2d, gt.FusedLinear)) for a in node.args)
        user = _only_user(node)
        if fed and user is not None and _activation_kind(user, modules) is not None:
            count += 1
    if count:
        report.notes.append(
            "%d residual add(s) of a fused layer's output followed by an activation stay torch ops (add, then the "
            "activation): gpuaccel's fused conv and linear take no residual operand, so the add cannot move into "
            "the layer's epilogue; the layer before each add is fused as far as it goes" % count)


# ------------------------------------------------------------ state_dict

def _restore_state(gm, model):
    """Parameters and buffers of model that its graph does not use
    (torch.fx copies only what the graph names) are put back under their
    names, so that model's state_dict loads into the result."""
    have = set(gm.state_dict(keep_vars=True))
    for key in model.state_dict(keep_vars=True):
        if key in have:
            continue
        owner_name, _, attr = key.rpartition(".")
        source, target = model, gm
        for part in owner_name.split(".") if owner_name else []:
            source = getattr(source, part)
            nxt = getattr(target, part, None)
            if nxt is None:
                target.add_module(part, source)  # the whole module, with its state
                break
            target = nxt
        else:
            value = getattr(source, attr)
            if isinstance(value, nn.Parameter):
                target.register_parameter(attr, value)
            else:
                target.register_buffer(attr, value)


def _drop_stateless_unused(gm):
    """Modules the rewritten graph no longer calls and that hold no state
    (the fused activations) leave the model."""
    used = {n.target for n in gm.graph.nodes if n.op in ("call_module", "get_attr")}
    for name, module in list(gm.named_modules()):
        if not name or name in used or any(u.startswith(name + ".") for u in used):
            continue
        if any(True for _ in module.parameters()) or any(True for _ in module.buffers()):
            continue
        parent_name, _, attr = name.rpartition(".")
        parent = gm.get_submodule(parent_name) if parent_name else gm
        if isinstance(parent, nn.Sequential):
            continue  # a Sequential's numbering is its keys'
        if getattr(parent, attr, None) is module:
            delattr(parent, attr)


# ------------------------------------------------------------------ driver

def _fuse_module(module, report, prefix, seen):
    """module, fused: a GraphModule when it traces (in both modes alike),
    else the module itself with each child fused the same way."""
    try:
        gm = _trace(module)
    except Exception as error:  # noqa: BLE001 - torch.fx raises many kinds (TraceError, TypeError, ...)
        why = "%s: %s" % (type(error).__name__, str(error).splitlines()[0] if str(error) else "")
        report.fallbacks.append((prefix.rstrip("."), why[:300]))
        for name, child in list(module.named_children()):
            if not _holds_layers(child) or isinstance(child, (gt.FusedLinear, gt.FusedConv2d)):
                continue
            if isinstance(child, (nn.Conv2d, nn.Linear)):
                report.unfused[prefix + name] = "its parent's forward could not be traced (%s)" % why[:120]
                seen.add(prefix + name)
                continue
            fused_child = _fuse_module(child, report, prefix + name + ".", seen)
            if fused_child is not child:
                setattr(module, name, fused_child)
        return module
    report.traced.append(prefix.rstrip("."))
    visited = _Rewriter(gm, report, prefix).run()
    seen.update(prefix + name for name in visited)
    _residual_note(gm, report)
    _drop_stateless_unused(gm)
    _restore_state(gm, module)
    return gm


def fuse(model, *, inplace=False, report=False):
    """``model`` with every fusable chain replaced by gpuaccel's fused layers
    (see gpuaccel/_fuse.py's docstring): Linear -> activation and Conv2d ->
    activation become FusedLinear / FusedConv2d, Conv2d -> BatchNorm2d (->
    activation) FusedConv2dBN, which folds the BatchNorm while it is in
    eval mode.  The result computes the same function as model in both
    modes, its parameters keep their names (a state_dict of model loads into
    it), and its Conv2d/Linear that could not be fused are named, with the
    reason, in the report.

    inplace=False works on a deep copy of model.  inplace=True shares
    model's parameters and buffers (an optimizer built on
    model.parameters() trains the result, BatchNorm statistics are shared)
    and, where a forward cannot be traced, replaces model's children in
    place.  A traced model comes back as a torch.fx.GraphModule.

    report=True returns (fused_model, FuseReport); print the report to read it.
    """
    if not isinstance(model, nn.Module):
        raise TypeError("fuse: model must be a torch.nn.Module, got %s" % type(model).__name__)
    if not isinstance(inplace, bool) or not isinstance(report, bool):
        raise TypeError("fuse: inplace and report must be bools, got inplace=%r, report=%r" % (inplace, report))
    source = model if inplace else copy.deepcopy(model)
    info = FuseReport(type(model).__name__)
    original_keys = set(source.state_dict())
    modules = dict(source.named_modules())
    layers = [name for name, m in modules.items() if isinstance(m, (nn.Conv2d, nn.Linear, gt.FusedLinear))]
    seen = set()
    fused = _fuse_module(source, info, "", seen)
    for name in layers:
        if name not in seen and name not in info.unfused:
            info.unfused[name] = _why_unseen(name, modules)
    keys = set(fused.state_dict())
    if keys != original_keys:
        info.state_dict_compatible = False
        info.notes.append("the state_dict keys differ from the model's: missing %s, extra %s" % (
            sorted(original_keys - keys)[:5], sorted(keys - original_keys)[:5]))
    else:
        info.notes.append("parameter and buffer names are the model's: its state_dict loads into the fused model")
    folded = sum(1 for e in info.fused if e["batchnorm"] is not None and not e["batchnorm_training"])
    training = sum(1 for e in info.fused if e["batchnorm"] is not None and e["batchnorm_training"])
    if folded or training:
        info.notes.append(
            "%d BatchNorm folded (in eval mode), %d in training mode (these run unfused, as before, until eval()); "
            "the BatchNorm modules stay in the model under their names, for the state_dict and for training mode, "
            "and an eval forward does not call them" % (folded, training))
    return (fused, info) if report else fused


def _why_unseen(name, modules):
    """Why no graph saw a Conv2d/Linear: it is a fused layer already, or
    inside a torch.nn module the trace calls as one (nn.MultiheadAttention,
    nn.TransformerEncoderLayer), or forward does not call it."""
    if isinstance(modules[name], (gt.FusedLinear, gt.FusedConv2d)):
        return "already a gpuaccel fused layer"
    if not name:
        return "the model is this one layer: nothing follows it"
    parts = name.split(".")
    for k in range(len(parts) - 1, 0, -1):
        holder = modules[".".join(parts[:k])]
        if holder.__module__.startswith(("torch.nn", "torch.ao.nn")) and not isinstance(holder, nn.Sequential):
            return "inside %s (%s), a torch.nn module that runs as one call" % (".".join(parts[:k]),
                                                                             type(holder).__name__)
    return "not called by the model's forward"
