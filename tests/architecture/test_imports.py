"""The import graph of the project, read from the source (issue 16 item 3).

Every .py under the product packages and tests/verification (migrations aside) is parsed, and
every import is an edge: at module level, under `if TYPE_CHECKING:`, inside a function, and an
`importlib.import_module("...")` with a literal name (a module that calls import_module with a
computed name is taken to load every project module it names in a string). A function-level import is an edge like
any other, so hiding a loop inside a function does not hide it from this test.

Checked:
- no cycle among project modules (the failure names the loop);
- the layers: models and policy import no services or anything above them, services import no
  admin, web views or jobs (in dunning, entitlements and agentpay alike), agentpay reaches the
  billing product only through agentpay.bridge, and product code imports no test machinery;
- function-level imports in the scanned code are only those on ALLOWED_FUNCTION_IMPORTS below,
  each with its reason.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("dunning", "subscriptions", "entitlements", "agentpay", "config", "tests/verification")
PRODUCT = ("dunning", "subscriptions", "entitlements", "agentpay", "config")

SERVICES = ("dunning.acceptance", "dunning.evidence", "dunning.actions", "dunning.reads")
ABOVE_SERVICES = ("dunning.admin", "dunning.web", "dunning.jobs", "dunning.tasks", "dunning.management")
LOWEST = ("dunning.models", "dunning.policy")
# The other apps' services and models, and what sits above them.
APP_SERVICES = ("entitlements.push", "entitlements.profiles", "entitlements.models", "agentpay.services",
                "agentpay.models", "agentpay.selectors", "agentpay.composite", "agentpay.states")
APP_ABOVE = ("entitlements.admin", "entitlements.api", "entitlements.jobs", "agentpay.admin", "agentpay.admin_review",
             "agentpay.api", "agentpay.jobs", "agentpay.tasks", *ABOVE_SERVICES)
BILLING_PRODUCT = ("dunning", "subscriptions", "entitlements")
TEST_MACHINERY = ("django.test", "unittest.mock", "tests")

# (importing module, imported module) -> why it stays inside a function. Keep this short.
ALLOWED_FUNCTION_IMPORTS: dict[tuple[str, str], str] = {
    ("dunning.apps", "dunning.jobs.catalog"):
        "AppConfig.ready registers the jobs; their modules import models, which wait for the app registry",
    ("dunning.apps", "dunning.evidence.intake"): "AppConfig.ready hands the worker task to the intake (as above)",
    ("dunning.apps", "dunning.tasks"): "AppConfig.ready: the worker task the intake hands events to (models, as above)",
    ("dunning.apps", "dunning.actions.alert_delivery"):
        "AppConfig.ready hands the alert delivery task to the alert service (models, as above)",
}


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    in_function: bool

    def where(self) -> str:
        return f"{self.source}:{self.line} -> {self.target}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _files() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            found[_module_name(path)] = path
    return found


FILES = _files()
MODULES = frozenset(FILES)


def _is_package(module: str) -> bool:
    return FILES[module].name == "__init__.py"


def _absolute(module: str, level: int, name: str | None) -> str:
    if not level:
        return name or ""
    package = module if _is_package(module) else module.rpartition(".")[0]
    for _ in range(level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{name}" if name else package


def _targets(node: ast.Import | ast.ImportFrom, module: str) -> list[str]:
    """The modules one import statement names (project modules resolved to the deepest one)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = _absolute(module, node.level, node.module)
    names = []
    for alias in node.names:
        child = f"{base}.{alias.name}"
        names.append(child if child in MODULES else base)
    return names


def _called(node: ast.Call) -> str | None:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def _import_module_target(node: ast.Call) -> str | None:
    if _called(node) == "import_module" and node.args and isinstance(node.args[0], ast.Constant):
        value = node.args[0].value
        return value if isinstance(value, str) else None
    return None


def _edges_of(module: str, path: Path) -> list[Edge]:
    tree = ast.parse(path.read_text(), filename=str(path))
    edges: list[Edge] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in _targets(child, module):
                    if target != "__future__":
                        edges.append(Edge(module, target, child.lineno, in_function))
            elif isinstance(child, ast.Call) and (target := _import_module_target(child)):
                edges.append(Edge(module, target, child.lineno, True))  # a string-named load is lazy
            visit(child, nested)

    visit(tree, False)
    if any(isinstance(node, ast.Call) and _called(node) == "import_module" for node in ast.walk(tree)):
        # A module that loads others by a computed name: each project module it names in a string
        # is taken as loaded by it.
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in MODULES:
                edges.append(Edge(module, node.value, node.lineno, True))
    return edges


EDGES = [edge for module, path in sorted(FILES.items()) for edge in _edges_of(module, path)]


def _in(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes)


def _project_target(target: str) -> str | None:
    """The project module an import lands in (`a.b.c` where only `a.b` is a module: `a.b`)."""
    while target:
        if target in MODULES:
            return target
        target = target.rpartition(".")[0]
    return None


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {module: set() for module in MODULES}
    for edge in EDGES:
        target = _project_target(edge.target)
        if target is not None:
            graph[edge.source].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One loop for each strongly connected component of more than one module (or a self-loop),
    found by Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = [0]

    def connect(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return [_loop_in(component, graph) for component in components]


def _loop_in(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """The shortest loop through the component's first module, for the failure message."""
    members = set(component)
    start = component[0]
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & members):
                if nxt == start:
                    loop = [node]
                    while loop[-1] != start:
                        loop.append(came_from[loop[-1]])
                    return [*reversed(loop), start]
                if nxt not in came_from:
                    came_from[nxt] = node
                    following.append(nxt)
        frontier = following
    return component


def _edge_lines(loop: list[str]) -> str:
    lines = []
    for source, target in zip(loop, loop[1:], strict=False):
        hits = [edge for edge in EDGES if edge.source == source and _project_target(edge.target) == target]
        lines.append(", ".join(sorted({f"{edge.where()}{' (in a function)' if edge.in_function else ''}"
                                       for edge in hits})))
    return "\n    ".join(lines)


def test_the_scan_sees_the_project() -> None:
    assert {"dunning.models", "dunning.jobs.framework", "tests.verification.simulation.engine"} <= MODULES
    assert any(edge.in_function for edge in EDGES) or not ALLOWED_FUNCTION_IMPORTS


def test_the_cycle_finder_names_each_loop() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}, "f": {"a"}}
    assert _cycles(graph) == [["a", "b", "c", "a"], ["e", "e"]]


def test_no_import_cycles() -> None:
    loops = _cycles(_graph())
    message = "\n".join(f"{' -> '.join(loop)}\n    {_edge_lines(loop)}" for loop in loops)
    assert not loops, f"import cycles:\n{message}"


def _violations(sources: tuple[str, ...], forbidden: tuple[str, ...]) -> list[str]:
    return sorted({edge.where() for edge in EDGES if _in(edge.source, sources) and _in(edge.target, forbidden)})


def _none(found: list[str], rule: str) -> None:
    assert not found, f"{rule}:\n" + "\n".join(found)


def test_models_and_policy_import_no_services_nor_anything_above() -> None:
    _none(_violations(LOWEST, SERVICES + ABOVE_SERVICES), "models and policy import a service or a layer above")


def test_services_import_no_admin_views_or_jobs() -> None:
    _none(_violations(SERVICES, ABOVE_SERVICES), "a service imports the admin, the web views or the jobs")


def test_entitlement_and_agentpay_services_import_no_api_admin_or_jobs() -> None:
    _none(_violations(APP_SERVICES, APP_ABOVE), "a service imports the API, the admin or the jobs")


def test_agentpay_reaches_the_billing_product_only_through_its_bridge() -> None:
    found = [where for where in _violations(("agentpay",), BILLING_PRODUCT) if not where.startswith("agentpay.bridge:")]
    _none(found, "AgentPay imports the billing product other than through agentpay.bridge")


def test_product_code_imports_no_test_machinery() -> None:
    _none(_violations(PRODUCT, TEST_MACHINERY), "product code imports test machinery")


def test_function_level_imports_are_only_the_allowed_ones() -> None:
    found = [edge for edge in EDGES if edge.in_function]
    pairs = {(edge.source, edge.target) for edge in found}
    unexpected = sorted({edge.where() for edge in found if (edge.source, edge.target) not in ALLOWED_FUNCTION_IMPORTS})
    stale = sorted(f"{source} -> {target}" for source, target in ALLOWED_FUNCTION_IMPORTS if (source, target) not in
                   pairs)
    assert not unexpected, "function-level imports not on the allow-list:\n" + "\n".join(unexpected)
    assert not stale, "allow-list entries no longer needed:\n" + "\n".join(stale)
