"""The package's layers (docs/architecture.md): no module imports from a layer above its own."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "pytest_mig"

#: Each top-level package or module of pytest_mig and its layer, lowest first.
LAYERS = {
    "common": 0,
    "device": 1,
    "measure": 2, "workloads": 2,
    "store": 3,
    "judge": 4,
    "report": 5,
    "night": 6,
    "settings": 7, "options": 7, "cli": 7,
    "bench": 8, "markers": 8, "session": 8, "plugin": 8, "target": 8, "__init__": 8,
}


def _imports(path: Path) -> list[str]:
    """The pytest_mig modules a file imports (at its top or inside a function)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "pytest_mig":
                found += [f"pytest_mig.{a.name}" for a in node.names]
            elif node.module.startswith("pytest_mig."):
                found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("pytest_mig.")]
    return found


def _layer(module_path: str) -> int:
    return LAYERS[module_path.split(".")[0]]


def test_every_module_belongs_to_a_layer() -> None:
    names = {p.relative_to(PACKAGE).parts[0].removesuffix(".py") for p in PACKAGE.rglob("*.py")}
    assert names <= set(LAYERS), sorted(names - set(LAYERS))


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        own = path.relative_to(PACKAGE).with_suffix("").parts[0]
        for module in _imports(path):
            dep = module.removeprefix("pytest_mig.")
            if _layer(dep) > LAYERS[own]:
                upward.append(f"{path.relative_to(PACKAGE)} imports {module}")
    assert not upward, "\n".join(upward)


def test_modules_use_absolute_imports() -> None:
    """Every import names the layer it comes from (pytest_mig.store.baselines, not .baselines)."""
    relative = [str(p.relative_to(PACKAGE)) for p in sorted(PACKAGE.rglob("*.py"))
                if any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(ast.parse(p.read_text())))]
    assert not relative, relative


def _checked_modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _jit_names(tree: ast.Module) -> set[str]:
    """Functions a module hands to triton.jit(...) by name (kernels written plain and wrapped later)."""
    return {arg.id for node in ast.walk(tree) if isinstance(node, ast.Call) and ast.unparse(node.func) == "triton.jit"
            for arg in node.args if isinstance(arg, ast.Name)}


def _is_gpu_kernel(node: ast.FunctionDef | ast.AsyncFunctionDef, jitted: set[str]) -> bool:
    """A Triton kernel: decorated with triton.jit, or wrapped by triton.jit(name) in its module."""
    for deco in node.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        if ast.unparse(target) == "triton.jit":
            return True
    return node.name in jitted


def test_no_function_over_60_lines() -> None:
    """Every function and method outside the GPU kernels fits in 60 lines."""
    long = []
    for path in _checked_modules():
        tree = ast.parse(path.read_text(), str(path))
        jitted = _jit_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _is_gpu_kernel(node, jitted):
                lines = node.end_lineno - node.lineno + 1
                if lines > 60:
                    long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "\n".join(long)


def test_no_module_over_600_lines() -> None:
    long = [f"{p.relative_to(PACKAGE)} ({n} lines)" for p in _checked_modules()
            if (n := len(p.read_text().splitlines())) > 600]
    assert not long, "\n".join(long)


#: The environment variables of pytest-mig a user sets (docs/options.md, docs/figures.md): read, never
#: written.  Every other value passes between modules as an argument or an option.
USER_SETTINGS = {"PYTEST_MIG_PROFILE", "PYTEST_MIG_GMX"}


def _own_variables(path: Path) -> list[str]:
    """The PYTEST_MIG_* names a module spells out as a whole string or a keyword (``dict(os.environ,
    PYTEST_MIG_X=...)``), other than the Prometheus series that report/exports names (the name of a
    Gauge or a GaugeMetricFamily)."""
    tree = ast.parse(path.read_text(), str(path))
    series = {id(n.args[0]) for n in ast.walk(tree) if isinstance(n, ast.Call) and n.args
              and getattr(n.func, "id", getattr(n.func, "attr", None)) in ("Gauge", "GaugeMetricFamily")}
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in series
                and node.value.startswith("PYTEST_MIG_") and node.value.strip("ABCDEFGHIJKLMNOPQRSTUVWXYZ_") == ""):
            found.append(node.value)
        elif isinstance(node, ast.keyword) and node.arg and node.arg.startswith("PYTEST_MIG_"):
            found.append(node.arg)
    return found


def test_no_module_talks_to_another_through_the_environment() -> None:
    """docs/architecture.md: a PYTEST_MIG_* variable is only ever a user's setting."""
    hidden = [f"{path.relative_to(PACKAGE)}: {name}" for path in sorted(PACKAGE.rglob("*.py"))
              for name in _own_variables(path) if name not in USER_SETTINGS]
    assert not hidden, hidden


def test_the_environment_scan_finds_what_it_looks_for(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('import os\nENV = "PYTEST_MIG_STACK_CACHE"\nenv = dict(os.environ, PYTEST_MIG_NODE_WORKER="1")\n'
                      'g = Gauge("PYTEST_MIG_FIGURE", "a series")\nos.environ.get("PYTEST_MIG_PROFILE")\n'
                      'f = GaugeMetricFamily("PYTEST_MIG_REGRESSED", "a family")\n'
                      '"""$PYTEST_MIG_BUILT_SYSTEMS in a sentence"""\n')
    assert _own_variables(module) == ["PYTEST_MIG_STACK_CACHE", "PYTEST_MIG_NODE_WORKER", "PYTEST_MIG_PROFILE"]


#: What a function may import where it is used (docs/architecture.md): the libraries that are optional
#: or slow to import, so that the plugin and the command load without them and a test that needs none
#: does not pay for them, and ``fcntl``, which only POSIX has.  Everything else is imported at the top.
LAZY_LIBRARIES = {"torch", "triton", "transformers", "peft", "bitsandbytes", "openmm", "pynvml", "numpy", "pandas",
                  "matplotlib", "tabulate", "prometheus_client", "jsonschema", "filelock", "scipy", "fcntl"}


def _module_path(module: str) -> Path | None:
    base = PACKAGE.parent.joinpath(*module.split("."))
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.exists()), None)


def _imports_a_lazy_library_at_its_top(module: str) -> bool:
    """Whether a pytest_mig module imports one of :data:`LAZY_LIBRARIES` when it is imported."""
    path = _module_path(module)
    if path is None:
        return False
    for node in ast.parse(path.read_text()).body:
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
        if any(n.split(".")[0] in LAZY_LIBRARIES for n in names):
            return True
    return False


def _function_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import made inside a function of a file."""
    found = []
    for fn in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    found += [(node.lineno, a.name) for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    subs = [f"{node.module}.{a.name}" for a in node.names if _module_path(f"{node.module}.{a.name}")]
                    found += [(node.lineno, m) for m in subs or [node.module]]
    return found


def _lazy_allowed(module: str) -> bool:
    if module.split(".")[0] in LAZY_LIBRARIES:
        return True
    return module.startswith("pytest_mig.") and _imports_a_lazy_library_at_its_top(module)


def test_functions_import_only_what_is_optional_or_slow() -> None:
    """An import inside a function is one of :data:`LAZY_LIBRARIES`, or a pytest_mig module that imports
    one of them at its top (``report.tables``: pandas; ``workloads.training``: torch)."""
    lazy = [f"{path.relative_to(PACKAGE)}:{line} imports {module}" for path in _checked_modules()
            for line, module in _function_imports(path) if not _lazy_allowed(module)]
    assert not lazy, "\n".join(lazy)


def test_the_function_import_check_tells_the_two_kinds_apart() -> None:
    assert _lazy_allowed("torch.cuda") and _lazy_allowed("pytest_mig.report.tables")
    assert not _lazy_allowed("statistics") and not _lazy_allowed("pytest_mig.store.results")
