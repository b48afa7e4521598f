"""An OpenAI Batch API input file through the whole DAG on the simulated node: per-prompt sampling honoured, a refused
request set aside with its line, and the run's Batch API output and error files read by the openai package's types."""

import json
from pathlib import Path

import pytest
from openai.types.chat import ChatCompletion

from fleetgen.report.batch_output import request_hash

pytestmark = pytest.mark.slow

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


@pytest.fixture(scope="module")
def ssh_server() -> str:
    """One SSH server is enough here: the file formats do not depend on it (test_dag_end_to_end runs both)."""
    return "embedded"


def _request(custom_id, url=CHAT, **body):
    text = f"Explain item {custom_id} of the list in two sentences."
    body.setdefault("prompt" if url == COMPLETIONS else "messages",
                    text if url == COMPLETIONS else [{"role": "user", "content": text}])
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_batch_api_file_runs_through_the_dag_and_its_results_come_back_as_batch_api_files(dag, sim_env, fleet_file,
                                                                                             tmp_path, caplog):
    fleet = fleet_file()
    served = json.loads(fleet.read_text())["model"]["served_name"]
    requests = [
        _request("short", model=served, max_completion_tokens=48, temperature=0.2, seed=11),
        _request("plain", model=served),
        _request("refused", model=served, n=2),
        _request("bare", COMPLETIONS, model=served, max_tokens=64, stop=["\n\n"]),
        _request("hosted-name", model="gpt-4o-mini", top_p=0.5),
    ]
    prompts = tmp_path / "batch-input.jsonl"
    prompts.write_text("".join(json.dumps(request) + "\n" for request in requests))
    conf = {"fleet_file": str(fleet), "prompts_path": str(prompts), "output_root": str(sim_env.output_root),
            "shard_size": 50, "max_tokens": 1024, "ready_timeout_s": 120, "reuse_completions": "never",
            # budgets this small end by length inside the reasoning (an empty answer): no fault of the run here
            "max_length_share": 1.0, "max_empty_answer_share": 1.0, "min_reasoning_share": 0.0}
    dag_run = dag.test(run_conf=conf)
    states = {(ti.task_id, ti.map_index): ti.state for ti in dag_run.get_task_instances()}
    assert dag_run.state == "success", states
    assert states[("validate.batch_api_files", -1)] == "success"
    [run_dir] = [path.parent.parent for path in Path(sim_env.output_root).glob("*/batch/output.jsonl")
                 if json.loads((path.parent.parent / "prompts.json").read_text())["path"] == str(prompts)]
    assert _lines(run_dir / "rejects.jsonl") == [
        {"line": 3, "id": "refused", "error": "body.n is 2: fleetgen generates one answer a request (n = 1)"}]
    assert "1 Batch API request(s) name another model than the fleet's" in caplog.text

    completions = {record["id"]: record for path in sorted((run_dir / "completions").glob("*.jsonl"))
                   for record in _lines(path)}
    assert sorted(completions) == ["bare", "hosted-name", "plain", "short"]
    # each request's own sampling, mapped onto the run's, is what was sent
    assert completions["short"]["sampling"] == {"max_tokens": 48, "temperature": 0.2, "top_p": 0.95, "seed": 11}
    assert completions["bare"]["sampling"]["stop"] == ["\n\n"] and completions["bare"]["prompt"].startswith("Explain")
    assert completions["hosted-name"]["sampling"]["top_p"] == 0.5 and completions["plain"]["sampling"]["max_tokens"] \
        == 1024

    output = _lines(run_dir / "batch" / "output.jsonl")
    assert sorted(line["custom_id"] for line in output) == sorted(completions)
    for line in output:
        assert line["error"] is None and line["response"]["status_code"] == 200
        assert line["id"].startswith("batch_req_") and line["response"]["request_id"].startswith("req_")
        body = ChatCompletion.model_validate(line["response"]["body"])
        completion = completions[line["custom_id"]]
        assert body.model == served and body.choices[0].finish_reason == completion["finish_reason"]
        assert body.choices[0].message.content == completion["content"]
        assert line["response"]["body"]["choices"][0]["message"]["reasoning_content"] == \
            completion["reasoning_content"]
        assert body.usage.completion_tokens == completion["usage"]["completion_tokens"] <= \
            completion["sampling"]["max_tokens"]
    assert _lines(run_dir / "batch" / "errors.jsonl") == [
        {"id": f"batch_req_{request_hash(run_dir.name, 'refused')}", "custom_id": "refused", "response": None,
         "error": {"code": "prompt_rejected", "message": "line 3 of the prompts file: body.n is 2: fleetgen generates "
                                                         "one answer a request (n = 1)"}}]

