"""The layering the code relies on: packages import no command or top-level module, commands
import packages but never each other, no module imports itself back through others; the
one-sequence loop stays the bare algorithm and no function outgrows a screen."""
import ast
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

PACKAGES = ("model", "kernels", "decode")
COMMANDS = ("train", "generate", "bench")


def project_imports(path):
    """The project modules (dotted names) that the file at `path` imports."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in names if module_path(name)}


def module_path(name):
    """The file of project module `name`, or None for anything else (torch, a class name, ...)."""
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def module_name(path):
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


SOURCES = [p for p in ROOT.glob("*.py")] + [p for pkg in PACKAGES for p in (ROOT / pkg).glob("*.py")]
GRAPH = {module_name(p): {module_name(module_path(n)) for n in project_imports(p)} - {module_name(p)}
         for p in SOURCES}


def test_packages_import_only_packages():
    for module, imports in GRAPH.items():
        if module.split(".")[0] in PACKAGES:
            outside = {m for m in imports if m.split(".")[0] not in PACKAGES}
            assert not outside, f"{module} imports {outside}"


def test_commands_never_import_each_other():
    for command in COMMANDS:
        assert not GRAPH[command] & set(COMMANDS), f"{command} imports {GRAPH[command] & set(COMMANDS)}"
    assert not any(set(COMMANDS) & imports for module, imports in GRAPH.items() if module not in COMMANDS)


def test_no_import_cycles():
    def visit(module, stack):
        assert module not in stack, "import cycle: " + " -> ".join(stack + [module])
        for imported in GRAPH.get(module, ()):
            if not imported.startswith(module + "."):  # a package importing its own modules is not a cycle
                visit(imported, stack + [module])
    for module in GRAPH:
        visit(module, [])


def imported_by(module):
    """Every project module that importing `module` loads, itself excluded."""
    seen, todo = set(), [module]
    while todo:
        for imported in GRAPH.get(todo.pop(), ()):
            if imported not in seen:
                seen.add(imported)
                todo.append(imported)
    return seen - {module}


def test_the_one_sequence_loop_is_only_the_algorithm():
    """decode/speculative.py is what a reader opens first: no batch engine, fallback or timing in it."""
    assert not imported_by("decode.speculative") & {"decode.batch", "decode.fallback"}
    source = (ROOT / "decode" / "speculative.py").read_text(encoding="utf-8")
    names = {alias.name for node in ast.walk(ast.parse(source)) if isinstance(node, (ast.Import, ast.ImportFrom))
             for alias in node.names}
    assert not names & {"time", "RowView", "padded_pass", "Fallback"}
    assert len(source.splitlines()) <= 120


def test_data_loads_no_command_line_module():
    loaded = subprocess.run([sys.executable, "-c", "import sys, data; print(' '.join(sys.modules))"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    assert not set(loaded) & {"cli", *COMMANDS}


def test_no_function_is_longer_than_a_screen():
    """60 lines at most, the Triton kernel excepted: a function is read at once."""
    long = [f"{path.relative_to(ROOT)}:{node.name} {node.end_lineno - node.lineno + 1} lines"
            for path in SOURCES for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 60
            and path.name != "triton_attention.py"]
    assert not long, long
