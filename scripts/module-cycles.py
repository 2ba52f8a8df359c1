#!/usr/bin/env python3
"""Finds import cycles between lockd's source files.

Each file under src/ is a module (src/lock/change.rs is `lock::change`,
src/http/mod.rs is `http`). A file depends on every module it names by a
`crate::`, `super::` or `self::` path (in `use` items or in code), resolved
to the longest module path that exists. A parent module's paths to its own
submodules (re-exports, `mod` items) are structure, not dependencies, and
unit tests (`#[cfg(test)] mod ...`) are left out.

Prints each cycle (a strongly connected component of more than one file)
and exits 1 if there is one; `--dot` prints the graph in Graphviz form.

It also checks which way the lock core's arrows point (see the module doc
of src/lock/mod.rs), and exits 1 on an arrow against them:
- `lock` depends on no module of lockd outside it but `backoff` (no HTTP,
  no metrics, no settings in the core);
- inside `lock`, the rules at its top (every module that is not a folder)
  use no backend and not the service;
- a backend (`lock::redis`, `lock::redlock`, `lock::memory`) uses neither
  the service nor another backend;
- the service (`lock::service`) uses no backend.
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(next((a for a in sys.argv[1:] if not a.startswith("--")), pathlib.Path(__file__).resolve().parent.parent / "src")).resolve()
PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+|::\{)")
COMMENT = re.compile(r"//[^\n]*")
# Unit tests (`#[cfg(test)] mod tests`, the end of a file) may use anything.
TESTS = re.compile(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{.*", re.S)


def module_of(path: pathlib.Path) -> tuple:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("mod", "lib"):
        parts.pop()
    if parts and parts[0] == "bin":
        return ()
    return tuple(parts)


def use_groups(text: str):
    """Yields (prefix, names) for `use crate::a::{b, c::d}` items."""
    for m in re.finditer(r"\buse\s+((?:crate|super|self)(?:::\w+)*)::\{([^;]*)\};", text, re.S):
        prefix = m.group(1)
        depth = 0
        cur = ""
        for ch in m.group(2):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                yield prefix, cur.strip()
                cur = ""
            else:
                cur += ch
        if cur.strip():
            yield prefix, cur.strip()


def resolve(start: tuple, path: str, modules: set) -> tuple:
    parts = path.split("::")
    here = list(start)
    head = parts.pop(0)
    if head == "crate":
        here = []
    elif head == "super":
        here = here[:-1]
        while parts and parts[0] == "super":
            parts.pop(0)
            here = here[:-1]
    best = tuple(here)
    for p in parts:
        p = p.split("{")[0].strip()
        if not p:
            break
        cand = tuple(here + [p])
        if cand in modules:
            here.append(p)
            best = cand
        else:
            break
    return best


def main() -> int:
    files = [p for p in ROOT.rglob("*.rs") if module_of(p) or p.name in ("lib.rs", "main.rs")]
    modules = {module_of(p) for p in files}
    graph = {}
    for p in files:
        if p.name == "main.rs" and p.parent == ROOT:
            continue
        me = module_of(p)
        text = TESTS.sub("", COMMENT.sub("", p.read_text()))
        deps = set()
        for m in PATH.finditer(text):
            deps.add(resolve(me, m.group(1) + m.group(2).rstrip(":{"), modules))
        for prefix, name in use_groups(text):
            deps.add(resolve(me, prefix + "::" + name.replace(" ", ""), modules))
        # A parent module naming its children is structure, not a cycle.
        deps = {d for d in deps if d != me and d[: len(me)] != me and d != ()}
        graph[me] = deps
    if "--dot" in sys.argv:
        print("digraph lockd {")
        for a, ds in sorted(graph.items()):
            for d in sorted(ds):
                print(f'  "{"::".join(a)}" -> "{"::".join(d)}";')
        print("}")
        return 0
    wrong = layering(graph)
    for line in wrong:
        print("against the layers:", line)
    # Tarjan's strongly connected components.
    index, low, stack, on, sccs = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(comp)

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    for comp in sccs:
        names = sorted("::".join(c) for c in comp)
        print("cycle:", ", ".join(names))
        for a in sorted(comp):
            for d in sorted(graph[a]):
                if d in comp:
                    print(f"  {'::'.join(a)} -> {'::'.join(d)}")
    print(f"{len(graph)} modules, {sum(len(d) for d in graph.values())} edges, {len(sccs)} cycles")
    return 1 if sccs or wrong else 0


BACKENDS = {"redis", "redlock", "memory"}
ROOMS = BACKENDS | {"service"}


def layering(graph: dict) -> list:
    """The arrows of `graph` that point against the lock core's layers."""
    wrong = []
    for a, ds in sorted(graph.items()):
        if not a or a[0] != "lock":
            continue
        room = a[1] if len(a) > 1 and a[1] in ROOMS else None
        for d in sorted(ds):
            arrow = f"{'::'.join(a)} -> {'::'.join(d)}"
            if d[0] not in ("lock", "backoff"):
                wrong.append(f"{arrow} (the lock core uses nothing of lockd but backoff)")
                continue
            if d[0] != "lock":
                continue
            target = d[1] if len(d) > 1 and d[1] in ROOMS else None
            if target is None or target == room:
                continue
            if room is None:
                wrong.append(f"{arrow} (a rule uses a backend or the service)")
            elif room in BACKENDS:
                wrong.append(f"{arrow} (a backend uses the service or another backend)")
            elif target in BACKENDS:
                wrong.append(f"{arrow} (the service uses a backend)")
    return wrong


if __name__ == "__main__":
    sys.exit(main())
