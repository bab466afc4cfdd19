#!/usr/bin/env python3
"""Extract SGLang's `launch_server` command-line surface into a test fixture.

How the fixture `crates/sparrow/tests/fixtures/sglang_server_args.json` was made:

    python3 -m pip download --no-deps sglang==0.5.23      # or use the cached wheel
    scripts/goldens/sglang_server_args.py sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl

The argument is the wheel, or an extracted `.../sglang/srt/server_args.py` (its sibling
modules are then read from the same tree). Nothing is imported: SGLang's modules need torch
and a GPU stack, so the parser is rebuilt from the source with Python's `ast`.

In 0.5.23 `ServerArgs.add_cli_args(parser)` registers two kinds of flags:
1. one per annotated field (`name: A[T, "help"]` or `A[T, Arg(...)]`) of the namespace
   classes listed in `_INPUT_NAMESPACES` (`sglang/srt/arg_groups/fields/*.py`), through
   `add_cli_args_from_dataclass` (`arg_groups/arg_utils.py`), whose rules are replayed here:
   `--field-name` unless `cli_name`, plus `aliases`; `no_cli` skips the field; a custom
   `action` is used as given; `Literal[...]` gives choices; `List[X]` takes `nargs="+"`
   (unless a `type_parser`); `bool` is `store_true`; anything else takes one value;
2. the `parser.add_argument(...)` calls written in `add_cli_args` itself (dynamic choices,
   deprecated spellings, `--config`).

`argparse.BooleanOptionalAction` also registers `--no-<flag>` for each `--<flag>` name; those
are listed among the flag's `aliases`.

Each flag: `flag` (the first name), `aliases`, `dest`, `takes` (`none`: a switch, `one`,
`optional` (nargs `?`), `any` (`*`), `many` (`+`)), `action`, `type` (argparse's `type=`:
`str`/`int`/`float` or the parser function's name), `choices` (the in-tree list: plugins may
extend these lists at start-up through `add_*_choices`), `default` (when a literal;
`default_expr` otherwise), and `source` (file:line). What the script could not resolve is
listed under `unresolved` and printed.

Checked against the real thing once (0.5.23): the parser built by importing
`sglang.srt.server_args` with every third-party module stubbed has the same 559 option
strings, and the same nargs, choices, types and defaults, as this fixture.

usage: scripts/goldens/sglang_server_args.py SGLANG_WHEEL_OR_SERVER_ARGS_PY [OUT_JSON]
"""
import ast
import enum
import json
import os
import sys
import zipfile

SRC = sys.argv[1]
OUT = sys.argv[2] if len(sys.argv) > 2 else "crates/sparrow/tests/fixtures/sglang_server_args.json"
SERVER_ARGS = "sglang/srt/server_args.py"

if SRC.endswith(".whl"):
    _zip = zipfile.ZipFile(SRC)
    VERSION = next(
        (n.split("-")[1].removesuffix(".dist") for n in _zip.namelist() if n.endswith(".dist-info/METADATA")),
        "unknown",
    )

    def read(rel):
        try:
            return _zip.read(rel).decode()
        except KeyError:
            return None
else:
    _root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(SRC))))
    VERSION = "unknown"

    def read(rel):
        p = os.path.join(_root, rel)
        return open(p).read() if os.path.exists(p) else None


unresolved = []


class Unresolved(Exception):
    pass


class Module:
    """One parsed source file: its top-level definitions and `from X import Y` names."""

    cache = {}

    def __init__(self, rel):
        self.rel = rel
        src = read(rel)
        if src is None:
            raise Unresolved(f"{rel} is not in the source")
        self.tree = ast.parse(src)
        self.defs = {}  # name -> node (Assign value, ClassDef, FunctionDef)
        self.imports = {}  # name -> (module rel path, original name)
        for node in self.tree.body:
            self._scan(node)

    def _scan(self, node):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    self.defs[t.id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            self.defs[node.target.id] = node.value
        elif isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            self.defs[node.name] = node
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                self.imports[a.asname or a.name] = (module_path(node.module), a.name)

    @classmethod
    def get(cls, rel):
        if rel not in cls.cache:
            cls.cache[rel] = Module(rel)
        return cls.cache[rel]


def module_path(dotted):
    rel = dotted.replace(".", "/")
    return rel + ".py" if read(rel + ".py") is not None else rel + "/__init__.py"


class EnumMember:
    def __init__(self, name, value):
        self.name, self.value = name, value


class Scope:
    """Names visible to an expression: locals, then a class body, then a module."""

    def __init__(self, module, local=None, cls=None):
        self.module, self.local, self.cls = module, dict(local or {}), cls

    def lookup(self, name):
        if name in self.local:
            return self.local[name]
        if self.cls is not None:
            for node in self.cls.body:
                if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
                    return ev(node.value, Scope(self.module, cls=self.cls))
        return resolve_name(self.module, name)


def resolve_name(module, name):
    if name in module.defs:
        d = module.defs[name]
        if isinstance(d, (ast.ClassDef, ast.FunctionDef)):
            return (module, d)
        return ev(d, Scope(module))
    if name in module.imports:
        rel, orig = module.imports[name]
        return resolve_name(Module.get(rel), orig)
    if name in ("str", "int", "float", "bool", "list", "set", "frozenset", "sorted", "tuple"):
        return {"str": str, "int": int, "float": float, "bool": bool, "list": list, "set": set,
                "frozenset": frozenset, "sorted": sorted, "tuple": tuple}[name]
    raise Unresolved(f"name {name} in {module.rel}")


def enum_members(module, cls):
    """Members of an `Enum`/`IntEnum` class, in order."""
    bases = {ast.unparse(b) for b in cls.bases}
    if not bases & {"Enum", "IntEnum", "StrEnum", "enum.Enum", "enum.IntEnum", "str, Enum"}:
        raise Unresolved(f"class {cls.name} is not an enum")
    out = []
    for node in cls.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            out.append(EnumMember(node.targets[0].id, ev(node.value, Scope(module, cls=cls))))
    return out


def call_function(module, fn):
    """A zero-argument helper's value: its last `return`, with its own imports in scope (the
    helpers in server_args read a registry when loaded and a static name list otherwise; the
    static list is the in-tree truth)."""
    local = {}
    for node in fn.body:
        if isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                local[a.asname or a.name] = resolve_name(Module.get(module_path(node.module)), a.name)
    ret = [n for n in fn.body if isinstance(n, ast.Return)]
    if not ret:
        raise Unresolved(f"function {fn.name} has no top-level return")
    return ev(ret[-1].value, Scope(module, local))


def ev(node, scope):
    """Evaluates the small subset of Python that SGLang's flag definitions use."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [ev(e, scope) for e in node.elts]
    if isinstance(node, ast.Set):
        return set(ev(e, scope) for e in node.elts)
    if isinstance(node, ast.Name):
        return scope.lookup(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -ev(node.operand, scope)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return ev(node.left, scope) * ev(node.right, scope)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = ev(node.left, scope), ev(node.right, scope)
        return list(a) + list(b) if isinstance(a, (list, tuple)) else a + b
    if isinstance(node, ast.Attribute):
        base = ev(node.value, scope)
        if isinstance(base, tuple) and isinstance(base[1], ast.ClassDef):
            m, cls = base
            return Scope(m, cls=cls).lookup(node.attr)
        if isinstance(base, EnumMember):
            return getattr(base, node.attr)
        if isinstance(base, str) and node.attr in ("lower", "upper"):
            return getattr(base, node.attr)
        raise Unresolved(f"attribute {ast.unparse(node)}")
    if isinstance(node, ast.Call):
        f = ev(node.func, scope)
        args = [ev(a, scope) for a in node.args]
        if callable(f) and not node.keywords:
            if f in (list, set, frozenset, sorted, tuple):
                a = args[0]
                if isinstance(a, tuple) and isinstance(a[1], ast.ClassDef):
                    a = enum_members(*a)
                return f(a)
            return f(*args)
        if isinstance(f, tuple) and isinstance(f[1], ast.FunctionDef) and not args:
            return call_function(*f)
        raise Unresolved(f"call {ast.unparse(node)}")
    if isinstance(node, ast.ListComp) and len(node.generators) == 1:
        g = node.generators[0]
        it = ev(g.iter, scope)
        if isinstance(it, tuple) and isinstance(it[1], ast.ClassDef):
            it = enum_members(*it)
        out = []
        for x in it:
            inner = Scope(scope.module, {**scope.local, g.target.id: x}, scope.cls)
            if all(ev(c, inner) for c in g.ifs):
                out.append(ev(node.elt, inner))
        return out
    raise Unresolved(f"expression {ast.unparse(node)}")


def plain(v):
    """A JSON-able copy (sets sorted: argparse shows them in hash order)."""
    if isinstance(v, (set, frozenset)):
        return sorted(plain(x) for x in v)
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, enum.Enum):
        return v.name
    return v


def literal(node, scope):
    """(value, None) when the default is a literal or a resolvable name, else (None, source)."""
    try:
        return plain(ev(node, scope)), None
    except Unresolved:
        return None, ast.unparse(node)


def takes_of(action, nargs):
    if nargs in ("?",):
        return "optional"
    if nargs == "*":
        return "any"
    if nargs == "+":
        return "many"
    if nargs == 0 or action in ("store_true", "store_false", "store_const", "count", "argparse.BooleanOptionalAction"):
        return "none"
    return "one"


def action_init_default(server_args, action_node, param):
    """The default a custom `argparse.Action` subclass's `__init__` declares for `param`
    (`nargs`, `default`), or None."""
    if not isinstance(action_node, ast.Name):
        return None
    try:
        m, cls = resolve_name(server_args, action_node.id)
    except (Unresolved, TypeError, ValueError):
        return None
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":
            names = [a.arg for a in node.args.args]
            defaults = node.args.defaults
            pos = dict(zip(names[len(names) - len(defaults):], defaults))
            if param in pos:
                return ast.literal_eval(pos[param])
    return None


def names_with_negations(names, action):
    if action != "argparse.BooleanOptionalAction":
        return names
    return names + ["--no-" + n[2:] for n in names if n.startswith("--")]


def meta_of(ann):
    """(inner type node, Arg keywords dict or None, is_cli_field) of `A[T, meta...]`."""
    if not (isinstance(ann, ast.Subscript) and ast.unparse(ann.value) in ("A", "Annotated")):
        return None, None
    elts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
    inner = elts[0]
    for m in elts[1:]:
        if isinstance(m, ast.Constant) and isinstance(m.value, str):
            return inner, {}
        if isinstance(m, ast.Call) and ast.unparse(m.func) == "Arg":
            return inner, {k.arg: k.value for k in m.keywords}
    return inner, None


def unwrap_optional(t):
    if isinstance(t, ast.Subscript) and ast.unparse(t.value) in ("Optional", "typing.Optional"):
        return t.slice
    if isinstance(t, ast.BinOp) and isinstance(t.op, ast.BitOr):
        sides = [t.left, t.right]
        non_none = [s for s in sides if ast.unparse(s) != "None"]
        if len(non_none) == 1:
            return non_none[0]
    if isinstance(t, ast.Subscript) and ast.unparse(t.value) in ("Union", "typing.Union"):
        elts = t.slice.elts if isinstance(t.slice, ast.Tuple) else [t.slice]
        non_none = [s for s in elts if ast.unparse(s) != "None"]
        if len(non_none) == 1:
            return non_none[0]
    return t


def type_name(t):
    s = ast.unparse(t)
    return s if s in ("str", "int", "float") else "str"


flags = []
sa = Module.get(SERVER_ARGS)
namespaces = [ast.unparse(e) for e in sa.defs["_INPUT_NAMESPACES"].elts]
field_defaults = {}

for ns in namespaces:
    rel, orig = sa.imports[ns]
    m = Module.get(rel)
    cls = m.defs[orig]
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        name = node.target.id
        scope = Scope(m)
        if node.value is not None:
            d, d_expr = literal(node.value, scope)
            if isinstance(node.value, ast.Call) and ast.unparse(node.value.func).endswith("field"):
                factory = {k.arg: ast.unparse(k.value) for k in node.value.keywords}.get("default_factory")
                d, d_expr = ({"list": [], "dict": {}}[factory], None) if factory in ("list", "dict") else (
                    None, ast.unparse(node.value))
            field_defaults[name] = (d, d_expr)
        inner, meta = meta_of(node.annotation)
        if meta is None:
            continue
        if "no_cli" in meta and ast.literal_eval(meta["no_cli"]):
            continue
        cli = ast.literal_eval(meta["cli_name"]) if "cli_name" in meta else "--" + name.replace("_", "-")
        aliases = ast.literal_eval(meta["aliases"]) if "aliases" in meta else []
        has_default = node.value is not None
        default, default_expr = field_defaults.get(name, (None, None))
        typ, choices, nargs, action = None, None, None, None
        if "nargs" in meta:
            nargs = ast.literal_eval(meta["nargs"])
        if "action" in meta:
            action = ast.unparse(meta["action"])
            kw = meta.get("action_kwargs")
            if isinstance(kw, ast.Dict):
                for k, v in zip(kw.keys, kw.values):
                    if ast.literal_eval(k) == "nargs":
                        nargs = ast.literal_eval(v)
                    if ast.literal_eval(k) == "type":
                        typ = ast.unparse(v)
        else:
            t = unwrap_optional(inner)
            head = ast.unparse(t.value) if isinstance(t, ast.Subscript) else None
            if head in ("Literal", "typing.Literal"):
                vals = ev(t.slice, scope)
                vals = vals if isinstance(vals, list) else [vals]
                # As `_infer_type_func`: the first value's type when str/int/float, else str.
                first = type(vals[0]).__name__ if vals else "str"
                typ = first if first in ("str", "int", "float") else "str"
                choices = vals
            elif head in ("List", "list", "typing.List") and "type_parser" not in meta:
                typ = type_name(t.slice)
                nargs = nargs or "+"
            elif ast.unparse(t) == "bool":
                action = "store_true"
            else:
                typ = type_name(t)
            if "type_parser" in meta:
                typ = ast.unparse(meta["type_parser"])
        if "choices" in meta:
            try:
                choices = plain(ev(meta["choices"], scope))
            except Unresolved as e:
                unresolved.append(f"{cli}: choices {ast.unparse(meta['choices'])} ({e})")
                choices = None
        if isinstance(choices, list) and choices and not all(isinstance(c, (str, int, float)) for c in choices):
            choices = [str(c) for c in choices]
        names = names_with_negations([cli] + aliases, action)
        flags.append({
            "flag": names[0],
            "aliases": names[1:],
            "dest": name,
            "takes": takes_of(action, nargs),
            "action": action,
            "type": typ,
            "choices": choices,
            "default": default if has_default else None,
            **({"default_expr": default_expr} if default_expr else {}),
            "source": f"{rel}:{node.lineno}",
        })

# The registrations written out in add_cli_args, with its local variables in scope.
# `ServerArgs` is rebound to a `msgspec.defstruct` later in the module: take the class.
cls = next(n for n in sa.tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
add_cli = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "add_cli_args")
local = {}
dest_of = {f["dest"]: f for f in flags}


def declared_default(fname):
    d, d_expr = field_defaults.get(fname, (None, None))
    if d_expr:
        raise Unresolved(f"default of {fname}: {d_expr}")
    return d


local["_declared_default"] = declared_default
for stmt in ast.walk(add_cli):
    if isinstance(stmt, ast.If):
        unresolved.append(
            f"add_cli_args line {stmt.lineno}: `if {ast.unparse(stmt.test)}:` "
            f"{ast.unparse(stmt.body[0]).strip()} (environment-dependent; not applied)"
        )
for stmt in add_cli.body:
    if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
        try:
            local[stmt.targets[0].id] = ev(stmt.value, Scope(sa, local))
        except Unresolved as e:
            unresolved.append(f"add_cli_args: {stmt.targets[0].id} = {ast.unparse(stmt.value)} ({e})")
for node in ast.walk(add_cli):
    if not (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument"):
        continue
    names = []
    for a in node.args:
        if isinstance(a, ast.Constant) and isinstance(a.value, str):
            names.append(a.value)
        else:
            unresolved.append(f"add_cli_args line {node.lineno}: computed flag name {ast.unparse(a)}")
    if not names:
        continue
    kw = {k.arg: k.value for k in node.keywords}
    action = None
    if "action" in kw:
        action = kw["action"].value if isinstance(kw["action"], ast.Constant) else ast.unparse(kw["action"])
    nargs = ast.literal_eval(kw["nargs"]) if "nargs" in kw else action_init_default(sa, kw.get("action"), "nargs")
    choices = None
    scope = Scope(sa, local)
    if "choices" in kw:
        try:
            choices = plain(ev(kw["choices"], scope))
        except Unresolved as e:
            unresolved.append(f"{names[0]}: choices {ast.unparse(kw['choices'])} ({e})")
    default, default_expr = (None, None)
    if "default" in kw:
        default, default_expr = literal(kw["default"], scope)
    elif action == "store_true":
        default = False
    else:
        default = action_init_default(sa, kw.get("action"), "default")
    dest = ast.literal_eval(kw["dest"]) if "dest" in kw else names[0].lstrip("-").replace("-", "_")
    names = names_with_negations(names, action)
    flags.append({
        "flag": names[0],
        "aliases": names[1:],
        "dest": dest,
        "takes": takes_of(action, nargs),
        "action": action,
        "type": ast.unparse(kw["type"]) if "type" in kw else None,
        "choices": choices,
        "default": default,
        **({"default_expr": default_expr} if default_expr else {}),
        "source": f"{SERVER_ARGS}:{node.lineno}",
    })

# argparse's default lets a long flag be abbreviated to any unambiguous prefix.
allow_abbrev = True
for node in ast.walk(sa.tree):
    if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("ArgumentParser"):
        for k in node.keywords:
            if k.arg == "allow_abbrev":
                allow_abbrev = bool(ast.literal_eval(k.value))

seen = {}
for f in flags:
    for n in [f["flag"]] + f["aliases"]:
        if n in seen:
            unresolved.append(f"{n} is registered twice ({seen[n]} and {f['source']}); argparse would refuse")
        seen[n] = f["source"]

with open(OUT, "w") as fh:
    # One flag per line, so a diff between SGLang versions reads flag by flag.
    fh.write("{\n")
    fh.write(f' "source": {json.dumps(f"sglang {VERSION} {SERVER_ARGS} (ServerArgs.add_cli_args)")},\n')
    fh.write(f' "allow_abbrev": {json.dumps(allow_abbrev)},\n')
    fh.write(f' "unresolved": {json.dumps(unresolved)},\n')
    fh.write(' "flags": [\n')
    fh.write(",\n".join("  " + json.dumps(f) for f in flags))
    fh.write("\n ]\n}\n")
names = sum(1 + len(f["aliases"]) for f in flags)
print(f"{len(flags)} flags ({names} option strings) -> {OUT}")
for u in unresolved:
    print(f"unresolved: {u}")
