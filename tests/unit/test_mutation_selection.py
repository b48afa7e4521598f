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


def _result(**extra) -> dict:
    return {"source": "pkg/a.py", "tests": [], "mutants": 10, "unchecked": 0, "killed": 10, "alive": 0,
            "score": 1.0, "survivors": [], **extra}


def test_a_full_run_records_its_wall_time_and_an_incremental_run_keeps_it(mutation):
    full_run = {"seconds": 3725, "workers": 2, "finished": "2026-12-03 02:00 UTC"}
    mutation.write_summary({"a": _result(seconds=3000)}, full_run)
    assert json.loads((mutation.MUTATION_DIR / "summary.json").read_text())["full_run"] == full_run
    markdown = (mutation.MUTATION_DIR / "summary.md").read_text()
    assert "Last full run (`--all`): 62 min with 2 worker(s), finished 2026-12-03 02:00 UTC." in markdown
    assert "| a | pkg/a.py | 10 | 10 | 0 | 100.0% | 3000 |" in markdown
    mutation.write_summary({"a": _result(seconds=40)})
    assert json.loads((mutation.MUTATION_DIR / "summary.json").read_text())["full_run"] == full_run


def test_a_survivor_without_a_reason_fails_the_run_and_is_counted(mutation):
    explained = {"mutant": "pkg.a.x_f__mutmut_1", "status": "survived", "change": "", "reason": "equivalent"}
    assert mutation.write_summary({"a": _result(alive=1, score=0.95, survivors=[explained])})
    unexplained = {**explained, "mutant": "pkg.a.x_f__mutmut_2", "reason": ""}
    assert not mutation.write_summary({"a": _result(alive=2, score=0.95, survivors=[explained, unexplained])})
    assert "Survivors without a reason: 1." in (mutation.MUTATION_DIR / "summary.md").read_text()


def test_a_result_measured_elsewhere_takes_the_reasons_recorded_since(mutation, monkeypatch, tmp_path):
    monkeypatch.setattr(mutation, "WORK_DIR", tmp_path / "work")  # nothing measured in this checkout
    survivors = [{"mutant": f"pkg.a.x_f__mutmut_{n}", "status": "survived", "change": "", "reason": old}
                 for n, old in ((1, ""), (2, "a reason since removed"))]
    (mutation.MUTATION_DIR / "summary.json").write_text(json.dumps(
        {"modules": {"a": _result(alive=2, score=0.8, survivors=survivors)}}))
    (mutation.MUTATION_DIR / "reasons.toml").write_text('[reasons]\n"pkg.a.x_f__mutmut_1" = "equivalent"\n')
    result = mutation.summarize({"a": _modules()["a"]})["a"]
    assert [survivor["reason"] for survivor in result["survivors"]] == ["equivalent", ""]
    assert (result["alive"], result["score"]) == (2, 0.8)


def test_a_module_with_nothing_to_mutate_meets_the_goal_and_says_why(mutation):
    assert mutation.write_summary({"a": _result(mutants=0, killed=0, score=None)})
    assert "| n/a (nothing mutmut mutates: constants only) |" in (mutation.MUTATION_DIR / "summary.md").read_text()


def test_a_module_result_carries_the_seconds_its_run_took(mutation, tmp_path, monkeypatch):
    monkeypatch.setattr(mutation, "WORK_DIR", tmp_path / "work")
    meta = tmp_path / "work" / "a" / "mutants" / "src" / "pkg" / "a.py.meta"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"exit_code_by_key": {"pkg.a.x_f__mutmut_1": 1}}))
    (meta.parent / "a.py").write_text("def x_f__mutmut_orig():\n    return 1\n")
    (tmp_path / "work" / "a" / "run.json").write_text(json.dumps({"seconds": 17, "workers": 2}))
    results = mutation.summarize({"a": _modules()["a"]})
    assert (results["a"]["seconds"], results["a"]["workers"], results["a"]["killed"]) == (17, 2, 1)


def test_every_product_module_is_in_the_mutation_map_with_test_files_that_exist():
    root = SCRIPT.parents[1]
    spec = importlib.util.spec_from_file_location("mutation_map", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    modules = script.load_modules()
    mapped = {module["source"] for module in modules.values()}
    product = {str(path.relative_to(root / "include")) for path in (root / "include" / "fleetgen").rglob("*.py")
               if path.name != "__init__.py"}
    assert sorted(product - mapped) == []
    assert sorted(mapped - product) == []
    missing = [test for module in modules.values() for test in module["tests"] if not (root / test).is_file()]
    assert missing == []


def test_reasons_of_mutants_no_longer_alive_are_listed_and_pruned_keeping_the_others(mutation):
    (mutation.MUTATION_DIR / "reasons.toml").write_text(
        '# why\n[reasons]\n"pkg.a.x_f__mutmut_1" = "equivalent: alive"\n"pkg.a.x_f__mutmut_2" = "killed since"\n'
        '"pkg.ab.x_g__mutmut_1" = "another module, not measured"\n')
    results = {"a": _result(alive=1, survivors=[{"mutant": "pkg.a.x_f__mutmut_1", "status": "survived",
                                                   "change": "", "reason": ""}])}
    assert mutation.unused_reasons(results) == ["pkg.a.x_f__mutmut_2"]
    mutation.prune_reasons(mutation.unused_reasons(results))
    assert (mutation.MUTATION_DIR / "reasons.toml").read_text() == (
        '# why\n[reasons]\n"pkg.a.x_f__mutmut_1" = "equivalent: alive"\n'
        '"pkg.ab.x_g__mutmut_1" = "another module, not measured"\n')
