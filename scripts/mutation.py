"""Mutation testing of every product module: mutmut over each module against its own fast tests.

Usage: python scripts/mutation.py [--modules a,b | --all] [--workers N] [--summary-only] [--prune-reasons]

Without --modules or --all only the modules whose inputs changed are run: each result in
mutation/summary.json carries the SHA-256 of the module's source and its mapped tests when measured, so
an everyday run costs the modules a change touched, not the hour a full run takes on 2 cores.

mutmut derives module names from file paths and only knows the `src/` layout, so each module runs in
a staging folder (mutation/.work/<name>/) whose `src` and `tests` point at this checkout; the
mutants are generated there, never in include/. The per-module results are merged into
mutation/summary.json and mutation/summary.md with the survivors' reasons from mutation/reasons.toml.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import difflib
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
MUTATION_DIR = ROOT / "mutation"
WORK_DIR = MUTATION_DIR / ".work"
GOAL = 0.90

# mutmut's exit-code verdicts (mutmut/stats.py); a timeout or a type-check catch is a kill too.
KILLED_CODES = {1, 3, 24, -24, 36, 37, 152, 255}
SURVIVED_CODES = {0}
NO_TESTS_CODES = {5, 33}
SKIPPED_CODES = {34}


def load_modules() -> dict[str, dict]:
    return tomllib.loads((MUTATION_DIR / "modules.toml").read_text())


def load_reasons() -> dict[str, str]:
    path = MUTATION_DIR / "reasons.toml"
    return tomllib.loads(path.read_text()).get("reasons", {}) if path.exists() else {}


def unused_reasons(results: dict) -> list[str]:
    """Reasons kept for mutants of measured modules that are no longer alive (killed since, or renamed)."""
    alive = {survivor["mutant"] for result in results.values() for survivor in result["survivors"]}
    modules = tuple(result["source"].removesuffix(".py").replace("/", ".") + "." for result in results.values())
    return sorted(key for key in load_reasons() if key.startswith(modules) and key not in alive)


def prune_reasons(keys: list[str]) -> None:
    """Drop those reasons' lines from reasons.toml (one line per reason; comments and order kept)."""
    drop = set(keys)
    path = MUTATION_DIR / "reasons.toml"
    kept = [line for line in path.read_text().splitlines(keepends=True)
            if not (line.startswith('"') and line.split('"', 2)[1] in drop)]
    path.write_text("".join(kept))


def inputs_digest(module: dict) -> str:
    """SHA-256 over the module's source and its mapped test files: a result is current while it matches."""
    digest = hashlib.sha256()
    for relative in [f"include/{module['source']}", *module["tests"]]:
        path = ROOT / relative
        digest.update(relative.encode() + b"\0" + (path.read_bytes() if path.exists() else b"") + b"\0")
    return digest.hexdigest()


def stale_modules(modules: dict[str, dict]) -> list[str]:
    """Modules never measured, or whose source or tests changed since summary.json's result."""
    path = MUTATION_DIR / "summary.json"
    measured = json.loads(path.read_text()).get("modules", {}) if path.exists() else {}
    return [name for name, module in modules.items()
            if measured.get(name, {}).get("inputs_sha256") != inputs_digest(module)]


def _stage(name: str, module: dict) -> pathlib.Path:
    """A staging folder: src -> include/, tests -> tests/, and a pyproject naming what to mutate."""
    stage = WORK_DIR / name
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    (stage / "src").symlink_to(ROOT / "include")
    (stage / "tests").symlink_to(ROOT / "tests")
    pytest_options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    config = {
        "source_paths": ["src"],
        "only_mutate": [f"src/{module['source']}"],
        "pytest_add_cli_args_test_selection": [*module["tests"], "-m", "not slow",
                                               *(arg for test in module.get("deselect", ()) for arg in ("--deselect", test))],
        "pytest_add_cli_args": ["-q", "--hypothesis-profile=mutation"],
        "use_git_change_detection": False,
        "track_dependencies": False,
    }
    lines = ["[tool.pytest.ini_options]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in pytest_options.items() if key != "testpaths"]
    lines += ["", "[tool.mutmut]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in config.items()]
    (stage / "pyproject.toml").write_text("\n".join(lines) + "\n")
    return stage


def run_module(name: str, module: dict, workers: int) -> None:
    """Run mutmut on one module; its wall time goes to the stage's ``run.json`` for the summary."""
    stage = _stage(name, module)
    (stage / "inputs.sha256").write_text(inputs_digest(module) + "\n")  # what this run measures
    mutmut = pathlib.Path(sys.executable).with_name("mutmut")
    started = time.monotonic()
    print(f"== {name}: {module['source']} against {' '.join(module['tests'])}", flush=True)
    result = subprocess.run(["nice", "-n", "10", str(mutmut), "run", "--max-children", str(workers)],
                            cwd=stage, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    elapsed_s = time.monotonic() - started
    (stage / "run.log").write_text(result.stdout)
    (stage / "run.json").write_text(json.dumps({"seconds": round(elapsed_s), "workers": workers}) + "\n")
    print(f"   mutmut exited {result.returncode} after {elapsed_s:.0f} s "
          f"(log: {stage.relative_to(ROOT)}/run.log)", flush=True)


def _verdicts(name: str, module: dict) -> dict[str, int | None] | None:
    meta = WORK_DIR / name / "mutants" / "src" / (module["source"] + ".meta")
    if not meta.exists():
        return None
    return json.loads(meta.read_text())["exit_code_by_key"]


def _functions(name: str, module: dict) -> dict[str, str]:
    """Every function's source in mutmut's mutated copy: the original and each mutant are defined there."""
    path = WORK_DIR / name / "mutants" / "src" / module["source"]
    text = path.read_text()
    lines = text.splitlines()
    return {node.name: "\n".join(lines[node.lineno - 1:node.end_lineno]) for node in ast.walk(ast.parse(text))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _mutant_diff(functions: dict[str, str], mutant: str) -> str:
    local = mutant.rsplit(".", 1)[-1]
    original = functions.get(local.rpartition("__mutmut_")[0] + "__mutmut_orig", "").splitlines()
    mutated = functions.get(local, "").splitlines()
    changed = [line for line in difflib.unified_diff(original[1:], mutated[1:], lineterm="", n=0)
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    return " | ".join(line[0] + " " + line[1:].strip() for line in changed)[:300]


def summarize(modules: dict[str, dict]) -> dict:
    reasons = load_reasons()
    previous = {}
    summary_path = MUTATION_DIR / "summary.json"
    if summary_path.exists():
        previous = json.loads(summary_path.read_text()).get("modules", {})
    out = {}
    for name, module in modules.items():
        verdicts = _verdicts(name, module)
        if verdicts is None:  # not measured here: the recorded result, with today's reasons
            if name in previous:
                out[name] = {**previous[name], "survivors": [{**survivor, "reason": reasons.get(survivor["mutant"], "")}
                                                             for survivor in previous[name].get("survivors", [])]}
            continue
        killed = sum(code in KILLED_CODES for code in verdicts.values())
        skipped = sum(code in SKIPPED_CODES for code in verdicts.values())
        # An interrupted run leaves mutants unchecked: the score is over the checked ones, marked partial.
        unchecked = sum(code is None for code in verdicts.values())
        alive = sorted(key for key, code in verdicts.items()
                       if code not in KILLED_CODES and code not in SKIPPED_CODES and code is not None)
        counted = len(verdicts) - skipped - unchecked
        survivors = []
        functions = _functions(name, module)
        for mutant in alive:
            code = verdicts[mutant]
            status = ("survived" if code in SURVIVED_CODES else "no tests" if code in NO_TESTS_CODES
                      else "not checked" if code is None else f"exit {code}")
            survivors.append({"mutant": mutant, "status": status, "change": _mutant_diff(functions, mutant),
                              "reason": reasons.get(mutant, "")})
        digest_file = WORK_DIR / name / "inputs.sha256"
        run_file = WORK_DIR / name / "run.json"
        out[name] = {"source": module["source"], "tests": module["tests"],
                     "inputs_sha256": digest_file.read_text().strip() if digest_file.exists() else None,
                     "mutants": counted,
                     "unchecked": unchecked, "killed": killed, "alive": len(alive),
                     "score": round(killed / counted, 4) if counted else None,
                     **(json.loads(run_file.read_text()) if run_file.exists() else {}),
                     "survivors": survivors}
    return out


def write_summary(results: dict, full_run: dict | None = None) -> bool:
    """Write summary.json and summary.md; ``full_run`` (the wall time of a ``--all`` run) replaces the
    recorded one, which is kept otherwise."""
    total = sum(r["mutants"] for r in results.values())
    killed = sum(r["killed"] for r in results.values())
    below = [name for name, r in results.items()
             if r.get("unchecked") or (r["score"] is not None and r["score"] < GOAL)]
    summary_path = MUTATION_DIR / "summary.json"
    if full_run is None and summary_path.exists():
        full_run = json.loads(summary_path.read_text()).get("full_run")
    summary_path.write_text(json.dumps(
        {"goal": GOAL, "total_mutants": total, "total_killed": killed,
         **({"full_run": full_run} if full_run else {}), "modules": results}, indent=1) + "\n")
    md = ["# Mutation score per product module", "",
          f"mutmut, each module against its fast tests (mutation/modules.toml); goal >= {GOAL:.0%} killed.", "",
          "| module | source | mutants | killed | alive | score | run (s) |",
          "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in results.items():
        score = f"{r['score']:.1%}" if r["score"] is not None else "n/a (nothing mutmut mutates: constants only)"
        if r.get("unchecked"):
            score += f" (partial: {r['unchecked']} not checked)"
        md.append(f"| {name} | {r['source']} | {r['mutants']} | {r['killed']} | {r['alive']} | {score} "
                  f"| {r.get('seconds', '')} |")
    unexplained = [s["mutant"] for r in results.values() for s in r["survivors"] if not s["reason"]]
    md += ["", f"Total: {killed}/{total} killed" + (f" ({killed / total:.1%})." if total else "."),
           f"Survivors without a reason: {len(unexplained)}.", ""]
    unused = unused_reasons(results)
    if unused:
        md += [f"{len(unused)} reason(s) in reasons.toml name mutants no longer alive (`--prune-reasons` drops them).", ""]
    if full_run:
        md += [f"Last full run (`--all`): {full_run['seconds'] / 60:.0f} min with {full_run['workers']} "
               f"worker(s), finished {full_run['finished']}.", ""]
    for name, r in results.items():
        if not r["survivors"]:
            continue
        md += [f"## Alive in {name}", ""]
        for s in r["survivors"]:
            reason = s["reason"] or "NO REASON RECORDED (add one to mutation/reasons.toml or a test)"
            md.append(f"- `{s['mutant']}` ({s['status']}): `{s['change']}`: {reason}")
        md.append("")
    (MUTATION_DIR / "summary.md").write_text("\n".join(md))
    print("\n".join(md[:len(results) + 8]))
    print(json.dumps({"mutation_total": total, "killed": killed, "modules_below_goal": below,
                      "survivors_without_reason": len(unexplained)}))
    return not below and not unexplained


@contextlib.contextmanager
def shared_object_store(chosen: list[str], modules: dict[str, dict]):
    """One SeaweedFS for every mutant whose tests use the object store (tests/conftest.py then starts none of its
    own): each test run would otherwise spend seconds starting one."""
    uses_store = any("seaweedfs" in text or "object_store" in text
                     for name in chosen for test in modules[name]["tests"]
                     for text in [(ROOT / test).read_text()])
    if not uses_store or os.environ.get("FLEETGEN_TEST_SEAWEEDFS"):
        yield
        return
    sys.path.insert(0, str(ROOT / "include"))
    from devstack.demo import free_port_block  # noqa: F401 - the store's ports come from it
    from devstack.seaweedfs import SHARED_STORE_ENV, start_seaweedfs

    folder = pathlib.Path(tempfile.mkdtemp(prefix="fleetgen-mutation-store-"))
    store = start_seaweedfs(folder)
    os.environ[SHARED_STORE_ENV] = f"{store.data_dir}:{store.ports['s3']}"
    try:
        yield
    finally:
        os.environ.pop(SHARED_STORE_ENV, None)
        store.stop()
        shutil.rmtree(folder, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", default=os.environ.get("MODULES", ""),
                        help="comma-separated names from mutation/modules.toml (default: those whose source or "
                             "tests changed since their result in summary.json)")
    parser.add_argument("--all", action="store_true", help="run every module")
    parser.add_argument("--workers", type=int, default=int(os.environ.get("MUTATION_WORKERS", "2")))
    parser.add_argument("--summary-only", action="store_true", help="rebuild the summary from the last runs")
    parser.add_argument("--prune-reasons", action="store_true",
                        help="drop the reasons of mutants no longer alive in the measured modules")
    args = parser.parse_args()
    modules = load_modules()
    chosen = (list(modules) if args.all or args.modules == "all"
              else [m for m in args.modules.split(",") if m] or stale_modules(modules))
    unknown = sorted(set(chosen) - set(modules))
    if unknown:
        parser.error(f"unknown modules {unknown}; known: {sorted(modules)}")
    if not args.modules and not args.all and not args.summary_only:
        current = [name for name in modules if name not in chosen]
        print(f"up to date (source and tests unchanged since measured): {', '.join(current) or 'none'}; "
              f"to run: {', '.join(chosen) or 'none'} (--all or MODULES=all runs every module)", flush=True)
    started = time.monotonic()
    if not args.summary_only:
        with shared_object_store(chosen, modules):
            for name in chosen:  # re-read per module: a long run picks up test lists edited meanwhile
                run_module(name, load_modules()[name], args.workers)
    full_run = None
    if not args.summary_only and set(chosen) == set(modules):
        full_run = {"seconds": round(time.monotonic() - started), "workers": args.workers,
                    "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    results = summarize(load_modules())
    if args.prune_reasons:
        prune_reasons(unused_reasons(results))
        results = summarize(load_modules())
    return 0 if write_summary(results, full_run) else 1


if __name__ == "__main__":
    sys.exit(main())
