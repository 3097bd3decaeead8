"""The layout rules of issue 10 §5, checked on the source (no database, no network).

- Tests share one helper module: no test module imports another (tests/flows.py and
  tests/factories.py hold what they share), and ``settle`` / ``wait_for`` are defined
  in tests/flows.py only.
- Every model of anchor, payouts, sagas and ledger that a test can create has a
  factory in tests/factories.py (unmanaged models are database views: nothing to
  create).
- One implementation of each shared piece: PostgreSQL advisory-lock SQL only in
  common/locks.py, ``OperationRefused`` only in common/console.py, ``crash_point``
  only in common/crashpoints.py.
- ``common`` sits below every app (DESIGN.md §2): it imports none of them.
- Every ``httpx`` client or call of a service (the apps, ``corridor``, the sandbox; not
  the command-line drivers) passes ``verify=`` (``common.http.tls_context()``, one TLS
  context per process instead of one per call).

Each check reads the files as they are, parsed with ``ast``: a string in a comment or
docstring that merely names a rule is not a violation."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import factory
import pytest
from django.apps import apps

from tests.conftest import ROOT

APPS = ("anchor", "payouts", "sagas", "ledger", "treasury")
TESTS = ROOT / "tests"
FLOWS = TESTS / "flows.py"
SKIP_DIRS = {".venv", ".git", ".devservices", "test-artifacts", "node_modules",
             "__pycache__", "static", "templates"}
SHARED_HELPERS = {"settle", "wait_for"}
ADVISORY = re.compile(r"pg_\w*advisory\w*", re.IGNORECASE)


def python_files(root: Path = ROOT) -> Iterator[Path]:
    for path in sorted(root.rglob("*.py")):
        if not SKIP_DIRS.intersection(path.relative_to(root).parts):
            yield path


def project_files() -> Iterator[Path]:
    """Every Python file of the project but the tests."""
    for path in python_files():
        if TESTS not in path.parents:
            yield path


def rel(path: Path, root: Path = ROOT) -> str:
    return str(path.relative_to(root))


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def imported_modules(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, dotted name) of every import in ``tree``, at any depth; ``from x import
    y`` yields both ``x`` and ``x.y`` (y may be a module)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.lineno, node.module
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}"


def is_test_module(dotted: str) -> bool:
    parts = dotted.split(".")
    return parts[0] == "tests" and any(p.startswith("test_") for p in parts[1:])


# --- the checks, each returning what is wrong -------------------------------------------

def modules_importing_test_modules(files=None, root: Path = ROOT) -> list[str]:
    wrong = []
    for path in files or python_files(TESTS):
        for line, name in imported_modules(parse(path)):
            if is_test_module(name):
                wrong.append(f"{rel(path, root)}:{line} imports {name}")
    return sorted(set(wrong))


def shared_helpers_defined_outside_flows(files=None, root: Path = ROOT) -> list[str]:
    wrong = []
    for path in files or python_files(TESTS):
        if path == FLOWS:
            continue
        for node in ast.walk(parse(path)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) \
                    and node.name in SHARED_HELPERS:
                wrong.append(f"{rel(path, root)}:{node.lineno} defines {node.name}")
    return wrong


def models_without_factory(factories_module=None) -> list[str]:
    if factories_module is None:
        from tests import factories as factories_module
    covered = {obj._meta.model for obj in vars(factories_module).values()
               if isinstance(obj, type) and issubclass(obj, factory.django.DjangoModelFactory)
               and obj._meta.model is not None}
    return [f"{model._meta.label} ({model._meta.db_table})"
            for app in APPS for model in apps.get_app_config(app).get_models()
            if model._meta.managed and model not in covered]


def string_constants(tree: ast.AST) -> Iterator[ast.Constant]:
    """String constants that are not docstrings."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef
                      | ast.AsyncFunctionDef) and node.body \
                and isinstance(node.body[0], ast.Expr) \
                and isinstance(node.body[0].value, ast.Constant):
            docstrings.add(id(node.body[0].value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in docstrings:
            yield node


def advisory_lock_sql_outside_common(files=None, root: Path = ROOT) -> list[str]:
    wrong = []
    for path in files or project_files():
        if rel(path, root) == "common/locks.py":
            continue
        for node in string_constants(parse(path)):
            for match in ADVISORY.findall(node.value):
                wrong.append(f"{rel(path, root)}:{node.lineno} uses {match}")
    return wrong


def shared_pieces_defined_twice(files=None, root: Path = ROOT) -> list[str]:
    """``OperationRefused`` (a class) outside common/console.py, ``crash_point`` (a
    function) outside common/crashpoints.py."""
    homes = {"OperationRefused": "common/console.py", "crash_point": "common/crashpoints.py"}
    wrong = []
    for path in files or project_files():
        for node in ast.walk(parse(path)):
            if isinstance(node, ast.ClassDef | ast.FunctionDef) and node.name in homes \
                    and rel(path, root) != homes[node.name]:
                wrong.append(f"{rel(path, root)}:{node.lineno} defines {node.name}")
    return wrong


def common_importing_apps(files=None, root: Path = ROOT) -> list[str]:
    forbidden = {*APPS, "corridor", "sandbox"}
    wrong = []
    for path in files or python_files(ROOT / "common"):
        for line, name in imported_modules(parse(path)):
            if name.split(".")[0] in forbidden:
                wrong.append(f"{rel(path, root)}:{line} imports {name}")
    return sorted(set(wrong))


HTTPX_CALLS = {"Client", "get", "post", "put", "patch", "delete", "request", "stream"}
# Command-line tools and test drivers, each a handful of long-lived clients.
NOT_SERVICES = ("bench/", "corridor/management/", "corridor/processes.py",
                "corridor/devservices.py", "sandbox/drivers.py", "scripts/")


def httpx_calls_without_verify(files=None, root: Path = ROOT) -> list[str]:
    wrong = []
    for path in files or project_files():
        if rel(path, root).startswith(NOT_SERVICES):
            continue
        for node in ast.walk(parse(path)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "httpx" \
                    and node.func.attr in HTTPX_CALLS \
                    and not any(k.arg == "verify" for k in node.keywords):
                wrong.append(f"{rel(path, root)}:{node.lineno} httpx.{node.func.attr}"
                             " without verify")
    return wrong


# --- the tests ----------------------------------------------------------------------------

def test_no_test_module_imports_another():
    assert modules_importing_test_modules() == []


def test_settle_and_wait_for_live_in_flows_only():
    assert shared_helpers_defined_outside_flows() == []
    names = {n.name for n in parse(FLOWS).body if isinstance(n, ast.FunctionDef)}
    assert SHARED_HELPERS <= names


def test_every_model_has_a_factory():
    assert models_without_factory() == []


def test_advisory_lock_sql_is_in_common_locks_only():
    assert advisory_lock_sql_outside_common() == []
    assert advisory_lock_sql_outside_common([ROOT / "common" / "locks.py"]) == []
    assert ADVISORY.search((ROOT / "common" / "locks.py").read_text())


def test_operation_refused_and_crash_point_are_defined_once():
    assert shared_pieces_defined_twice() == []


def test_common_imports_no_app():
    assert common_importing_apps() == []
    assert not (ROOT / "common" / "models.py").exists()


def test_every_service_httpx_client_shares_the_tls_context():
    assert httpx_calls_without_verify() == []


# The checks catch what they are for (each run on a file that breaks its rule).

def _write(root: Path, name: str, text: str) -> Path:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_each_check_catches_its_violation(tmp_path):
    bad_test = _write(tmp_path, "tests/test_bad.py",
                      "from tests.test_sagas import drive\n"
                      "def helper():\n"
                      "    import tests.sandbox.test_ap\n"
                      "    def wait_for(p):\n"
                      "        return p()\n"
                      "def settle(transaction_id):\n"
                      "    pass\n")
    assert modules_importing_test_modules([bad_test], tmp_path) == [
        "tests/test_bad.py:1 imports tests.test_sagas",
        "tests/test_bad.py:1 imports tests.test_sagas.drive",
        "tests/test_bad.py:3 imports tests.sandbox.test_ap"]
    assert sorted(shared_helpers_defined_outside_flows([bad_test], tmp_path)) == [
        "tests/test_bad.py:4 defines wait_for", "tests/test_bad.py:6 defines settle"]

    bad_app = _write(tmp_path, "anchor/bad.py",
                     '"""pg_advisory_lock named in a docstring is fine."""\n'
                     "class OperationRefused(Exception):\n"
                     "    pass\n"
                     "def crash_point(name):\n"
                     "    pass\n"
                     "SQL = 'SELECT pg_try_advisory_xact_lock(%s)'\n")
    assert advisory_lock_sql_outside_common([bad_app], tmp_path) == [
        "anchor/bad.py:6 uses pg_try_advisory_xact_lock"]
    assert shared_pieces_defined_twice([bad_app], tmp_path) == [
        "anchor/bad.py:2 defines OperationRefused", "anchor/bad.py:4 defines crash_point"]
    home = _write(tmp_path, "common/locks.py", "SQL = 'SELECT pg_advisory_unlock(%s)'\n")
    assert advisory_lock_sql_outside_common([home], tmp_path) == []

    bad_common = _write(tmp_path, "common/bad.py",
                        "from anchor.models import DepositRelease\nimport ledger.services\n"
                        "from django.db import connection\n")
    assert common_importing_apps([bad_common], tmp_path) == [
        "common/bad.py:1 imports anchor.models",
        "common/bad.py:1 imports anchor.models.DepositRelease",
        "common/bad.py:2 imports ledger.services"]

    bad_client = _write(tmp_path, "payouts/bad.py",
                        "import httpx\n"
                        "def call():\n"
                        "    with httpx.Client(timeout=5) as client:\n"
                        "        return httpx.get('http://x', timeout=5, verify=ctx())\n")
    assert httpx_calls_without_verify([bad_client], tmp_path) == [
        "payouts/bad.py:3 httpx.Client without verify"]

    class Factories:
        from tests.factories import DepositReleaseFactory

    missing = models_without_factory(Factories)
    assert "anchor.DepositRelease (deposit_releases)" not in missing
    assert "ledger.Posting (ledger_postings)" in missing
    assert "sagas.ReviewItem (operator_review_queue)" not in missing  # a view


@pytest.mark.django_db
def test_every_factory_makes_a_valid_row():
    """Each factory's row satisfies its table's constraints, and an ``EntryFactory``
    entry is balanced (a lone ``PostingFactory`` row is not, by design)."""
    from tests import factories

    made = {}
    for obj in vars(factories).values():
        if isinstance(obj, type) and issubclass(obj, factory.django.DjangoModelFactory) \
                and obj._meta.model is not None and obj is not factories.PostingFactory:
            row = obj()
            made[obj._meta.model] = type(row).objects.filter(pk=row.pk).exists()
    assert all(made.values()) and len(made) == len(factories_models()) - 1
    entry = factories.EntryFactory(postings__amount="2.5")
    postings = list(entry.postings.select_related("account"))
    assert sorted(p.amount for p in postings) == [Decimal("-2.5"), Decimal("2.5")]
    assert sorted(p.account.balance for p in postings) == [Decimal("-2.5"), Decimal("2.5")]


def factories_models() -> set:
    from tests import factories

    return {obj._meta.model for obj in vars(factories).values()
            if isinstance(obj, type) and issubclass(obj, factory.django.DjangoModelFactory)
            and obj._meta.model is not None}
