"""`make mutation` runs only the modules whose source or mapped tests changed since their recorded result."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "mutation.py"


@pytest.fixture
def mutation(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("mutation_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (tmp_path / "include" / "pkg").mkdir(parents=True)
    (tmp_path / "tests").mkdir()
    for name in ("a", "b"):
        (tmp_path / "include" / "pkg" / f"{name}.py").write_text(f"X = '{name}'\n")
        (tmp_path / "tests" / f"test_{name}.py").write_text("def test(): pass\n")
    monkeypatch.setattr(module, "ROOT", tmp_path)
    monkeypatch.setattr(module, "MUTATION_DIR", tmp_path / "mutation")
    (tmp_path / "mutation").mkdir()
    return module


def _modules() -> dict[str, dict]:
    return {name: {"source": f"pkg/{name}.py", "tests": [f"tests/test_{name}.py"]} for name in ("a", "b")}


def _record(mutation, modules, **digests) -> None:
    (mutation.MUTATION_DIR / "summary.json").write_text(json.dumps(
        {"modules": {name: {"inputs_sha256": digest} for name, digest in digests.items()}}))


def test_never_measured_modules_all_run(mutation):
    assert mutation.stale_modules(_modules()) == ["a", "b"]


def test_a_module_is_current_until_its_source_or_a_test_changes(mutation, tmp_path):
    modules = _modules()
    _record(mutation, modules, a=mutation.inputs_digest(modules["a"]), b=mutation.inputs_digest(modules["b"]))
    assert mutation.stale_modules(modules) == []
    (tmp_path / "tests" / "test_b.py").write_text("def test(): assert True\n")
    assert mutation.stale_modules(modules) == ["b"]
    (tmp_path / "include" / "pkg" / "a.py").write_text("X = 'changed'\n")
    assert mutation.stale_modules(modules) == ["a", "b"]


def test_adding_a_test_file_to_a_module_makes_it_stale(mutation, tmp_path):
    modules = _modules()
    _record(mutation, modules, a=mutation.inputs_digest(modules["a"]), b=mutation.inputs_digest(modules["b"]))
    (tmp_path / "tests" / "test_a_more.py").write_text("def test(): pass\n")
    modules["a"]["tests"].append("tests/test_a_more.py")
    assert mutation.stale_modules(modules) == ["a"]
