"""A static cost estimate, so expensive expressions are compile errors as in the scheduler."""

from __future__ import annotations

from dra_driver.allocator.cel.functions import MAX_RANGE, NAMESPACES
from dra_driver.allocator.cel.syntax import Binary, Call, Comp, Cond, Ident, Index, List, Lit, Map, Node, Select, Unary

MAX_COST = 1_000_000


# --------------------------------------------------------------------------- cost


_UNKNOWN_SIZE = 1024  # assumed length of lists/strings whose size is not known statically
_ATTR_STRING = 64  # DeviceAttributeMaxValueLength
_MAP_SIZE = 32  # ResourceSliceMaxAttributesAndCapacitiesPerDevice


def _lit_size(node: Lit) -> int:
    return max(len(node.text) - 2, 0) if node.kind in ("string", "bytes") else 1


def _size(node: Node) -> int:
    """Upper bound on the element count (list/map) or length (string) of a value."""
    if isinstance(node, List):
        return len(node.items)
    if isinstance(node, Map):
        return len(node.entries)
    if isinstance(node, Lit):
        return _lit_size(node)
    if isinstance(node, Comp):
        return _size(node.target) if node.macro in ("map", "filter") else 1
    if isinstance(node, Binary) and node.op == "+":
        return _size(node.left) + _size(node.right)
    if isinstance(node, Cond):
        return max(_size(node.then), _size(node.other))
    if isinstance(node, (Select, Index)) and _rooted_at_device(node):
        return _MAP_SIZE if _device_depth(node) < 3 else _ATTR_STRING
    if isinstance(node, Call):
        return _call_size(node)
    return _UNKNOWN_SIZE


def _call_size(node: Call) -> int:
    if node.fn == "range" and isinstance(node.target, Ident) and node.args:
        arg = node.args[0]
        if isinstance(arg, Lit) and arg.kind == "int":
            return min(int(arg.text, 0), MAX_RANGE)
        return MAX_RANGE
    if node.fn in ("split", "sort", "distinct", "reverse", "slice", "lowerAscii", "upperAscii", "trim") and node.target:
        return _size(node.target) + 1
    return _UNKNOWN_SIZE


def _rooted_at_device(node: Node) -> bool:
    while isinstance(node, (Select, Index, Cond)):
        node = node.then if isinstance(node, Cond) else node.operand
    return isinstance(node, Ident) and node.name == "device"


def _device_depth(node: Node) -> int:
    depth = 0
    while isinstance(node, (Select, Index, Cond)):
        node = node.then if isinstance(node, Cond) else node.operand
        depth += 1
    return depth


_LINEAR_FUNCTIONS = frozenset(
    {"matches", "find", "findAll", "split", "replace", "sort", "contains", "distinct", "flatten", "join",
     "indexOf", "lastIndexOf", "isSorted", "sum", "min", "max", "equivalent", "intersects"}
)  # fmt: skip


def estimate_cost(node: Node) -> int:
    """Worst-case evaluation steps: every node counts 1, comprehensions multiply."""
    if isinstance(node, Comp):
        iterations = _size(node.target)
        return 1 + estimate_cost(node.target) + iterations * (1 + estimate_cost(node.body))
    children = _children(node)
    extra = 0
    if isinstance(node, Call) and node.fn in _LINEAR_FUNCTIONS:
        # Linear-time helpers over strings or lists (namespace targets like
        # ``sets`` are not values and have no size).
        extra = sum(_size(c) for c in children if not (isinstance(c, Ident) and c.name in NAMESPACES))
    elif isinstance(node, Call) and node.fn == "range":
        # lists.range(n) allocates n elements each time it runs: inside a comprehension that is
        # iterations x n, which the per-node count of 1 hid (a memory bomb passed the check).
        extra = _call_size(node)
    return 1 + extra + sum(estimate_cost(c) for c in children)


def _children(node: Node) -> list[Node]:
    if isinstance(node, (Select, Unary)):
        return [node.operand]
    if isinstance(node, Index):
        return [node.operand, node.index]
    if isinstance(node, Call):
        return ([node.target] if node.target is not None else []) + list(node.args)
    if isinstance(node, List):
        return list(node.items)
    if isinstance(node, Map):
        return [x for kv in node.entries for x in kv]
    if isinstance(node, Binary):
        return [node.left, node.right]
    if isinstance(node, Cond):
        return [node.cond, node.then, node.other]
    return []


_NON_BOOL_OPS = frozenset({"+", "-", "*", "/", "%"})


def obviously_not_bool(node: Node) -> str | None:
    """A result type the Kubernetes checker would reject at compile time."""
    if isinstance(node, Lit) and node.kind != "bool":
        return node.kind
    if isinstance(node, List):
        return "list"
    if isinstance(node, Map):
        return "map"
    if isinstance(node, Binary) and node.op in _NON_BOOL_OPS:
        return "a number or string"
    if isinstance(node, Unary) and node.op == "-":
        return "a number"
    if isinstance(node, Comp) and node.macro in ("map", "filter"):
        return "list"
    return None
