"""One 5 MB prompt through the DAG's tune stage over real SSH: set aside at scan time (the model's context read
from config.json on the node), the plan the same as without it."""

import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _planned_caps(log: str) -> list[str]:
    return re.findall(r"Planned \d+ server\(s\); expected effective max_running_requests (\[[\d, ]+\])", log)


def test_a_5_mb_prompt_is_rejected_and_the_plan_is_the_one_without_it(dag, sim_env, fleet_file, tmp_path, capfd,
                                                                        caplog, monkeypatch):
    monkeypatch.setenv("FLEETGEN_ALLOW_OUTPUT_ROOTS", str(tmp_path))  # each test's runs write in its own folder
    normal = sim_env.prompts_path.read_text()
    with_huge = tmp_path / "with-huge.jsonl"
    lines = normal.splitlines(keepends=True)
    with_huge.write_text("".join(lines[:60]) + json.dumps({"id": "huge", "prompt": "lorem ipsum " * 437_000}) + "\n"
                         + "".join(lines[60:]))
    fleet = str(fleet_file())
    caps = []
    for prompts in (sim_env.prompts_path, with_huge):
        conf = {"fleet_file": fleet, "prompts_path": str(prompts), "output_root": str(tmp_path / "out"),
                "max_tokens": 4096, "dry_run": True}
        caplog.clear()
        dag_run = dag.test(run_conf=conf)
        states = {ti.task_id: ti.state for ti in dag_run.get_task_instances()}
        assert states["tune.derive_plan"] == "success", states
        out, err = capfd.readouterr()
        log = out + err + caplog.text
        caps.append(_planned_caps(log)[-1])
    assert caps[0] == caps[1], caps
    assert "1 prompt(s) set aside as too long for the context of 262144 tokens (the model's context length)" in log
    [rejects] = [path for path in Path(tmp_path / "out").glob("*/rejects.jsonl") if path.read_text()]
    [reject] = [json.loads(line) for line in rejects.read_text().splitlines()]
    assert reject["id"] == "huge" and reject["line"] == 61 and reject["error"].startswith("too long for the context")


def test_a_700_kb_prompt_is_warned_about_and_max_cap_cut_factor_plans_without_it(dag, sim_env, fleet_file, tmp_path,
                                                                               capfd, caplog, monkeypatch):
    monkeypatch.setenv("FLEETGEN_ALLOW_OUTPUT_ROOTS", str(tmp_path))  # each test's runs write in its own folder
    lines = sim_env.prompts_path.read_text().splitlines(keepends=True)
    with_long = tmp_path / "with-long.jsonl"
    with_long.write_text("".join(lines[:60]) + json.dumps({"id": "long", "prompt": "x" * 700_000}) + "\n"
                         + "".join(lines[60:]))
    fleet, logs, caps = str(fleet_file()), [], []
    # each factor said, not left to the default: dag.test in one process keeps an earlier run's conf in the params
    off = {"max_cap_cut_factor": 0}
    for prompts, extra in ((sim_env.prompts_path, off), (with_long, off), (with_long, {"max_cap_cut_factor": 4})):
        conf = {"fleet_file": fleet, "prompts_path": str(prompts), "output_root": str(tmp_path / "out"),
                "max_tokens": 4096, "dry_run": True, **extra}
        caplog.clear()
        dag_run = dag.test(run_conf=conf)
        states = {ti.task_id: ti.state for ti in dag_run.get_task_instances()}
        assert states["tune.derive_plan"] == "success", states
        out, err = capfd.readouterr()
        logs.append(out + err + caplog.text)
        caps.append(_planned_caps(logs[-1])[-1])
    clean, cut, set_aside = caps
    assert clean == set_aside != cut, caps
    assert "One prompt cuts every server's running requests: prompt 'long' (line 61, ~175000 tokens" in logs[1]
    assert "One prompt cuts" not in logs[0] and "One prompt cuts" not in logs[2]
    assert "1 prompt(s) set aside as too long for the context of" in logs[2] and "max_cap_cut_factor 4" in logs[2]
