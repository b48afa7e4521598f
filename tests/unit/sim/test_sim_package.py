"""The simulator stands apart: it imports nothing of the product or of the developer stacks, so checking the
tuner against it checks two independent readings of SGLang."""

import ast
from pathlib import Path

SIM = Path(__file__).resolve().parents[3] / "include" / "sglang_sim"


def _imported_packages(path: Path) -> set[str]:
    packages = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            packages |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            packages.add(node.module.split(".")[0])
    return packages


def test_no_module_of_the_simulator_imports_the_product_or_the_developer_stacks():
    modules = sorted(SIM.rglob("*.py"))
    assert len(modules) > 20
    offenders = {str(path.relative_to(SIM)): sorted(_imported_packages(path) & {"fleetgen", "devstack"})
                 for path in modules}
    assert {name: found for name, found in offenders.items() if found} == {}
