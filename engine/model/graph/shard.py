"""Merak's graph sharding (sec. 4.2, Alg. 1 and 2): one graph into a sequence of subgraphs.

Nodes are visited in graph order. Each node's farthest dependency (Alg. 1) decides
whether it may start a new subgraph or must stay with (and pull back into) an earlier
one; a subgraph closes once it holds more than its share ``p = total / k`` of the
parameters (Alg. 2), so consecutive subgraphs exchange only the last node's value and
the *common nodes* -- values used by at least as many nodes as the model has layers,
such as attention masks, rotary tables and position ids -- which are passed along
rather than cut through. One deliberate change from the paper: graph inputs
(``input_ids``, ``labels``) do not pull their users together, because every stage can
read its own batch; a later stage is fed them directly instead of through the pipe.

The result is a list of ``Shard`` (node names in order, the values entering and
leaving); inputs and outputs are computed from the final assignment by liveness.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from torch import fx

from jobctl.engine.model.graph.trace import module_path


@dataclass
class Shard:
    """One subgraph: its nodes, the carried values in and out, batch inputs, params."""

    nodes: list[str]
    carry_in: list[str] = field(default_factory=list)
    carry_out: list[str] = field(default_factory=list)
    batch_in: list[str] = field(default_factory=list)
    params: list[str] = field(default_factory=list)  # get_attr targets it reads
    name: str = ""


@dataclass
class _State:
    """Alg. 2's bookkeeping: subgraph id per node (M), visited nodes (N), users (C)."""

    M: dict[fx.Node, int] = field(default_factory=dict)  # noqa: N815 -- the paper's names
    N: list[fx.Node] = field(default_factory=list)  # noqa: N815
    C: dict[fx.Node, int] = field(default_factory=dict)  # noqa: N815
    outs: dict[int, set[fx.Node]] = field(default_factory=dict)


def common_nodes(gm: fx.GraphModule, layers: int) -> dict[fx.Node, int]:
    """Compute nodes used at least ``layers`` times (masks, rotary, position ids)."""
    threshold = max(2, layers)
    return {
        n: len(n.users)
        for n in gm.graph.nodes
        if n.op == "call_function" and len(n.users) >= threshold
    }


def search_dependency(n: fx.Node, s: int, st: _State) -> tuple[int, fx.Node | None]:
    """Alg. 1: the lowest subgraph ``n`` must join, and the node that forces it."""
    s_min, n_min = s, None
    for arg in n.all_input_nodes:
        if arg in st.C:  # a common node: passed along, never a reason to merge
            st.C[arg] -= 1
        elif arg.op in ("placeholder", "get_attr"):
            continue  # batch inputs are fed to each stage; parameters go where used
        elif any(arg in outs for outs in st.outs.values()):
            if st.M[arg] + 1 < s_min:
                s_min, n_min = st.M[arg] + 1, arg
        elif arg in st.M and (not st.N or arg is not st.N[-1]) and st.M[arg] < s_min:
            s_min, n_min = st.M[arg], arg
    return s_min, n_min


def param_counts(gm: fx.GraphModule) -> dict[fx.Node, int]:
    """D: parameter elements per node, each parameter counted at its first user."""
    numel = {name: p.numel() for name, p in gm.named_parameters(remove_duplicate=False)}
    seen: set[str] = set()
    out: dict[fx.Node, int] = {}
    for n in gm.graph.nodes:
        total = 0
        for arg in n.all_input_nodes:
            if arg.op == "get_attr" and arg.target not in seen:
                seen.add(arg.target)
                total += numel.get(arg.target, 0)  # a buffer counts nothing
        out[n] = total
    return out


def assign(gm: fx.GraphModule, k: int, layers: int) -> dict[fx.Node, int]:
    """Alg. 2: a subgraph id for every compute node (ids are non-decreasing)."""
    D = param_counts(gm)  # noqa: N806 -- the paper's name
    p = sum(D.values()) / max(1, k)
    st = _State(C=common_nodes(gm, layers))
    s = 0
    load: dict[int, int] = defaultdict(int)  # parameters per subgraph, kept as nodes move
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "get_attr", "output"):
            continue
        s_min, n_min = search_dependency(n, s, st)
        if s_min < s:  # nodes since n_min rejoin its subgraph
            s = s_min
            for prev in reversed(st.N):
                load[st.M[prev]] -= D[prev]
                load[s_min] += D[prev]
                st.M[prev] = s_min
                if prev is n_min:
                    break
            st.outs = {i: o for i, o in st.outs.items() if i < s_min}
        st.M[n] = s
        st.N.append(n)
        load[s] += D[n]
        if load[s] > p:
            st.outs[s] = {n}
            s += 1
    return st.M


def shards(gm: fx.GraphModule, k: int, layers: int) -> list[Shard]:
    """The subgraph sequence, with carried values computed by liveness."""
    ids = assign(gm, k, layers)
    count = max(ids.values()) + 1
    out = [Shard([]) for _ in range(count)]
    for n, i in ids.items():
        out[i].nodes.append(n.name)
        for arg in n.all_input_nodes:
            _wire(out, ids, arg, i)
    final = next(n for n in gm.graph.nodes if n.op == "output")
    for arg in final.all_input_nodes:
        _wire(out, ids, arg, count - 1)
    out = [s for s in out if s.nodes]
    _name(gm, ids, out)
    return out


def _wire(out: list[Shard], ids: dict[fx.Node, int], arg: fx.Node, i: int) -> None:
    """Record that subgraph ``i`` reads ``arg``."""
    if arg.op == "placeholder":
        if arg.name not in out[i].batch_in:
            out[i].batch_in.append(arg.name)
    elif arg.op == "get_attr":
        if arg.target not in out[i].params:
            out[i].params.append(arg.target)
    elif ids[arg] < i:  # carried through every subgraph in between
        for j in range(ids[arg], i):
            if arg.name not in out[j].carry_out:
                out[j].carry_out.append(arg.name)
                out[j + 1].carry_in.append(arg.name)


def _name(gm: fx.GraphModule, ids: dict[fx.Node, int], out: list[Shard]) -> None:
    """Name each subgraph by the model's modules it holds parameters of
    (``transformer.h.3``, or ``transformer.wte..transformer.h.0`` for a span)."""
    by_name = {n.name: n for n in gm.graph.nodes}
    for shard in out:
        nodes = [by_name[x] for x in shard.nodes]
        paths = [module_path(n) for n in nodes if _reads_param(n)] or [
            module_path(n) for n in nodes
        ]
        units = [_unit(p) for p in paths if p]
        if not units:
            shard.name = "graph"
        elif units[0] == units[-1]:
            shard.name = units[0]
        else:
            shard.name = f"{units[0]}..{units[-1]}"
    seen: dict[str, int] = {}
    for shard in out:
        seen[shard.name] = seen.get(shard.name, 0) + 1
        if seen[shard.name] > 1:
            shard.name = f"{shard.name}#{seen[shard.name]}"


def _reads_param(node: fx.Node) -> bool:
    return any(a.op == "get_attr" for a in node.all_input_nodes)


def _unit(path: str) -> str:
    """A module path cut after its layer index (``model.layers.7``), else two parts."""
    parts = path.split(".")
    for k, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: k + 1])
    return ".".join(parts[:2])
