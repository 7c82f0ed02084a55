"""The package's shape, measured: every module in its layer, imports only downward (so no
circles), none over 500 lines, none reaching into another module's underscore names, and the
pure layers free of engines and array libraries."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "reshard"
MAX_LINES = 500

# Lower layers never import higher ones; a module may import its own layer only where listed.
LAYERS = [
    ["errors", "version", "engines.shared_pages"],
    ["planning.placements", "messages", "settings"],
    ["planning.spec", "execution.tracebacks"],
    ["planning.layout"],
    ["planning.plan", "execution.arrays", "planning.box_geometry", "planning.steps", "planning.host_costs"],
    ["planning.mesh_plan"],
    ["planning.planner"],
    ["planning"],
    ["tools.rank_report"],
    ["execution.stats", "execution.activity", "execution.handles", "execution.phases", "engines.arena"],
    ["execution.buffers", "execution.agreement", "execution.replay_cache", "validate"],
    ["execution.pieces"],
    ["engines.base", "engines.available", "engines.shm_notes"],
    ["engines.gloo_pairwise", "engines.mpi_forms", "engines.shm"],
    ["engines.arena_link"],
    ["engines.torch_engine", "engines.mpi_engine", "engines"],
    ["comm"],
    ["mesh"],
    ["execution.hot_replay"],
    ["execution.call", "execution.step_bodies", "execution.autograd", "execution.arena_reads"],
    ["execution.execute"],
    ["execution.many_reads"],
    ["execution.coalesced"],
    ["execution"],
    ["redistribution"],
    ["ops", "memory"],
    ["moe.sums", "moe.host_routes", "moe.rows"],
    ["moe.two_level"],
    ["moe", "fft"],
    ["launch.process", "launch.report", "launch.payload", "launch.output"],
    ["launch.torch_rank", "launch.mpi_rank", "launch.mpi"],
    ["launch.local"],
    ["launch"],
    ["viz.blocks", "viz.text"],
    ["viz.scenes"],
    ["viz.moe_scenes"],
    ["viz.terminal", "viz.pictures"],
    ["viz.timeline"],
    ["viz"],
    ["tools.demo", "tools.explain", "tools.explain_moe", "tools.doctor"],
    ["bench.check", "bench.overlap", "bench.calibrate"],
    ["bench.mesh"],
    ["bench.rank"],
    ["bench.report"],
    ["bench"],
    ["tools.cli_common"],
    ["tools.cli_plan"],
    ["tools"],
    ["cli"],
    ["__main__", ""],
]
PURE = {"planning", "planning.host_costs", "planning.layout", "planning.spec", "planning.placements", "planning.plan", "planning.box_geometry", "planning.mesh_plan",
        "planning.steps", "planning.planner", "tools.rank_report", "errors", "messages", "settings", "execution.tracebacks", "execution.stats",
        "execution.activity"}
HEAVY = {"torch", "numpy", "mpi4py", "matplotlib", "rich"}


def _name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
LAYER_OF = {m: i for i, layer in enumerate(LAYERS) for m in layer}


def _resolve(module: str, node: ast.ImportFrom) -> str:
    """The package-relative name a relative import names ('' for the package itself)."""
    base = module.split(".") if module else []
    is_package = MODULES[module].name == "__init__.py"
    keep = len(base) - (node.level - 1) - (0 if is_package else 1)
    parts = base[: max(keep, 0)] + (node.module.split(".") if node.module else [])
    return ".".join(parts)


def _imports(module: str) -> list[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) for every reshard import in ``module``."""
    tree = ast.parse(MODULES[module].read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                target = _resolve(module, node)
            elif node.module and node.module.split(".")[0] == "reshard":
                target = node.module.removeprefix("reshard").lstrip(".")
            else:
                continue
            names = [a.name for a in node.names]
            # "from . import ops" names a module, not an attribute of the package
            sub = [f"{target}.{n}".lstrip(".") for n in names if f"{target}.{n}".lstrip(".") in MODULES]
            if sub:
                found += [(s, [], node.lineno) for s in sub]
            else:
                found.append((target, names, node.lineno))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "reshard":
                    found.append((a.name.removeprefix("reshard").lstrip("."), [], node.lineno))
    return found


def test_every_module_has_a_layer():
    assert sorted(set(MODULES) - set(LAYER_OF)) == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_run_down_only(module):
    for target, _, line in _imports(module):
        if target == "" and module in ("__main__", ""):
            continue
        assert target in MODULES, f"{module}:{line} imports unknown reshard.{target}"
        assert LAYER_OF[target] < LAYER_OF[module] or (target in ("", "launch") and module == "__main__"), (
            f"{module}:{line} imports {target}, which is not in a lower layer"
        )


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_takes_another_modules_underscore_names(module):
    for target, names, line in _imports(module):
        private = [n for n in names if n.startswith("_")]
        assert not private, f"{module}:{line} imports {private} from {target}"
    tree = ast.parse(MODULES[module].read_text())
    imported = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in imported:
            assert not (node.attr.startswith("_") and not node.attr.startswith("__")), (
                f"{module}:{node.lineno} reads {node.value.id}.{node.attr}"
            )


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_over_the_line_limit(module):
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{module} has {lines} lines"


@pytest.mark.parametrize("module", sorted(PURE))
def test_pure_layers_import_no_engine_or_array_library(module):
    """At import time: a pure helper may import numpy inside a function that vectorises (the
    tables of ``reshard plan``, a rank's peers), or take an array it is handed."""
    tree = ast.parse(MODULES[module].read_text())
    for node in tree.body:
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        for name in names:
            assert name.split(".")[0] not in HEAVY, f"{module}:{node.lineno} imports {name}"


def test_the_import_reader_finds_known_imports():
    """The rules above read real imports (an empty reading would pass them all)."""
    assert LAYER_OF["ops"] > LAYER_OF["planning.plan"]
    found = [t for t, _, _ in _imports("ops")]
    assert "planning.planner" in found and "execution.execute" in found


# The engine's data-moving primitives: only the executor's step bodies (and the engines
# themselves) call them; the bench calls them bare, as the baseline it measures against.
MOVES_DATA = {"alltoallv", "allgather", "exchange_pairs", "all_to_all_form", "prepare_send"}
# execution.coalesced is the executor's part for a call on many tensors (one shared exchange)
MAY_MOVE_DATA = {"execution.execute", "execution.coalesced", "execution.step_bodies", "execution.pieces", "bench.rank"}


def _calls(node: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Call)]


def _dotted(call: ast.Call) -> str:
    f, parts = call.func, []
    while isinstance(f, ast.Attribute):
        parts.append(f.attr)
        f = f.value
    if isinstance(f, ast.Name):
        parts.append(f.id)
    return ".".join(reversed(parts))


@pytest.mark.parametrize("module", sorted(m for m in MODULES if not m.startswith("engines")))
def test_only_the_executor_moves_data(module):
    tree = ast.parse(MODULES[module].read_text())
    for call in _calls(tree):
        name = _dotted(call)
        if name.split(".")[-1] in MOVES_DATA and "primitives" in name.split("."):
            assert module in MAY_MOVE_DATA, f"{module}:{call.lineno} calls {name}: data moves only through execute"


# The engine's forms (a step bound to the engine's own collective): made by the executor alone,
# which every call runs through (test_one_route checks the frames at run time).
ENGINE_FORMS = {"all_to_all_form", "boxes_form", "prepare_send", "typed_form", "pairwise_form"}


@pytest.mark.parametrize("module", sorted(m for m in MODULES if not m.startswith("engines")))
def test_only_the_executor_makes_engine_forms(module):
    tree = ast.parse(MODULES[module].read_text())
    for call in _calls(tree):
        name = _dotted(call)
        if name.split(".")[-1] in ENGINE_FORMS and not name.startswith("execute."):  # the executor's own API
            assert module == "execution.execute", f"{module}:{call.lineno} calls {name}: engine forms are made by execute"


def _function(module: str, name: str) -> ast.FunctionDef:
    tree = ast.parse(MODULES[module].read_text())
    return next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)


PUBLIC = [("ops", n) for n in ("all_to_all", "all_to_all_v", "all_gather", "gather", "reduce_scatter", "all_reduce")]
PUBLIC += [("redistribution", "redistribute"), ("moe.rows", "exchange_segments"), ("moe.rows", "start_rows")]


@pytest.mark.parametrize(("module", "name"), PUBLIC)
def test_no_public_collective_bypasses_the_planner(module, name):
    """Each plans with ``planner`` and runs the plan through ``execute`` (``run`` or ``PlanRun``)."""
    called = {_dotted(c) for c in _calls(_function(module, name))}
    assert any(c.startswith("planner.") for c in called), f"{module}.{name} does not plan: {sorted(called)}"
    assert called & {"execute.run", "execute.PlanRun"}, f"{module}.{name} does not run a plan: {sorted(called)}"


def test_the_public_collectives_are_all_checked():
    """The list above holds every collective ``ops`` exports (and ``redistribute`` hands to redistribution)."""
    import reshard.ops as ops

    listed = {n for m, n in PUBLIC if m == "ops"} | {"redistribute"}
    assert set(ops.__all__) - {"last_exchange", "ExchangeStats"} == listed
    assert {_dotted(c) for c in _calls(_function("ops", "redistribute"))} >= {"redistribution.redistribute"}
    # MoE: dispatch (through its worker _dispatch) and combine each exchange through a
    # planned collective on the flat path, and through the two-level module across hosts,
    # whose every exchange is a planned collective too
    for name, body in (("dispatch", "_dispatch"), ("combine", "combine")):
        called = {_dotted(c) for c in _calls(_function("moe", body))}
        assert "exchange_segments" in called, f"moe.{body} does not exchange through exchange_segments: {called}"
        assert f"two_level.{name}" in called, f"moe.{body} does not take the two-level path: {called}"
        two_level = {_dotted(c) for c in _calls(_function("moe.two_level", name))}
        assert two_level & {"start_rows", "_exchanged"}, two_level
    assert "_dispatch" in {_dotted(c) for c in _calls(_function("moe", "dispatch"))}
    assert "start_rows" in {_dotted(c) for c in _calls(_function("moe.two_level", "_exchanged"))}


# What rs.last_exchange() reports is recorded by the executor alone: the forms note their
# copies and memory in the step's Tally, the call counts its checks, and execute writes them.
STATS_FIELDS = {"op", "pack_copies", "unpack_copies", "bytes_sent", "bytes_received", "metadata_exchanges",
                "allocated_bytes", "replayed", "cross_host_bytes_sent", "cross_host_messages", "steps",
                "_received_into", "received_into"}
STATS_WRITERS = {"received_at", "received_into_result", "begin_step", "end_step"}
MAY_WRITE_STATS = {"execution.execute", "execution.coalesced", "execution.stats", "planning.plan"}  # plan.Plan, explain's report, has copy fields of its own


def _stats_writes(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for every write of an ``ExchangeStats`` field the AST can see: an
    assignment in any form (plain, augmented, annotated, unpacked, walrus-free targets),
    ``setattr``/``delattr``, the stats' own writing methods, a list method on ``.steps`` of a
    stats object, and ``ExchangeStats(...)`` or ``dataclasses.replace`` given more than the op."""
    found = []

    def targets(node: ast.AST) -> list[ast.AST]:
        if isinstance(node, (ast.Tuple, ast.List)):
            return [t for e in node.elts for t in targets(e)]
        if isinstance(node, ast.Starred):
            return targets(node.value)
        return [node]

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            tgts = [t for target in node.targets for t in targets(target)]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            tgts = targets(node.target)
        elif isinstance(node, ast.Delete):
            tgts = [t for target in node.targets for t in targets(target)]
        elif isinstance(node, ast.For):
            tgts = targets(node.target)
        else:
            tgts = []
        for t in tgts:
            if isinstance(t, ast.Attribute) and t.attr in STATS_FIELDS - {"op", "steps"}:
                found.append((node.lineno, f"assigns .{t.attr}"))
            if isinstance(t, ast.Attribute) and t.attr in {"op", "steps"} and "stats" in ast.unparse(t.value):
                found.append((node.lineno, f"assigns {ast.unparse(t)}"))
        if isinstance(node, ast.Call):
            name = _dotted(node)
            last = name.split(".")[-1]
            if last in {"setattr", "delattr"} and len(node.args) >= 2:
                field = node.args[1]
                if not isinstance(field, ast.Constant) or field.value in STATS_FIELDS:
                    found.append((node.lineno, f"{last}({ast.unparse(node.args[1])})"))
            if last in STATS_WRITERS:
                found.append((node.lineno, f"calls {name}"))
            if last in {"append", "extend", "insert", "clear", "pop"} and name.endswith(f"steps.{last}") and \
                    "stats" in name:
                found.append((node.lineno, f"calls {name}"))
            if last == "ExchangeStats" and (len(node.args) > 1 or node.keywords):
                found.append((node.lineno, "makes ExchangeStats with more than its op"))
            if last == "replace" and node.args and "stats" in ast.unparse(node.args[0]):
                found.append((node.lineno, f"calls {name}"))
    return found


@pytest.mark.parametrize("module", sorted(MODULES))
def test_only_the_executor_writes_the_stats(module):
    writes = _stats_writes(ast.parse(MODULES[module].read_text()))
    if module not in MAY_WRITE_STATS:
        assert not writes, f"{module}: {writes}: only execute records what rs.last_exchange() reports"


def test_the_stats_reader_sees_every_form_of_write():
    code = """
stats.pack_copies += 1
k.stats.bytes_sent = 3
a, b.allocated_bytes = 1, 2
setattr(stats, "replayed", True)
setattr(stats, name, 1)
st: int = 0
st.metadata_exchanges: int = 4
stats.received_at(0)
call.stats.steps.append(step)
ExchangeStats("x", replayed=True)
dataclasses.replace(stats, op="y")
del stats.cross_host_messages
for stats.unpack_copies in range(2): pass
tally.packs += 1
"""
    lines = sorted({line for line, _ in _stats_writes(ast.parse(code))})
    assert lines == [2, 3, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14], lines  # not the plain name (7), not a tally (15)


MAX_TOP_MODULES = 14


def test_the_top_folder_holds_few_modules():
    """The layers show as folders (planning, execution, engines, moe, launch, viz, bench,
    tools): at most 14 modules directly in the package, its ``__init__`` counted."""
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, top
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert {"planning", "execution", "engines", "moe", "launch", "tools"} <= folders, folders


@pytest.mark.parametrize(("module", "names"), [
    ("reshard.moe", {"MoEHandle", "dispatch", "combine", "pipeline"}),
    ("reshard.fft", {"fftn", "ifftn", "rfftn", "irfftn", "output_layout"}),
])
def test_a_star_import_of_a_public_module_gives_its_surface_not_its_imports(module, names):
    namespace: dict = {}
    exec(f"from {module} import *", namespace)
    assert set(namespace) - {"__builtins__"} == names


def test_dir_of_the_package_lists_the_calls_it_loads_on_first_use():
    # what an editor's or notebook's completion offers after "rs.": the lazy names too
    import reshard

    listed = dir(reshard)
    assert set(reshard.__all__) <= set(listed), sorted(set(reshard.__all__) - set(listed))
    assert listed == sorted(listed) and "__version__" in listed
