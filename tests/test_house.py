"""The package's shape, measured: every module in its layer, imports only downward (so no
circles), none over 500 lines, none reaching into another module's underscore names, and the
pure layers free of engines and array libraries."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "reshard"
MAX_LINES = 500

# Lower layers never import higher ones; a module may import its own layer only where listed.
LAYERS = [
    ["errors", "meta"],
    ["layout", "messages", "settings"],
    ["plan", "arrays", "rank_plan", "steps", "hosts_plan"],
    ["mesh_plan"],
    ["planner"],
    ["rank_view"],
    ["stats", "activity", "handles"],
    ["buffers", "agreement", "replay_cache", "validate"],
    ["pieces"],
    ["engines.base", "engines.available", "engines.shm_notes"],
    ["engines.gloo_pairwise", "engines.mpi_forms", "engines.shm"],
    ["engines.torch_engine", "engines.mpi_engine", "engines"],
    ["comm"],
    ["mesh"],
    ["hot_replay"],
    ["call", "step_runs", "autograd"],
    ["execute"],
    ["relayout"],
    ["ops"],
    ["moe_sums", "moe_hosts", "moe_rows"],
    ["moe_two_level"],
    ["moe", "fft"],
    ["launch.settings", "launch.report", "launch.payload", "launch.output"],
    ["launch.torch_rank", "launch.mpi_rank", "launch.mpi"],
    ["launch.local"],
    ["launch"],
    ["viz.blocks", "viz.text"],
    ["viz.scenes"],
    ["viz.moe_scenes"],
    ["viz.terminal", "viz.pictures"],
    ["viz"],
    ["demo", "explain", "explain_moe", "doctor"],
    ["bench.check", "bench.overlap", "bench.calibrate"],
    ["bench.mesh"],
    ["bench.rank"],
    ["bench.report"],
    ["bench"],
    ["cli_common"],
    ["cli_plan"],
    ["cli"],
    ["__main__", ""],
]
PURE = {"hosts_plan", "layout", "plan", "rank_plan", "mesh_plan", "steps", "planner", "rank_view", "errors", "messages", "settings", "stats", "activity"}
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
    """At import time (a pure helper may take a numpy array or tensor it is handed); plan never."""
    tree = ast.parse(MODULES[module].read_text())
    for node in (ast.walk(tree) if module == "plan" else tree.body):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        for name in names:
            assert name.split(".")[0] not in HEAVY, f"{module}:{node.lineno} imports {name}"


def test_the_import_reader_finds_known_imports():
    """The rules above read real imports (an empty reading would pass them all)."""
    assert LAYER_OF["ops"] > LAYER_OF["plan"]
    found = [t for t, _, _ in _imports("ops")]
    assert "planner" in found and "execute" in found


# The engine's data-moving primitives: only the executor's step bodies (and the engines
# themselves) call them; the bench calls them bare, as the baseline it measures against.
MOVES_DATA = {"alltoallv", "allgather", "exchange_pairs", "all_to_all_form", "prepare_send"}
MAY_MOVE_DATA = {"execute", "step_runs", "pieces", "bench.rank"}


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
        if name.split(".")[-1] in MOVES_DATA and "adapter" in name.split("."):
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
            assert module == "execute", f"{module}:{call.lineno} calls {name}: engine forms are made by execute"


def _function(module: str, name: str) -> ast.FunctionDef:
    tree = ast.parse(MODULES[module].read_text())
    return next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)


PUBLIC = [("ops", n) for n in ("all_to_all", "all_to_all_v", "all_gather", "gather", "reduce_scatter", "all_reduce")]
PUBLIC += [("relayout", "redistribute"), ("moe_rows", "exchange_segments"), ("moe_rows", "start_rows")]


@pytest.mark.parametrize(("module", "name"), PUBLIC)
def test_no_public_collective_bypasses_the_planner(module, name):
    """Each plans with ``planner`` and runs the plan through ``execute`` (``run`` or ``PlanRun``)."""
    called = {_dotted(c) for c in _calls(_function(module, name))}
    assert any(c.startswith("planner.") for c in called), f"{module}.{name} does not plan: {sorted(called)}"
    assert called & {"execute.run", "execute.PlanRun"}, f"{module}.{name} does not run a plan: {sorted(called)}"


def test_the_public_collectives_are_all_checked():
    """The list above holds every collective ``ops`` exports (and ``redistribute`` hands to relayout)."""
    import reshard.ops as ops

    listed = {n for m, n in PUBLIC if m == "ops"} | {"redistribute"}
    assert set(ops.__all__) - {"last_exchange", "ExchangeStats"} == listed
    assert {_dotted(c) for c in _calls(_function("ops", "redistribute"))} >= {"relayout.redistribute"}
    moe_calls = {_dotted(c) for f in ("dispatch", "combine") for c in _calls(_function("moe", f))}
    assert "exchange_segments" in moe_calls
