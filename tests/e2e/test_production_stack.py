"""The DAG on a production-shaped Airflow: PostgreSQL metadata DB, CeleryExecutor on Redis, two Celery
workers, scheduler, triggerer, dag-processor and API server as real processes, two simulated nodes behind
two SSH endpoints. Runs are triggered and watched through the REST API, as an operator would."""

import json
import os
import signal
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow
DAG_ID = "sglang_generation"
SHARD_TASK = "generate.generate_shard"
PROMPTS = 160


STORE_CONN_ID = "fleetgen_test_store"  # tests/conftest.py: the connection the seaweedfs fixture defines


@pytest.fixture(scope="module")
def store_root(seaweedfs) -> str:
    """The prefix of the store this module's runs on object storage write under."""
    return f"s3://{seaweedfs.bucket}/prod-stack-{os.getpid()}"


@pytest.fixture(scope="module")
def stack(tmp_path_factory, production_services, store_root):
    from devstack.demo import SimEnvironment, free_port_block
    from devstack.prod import ProdStack, drop_database

    environment = SimEnvironment(root=tmp_path_factory.mktemp("prod"), nodes=2, gpus_per_node=1, prompts=PROMPTS,
                                 sim={"time_scale": 15.0, "load_seconds": 2.0}).prepare().start()
    # One task at a time per worker: the two shards the pool lets run together land on different workers.
    stack = ProdStack(environment=environment, database=f"fleetgen_e2e_{os.getpid()}",
                      queue=f"fleetgen-e2e-{os.getpid()}", api_port=free_port_block(4), worker_concurrency=1,
                      heartbeat_timeout_s=20, pool_slots=2, admin_password="e2e-pw",
                      scheduled_runs=False,
                      # the workers reach the store through the connection the seaweedfs fixture put in the env
                      extra_env={"FLEETGEN_ALLOW_OUTPUT_ROOTS": store_root})
    try:
        stack.prepare(recreate_database=True).start()
        yield stack
    finally:
        stack.stop()
        environment.stop()
        drop_database(stack.pg_admin_url, stack.database)


@pytest.fixture(scope="module")
def api(stack):
    token = httpx.post(f"{stack.base_url}/auth/token", json={"username": "admin", "password": "e2e-pw"}).json()
    client = httpx.Client(base_url=f"{stack.base_url}/api/v2", timeout=30,
                          headers={"Authorization": f"Bearer {token['access_token']}"})
    deadline = time.monotonic() + 120
    while (status := client.get(f"/dags/{DAG_ID}").status_code) != 200:  # the dag-processor has not serialised it
        assert time.monotonic() < deadline, f"the DAG never appeared in the API (last answer: HTTP {status})"
        time.sleep(2)
    client.patch(f"/dags/{DAG_ID}", json={"is_paused": False}).raise_for_status()
    yield client
    client.close()


def _set_time_scale(environment, time_scale: float) -> None:
    """Simulated seconds per second of the next run's servers (node.json is read at every launch)."""
    for index in range(environment.nodes):
        path = environment.node_dir(index) / "node.json"
        node = json.loads(path.read_text())
        node["sim"]["time_scale"] = time_scale
        path.write_text(json.dumps(node))


def _trigger(api, stack, time_scale: float, **conf) -> str:
    environment = stack.environment
    _set_time_scale(environment, time_scale)
    conf = {"fleet_file": str(environment.fleet_file()), "prompts_path": str(environment.prompts_path),
            "output_root": str(environment.output_root), "max_tokens": 4096, "ready_timeout_s": 120, **conf}
    response = api.post(f"/dags/{DAG_ID}/dagRuns", json={"logical_date": None, "conf": conf})
    response.raise_for_status()
    return response.json()["dag_run_id"]


def _task_instances(api, run_id) -> list[dict]:
    return api.get(f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances", params={"limit": 100}).json()["task_instances"]


def _wait(api, stack, run_id, *, until, timeout_s=300):
    """Poll the run until ``until(run, task_instances)`` is true: a state nothing later undoes (the run's end).
    Fails when the run ends first, or after ``timeout_s`` with the states it last saw."""
    deadline = time.monotonic() + timeout_s
    while True:
        run = api.get(f"/dags/{DAG_ID}/dagRuns/{run_id}").json()
        tis = _task_instances(api, run_id)
        if until(run, tis):
            return run, tis
        if run["state"] in ("success", "failed"):
            pytest.fail(f"run {run_id} ended {run['state']} before the awaited condition: "
                        f"{_not_succeeded(stack, run_id, tis)}")
        if time.monotonic() > deadline:
            pytest.fail(f"run {run_id}: condition not met after {timeout_s} s; last seen: run {run['state']}, "
                        f"tasks {_states(tis)}")
        time.sleep(0.5)


def _states(tis) -> list[tuple]:
    return [(t["task_id"], t["map_index"], t["state"]) for t in tis]


@contextmanager
def _held_mid_shard(api, stack, run_id, *, size: int, written_at_least: int, timeout_s: float = 300):
    """Both workers held (every process of their sessions stopped) at a moment a shard being written has at least
    ``written_at_least`` of its ``size`` prompts on disk and not all: inside the block it stays so, since a held
    try writes and reports nothing. Yields the shard, the worker whose task process writes it, and the count.

    Each look is made under a hold and reads only local files: which worker's session holds a shard's
    completions file open (the live try writing it) and how many lines it has. A count that missed the window
    is read again under the next hold, a shard that ran to its end between two holds is no longer open. The
    run's state is asked between holds, every few seconds (an API answer can take seconds: too long to keep
    heartbeats waiting). Fails with what it last saw when the run ends first or after ``timeout_s``."""
    run_dir = _run_dir(stack, run_id)
    files = {str(_completions_file(run_dir, shard).resolve()): shard for shard in range(-(-PROMPTS // size))}
    deadline = time.monotonic() + timeout_s
    asked_at, seen = 0.0, "no shard file open yet"
    while True:
        with stack.held(*stack.workers):
            writers = _writers(stack, files)
            written = {shard: _completed_lines(run_dir, shard) for shard in writers}
            mid = [shard for shard in writers if written_at_least <= written[shard] < size]
            if mid:
                yield mid[0], writers[mid[0]], written[mid[0]]
                return
        if writers:
            seen = f"prompts on disk of each shard being written: {written} (by {writers})"
        if time.monotonic() - asked_at > 5:
            run = api.get(f"/dags/{DAG_ID}/dagRuns/{run_id}").json()
            asked_at = time.monotonic()
            if run["state"] in ("success", "failed") or asked_at > deadline:
                pytest.fail(f"run {run_id} ({run['state']}): no shard held with {written_at_least} to {size - 1} "
                            f"of its {size} prompts written; last seen: {seen}; "
                            f"tasks {_states(_task_instances(api, run_id))}")
        time.sleep(0.2)


def _writers(stack, files: dict[str, int]) -> dict[int, str]:
    """Shard -> the worker with a process in its session that holds the shard's completions file open (``files``:
    resolved path -> shard, as /proc/PID/fd links name the files)."""
    from devstack.sessions import session_members

    writers = {}
    for worker in stack.workers:
        for pid in session_members(stack.processes[worker].pid):
            try:
                targets = [os.readlink(link) for link in Path(f"/proc/{pid}/fd").iterdir()]
            except OSError:  # gone, or an fd closed while listed
                continue
            writers.update((files[target], worker) for target in targets if target in files)
    return writers


def _not_succeeded(stack, run_id, tis) -> str:
    """The tasks that did not succeed, the run's failures file and the end of each failed task's log."""
    failures = _run_dir(stack, run_id) / "failures.jsonl"
    failed = {t["task_id"] for t in tis if t["state"] == "failed"}
    return (f"{[(t['task_id'], t['map_index'], t['state']) for t in tis if t['state'] != 'success']}; "
            f"failures: {failures.read_text() if failures.exists() else 'none'}; logs under {stack.log_path('x').parent}"
            + "".join(_log_tail(path) for path in _task_logs(stack, run_id, failed)))


def _task_logs(stack, run_id, task_ids) -> list[Path]:
    run_dirs = (stack.log_path("x").parent / "tasks").glob(f"dag_id={DAG_ID}/run_id={run_id}")
    return sorted(path for run_dir in run_dirs for task_id in task_ids
                  for path in (run_dir / f"task_id={task_id}").rglob("*.log"))


def _log_tail(path: Path, lines: int = 25) -> str:
    return f"\n--- {path} (last {lines} lines)\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _finished(run, _tis):
    return run["state"] in ("success", "failed")


def _shard_tries(api, run_id, map_index) -> list[dict]:
    path = f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{SHARD_TASK}/{map_index}/tries"
    return api.get(path).json()["task_instances"]


def _run_dir(stack, run_id) -> Path:
    from fleetgen.outputs import RunLayout

    return RunLayout.for_run(stack.environment.output_root, run_id).root


def _assert_every_prompt_exactly_once(stack, run_id):
    ids = [json.loads(line)["id"] for path in sorted((_run_dir(stack, run_id) / "completions").glob("*.jsonl"))
           for line in path.read_text().splitlines()]
    expected = [json.loads(line)["id"] for line in stack.environment.prompts_path.read_text().splitlines()]
    assert len(ids) == len(set(ids)) == PROMPTS and sorted(ids) == sorted(expected)


def _who_ran_what(api, run_id) -> dict[int, list[str]]:
    """Shard (map index) -> the worker of each try, in order."""
    shards = sorted(t["map_index"] for t in _task_instances(api, run_id) if t["task_id"] == SHARD_TASK)
    table = {i: [f"try {t['try_number']} {t['hostname']} {t['state']} {t['start_date'][11:19]}-{(t['end_date'] or '')[11:19]}"
                 for t in _shard_tries(api, run_id, i)]
             for i in shards}
    print(f"\nrun {run_id}: which worker ran which shard")
    for index, tries in table.items():
        print(f"  shard {index}: {'; '.join(tries)}")
    return table


def test_run_spreads_shards_over_both_workers_and_survives_a_scheduler_restart(api, stack):
    started = time.monotonic()
    run_id = _trigger(api, stack, time_scale=6.0, shard_size=40)  # 4 shards, 2 at a time (pool slots)
    # Restart the scheduler while shards generate, as a deployment does: SIGTERM, then SIGKILL after the grace
    # (Airflow's scheduler can hang in its SIGTERM handler). Either way the new one adopts the running tries
    # and schedules the rest. The SIGTERM goes out while the workers are held with a shard seen mid-way, so it
    # lands mid-generation however fast the shards run.
    with _held_mid_shard(api, stack, run_id, size=40, written_at_least=1) as (shard, _, written):
        stack.signal("scheduler", signal.SIGTERM)
    graceful = stack.reap("scheduler", signal.SIGTERM)
    stack.start_component("scheduler")
    run, tis = _wait(api, stack, run_id, until=_finished)
    print(f"\nrun {run_id}: {run['state']} in {time.monotonic() - started:.0f} s (scheduler stopped with shard "
          f"{shard} at {written} of 40 prompts, "
          f"{'exited on SIGTERM' if graceful else 'killed after the grace'})")
    assert run["state"] == "success", _not_succeeded(stack, run_id, tis)
    shards = [t for t in tis if t["task_id"] == SHARD_TASK]
    assert len(shards) == 4
    _who_ran_what(api, run_id)
    assert {t["hostname"] for t in shards} == set(stack.workers)
    _assert_every_prompt_exactly_once(stack, run_id)


def test_a_worker_killed_mid_shard_is_retried_on_the_other_and_nothing_is_lost(api, stack):
    started = time.monotonic()
    run_id = _trigger(api, stack, time_scale=3.0, shard_size=80)  # 2 shards, both running at once, one per worker
    run_dir = _run_dir(stack, run_id)
    # Killed while both workers are held with the shard some prompts in: nothing is written between the count
    # and the kill, and the shard cannot have run to its end first.
    with _held_mid_shard(api, stack, run_id, size=80, written_at_least=5) as (victim, worker, done_before_kill):
        stack.kill(worker, signal.SIGKILL)  # the worker, its pool and the shard's task process, at once
    killed_at = time.monotonic()
    victim_file = _completions_file(run_dir, victim)
    kept = victim_file.read_bytes()
    kept = kept[:kept.rfind(b"\n") + 1]  # a torn last line is the resume's to cut
    assert kept.count(b"\n") == done_before_kill, "a held try wrote between the count and the kill"
    run, tis = _wait(api, stack, run_id, until=_finished, timeout_s=300)
    print(f"\nrun {run_id}: {run['state']} in {time.monotonic() - started:.0f} s; killed {worker} during shard "
          f"{victim} after {done_before_kill} completions; finished {time.monotonic() - killed_at:.0f} s "
          f"after the kill")
    table = _who_ran_what(api, run_id)
    stack.start_component(worker)  # back to two workers for whatever runs next
    assert run["state"] == "success", _not_succeeded(stack, run_id, tis)
    tries = _shard_tries(api, run_id, victim)
    assert len(tries) >= 2, table
    assert tries[0]["hostname"] == worker and tries[0]["state"] == "failed"
    assert tries[-1]["state"] == "success" and tries[-1]["hostname"] != worker, table
    _assert_every_prompt_exactly_once(stack, run_id)
    # The retried try resumed from the checkpoint: the completions the killed try wrote are there as written.
    assert victim_file.read_bytes().startswith(kept), f"{victim_file}: the first {done_before_kill} lines changed"
    # The killed try ran no callback; the try that resumed its shard left the failure line, and the
    # report took the dead try's time out of the throughput.
    failures = [json.loads(line) for line in (run_dir / "failures.jsonl").read_text().splitlines()]
    lost = [f for f in failures if f.get("error") == "TryLost"]  # a retried try's line may have no error
    assert [f["task"] for f in lost] == [f"{SHARD_TASK}[{victim}]"] and lost[0]["try"] == 1
    report = json.loads((run_dir / "report" / "report.json").read_text())
    print(f"report: {report['throughput']['tokens_per_s_generation']} tokens/s over the span, "
          f"{report['throughput']['tokens_per_s_net_of_dead_time']} net of {report['timing']['dead_seconds']} s dead")
    assert report["timing"]["lost_tries"] == 1 and report["timing"]["dead_seconds"] > 0


def _completions_file(run_dir: Path, shard_id: int) -> Path:
    from fleetgen.outputs import RunLayout

    return RunLayout(run_dir).shard_file("completions", shard_id)


def _completed_lines(run_dir: Path, shard_id: int) -> int:
    path = _completions_file(run_dir, shard_id)
    return path.read_bytes().count(b"\n") if path.exists() else 0


def test_a_run_on_real_sglang_servers_through_celery(api, stack, tmp_path):
    """The same stack with real SGLang 0.5.23 servers on CPU (docs/real-sglang.md): launched by a Celery worker,
    waited for by the triggerer (with its hold against the fast-resume race), read back, generated on, stopped."""
    from tests.real_sglang import server as real

    real.require_real_sglang()
    environment = stack.environment
    # The simulated servers the runs above kept up hold the GPUs' memory, and they are not the real fleet's
    # (another server.module): stop them, as an operator switching the fleet to SGLang would.
    environment.stop_servers()
    models = real.write_tiny_models(tmp_path / "models")
    fleet_path = tmp_path / "fleet-real.json"
    fleet_path.write_text(json.dumps(real.real_fleet(environment.fleet(), models["dense"])))
    prompts = real.write_short_prompts(tmp_path / "prompts.jsonl", 24)
    conf = {"fleet_file": str(fleet_path), "prompts_path": str(prompts), "output_root": str(environment.output_root),
            "shard_size": 12, "max_tokens": 24, "ready_timeout_s": 300, "relaunch_servers": True,
            "keep_servers_up": False, "reuse_completions": "never", **real.CONTENT_THRESHOLDS}
    try:
        response = api.post(f"/dags/{DAG_ID}/dagRuns", json={"logical_date": None, "conf": conf})
        response.raise_for_status()
        run_id = response.json()["dag_run_id"]
        run, tis = _wait(api, stack, run_id, until=_finished, timeout_s=600)
        assert run["state"] == "success", _not_succeeded(stack, run_id, tis)
    finally:
        real.stop_fleet_servers(environment)
    report = json.loads((_run_dir(stack, run_id) / "report" / "report.json").read_text())
    assert report["totals"]["completions"] == 24 and report["simulated"] is False
    assert all(row["version"] == real.VERSION and row["matches"]["max_total_num_tokens"] for row in report["tuning"])
    assert len(report["tuning"]) == 2  # one real server on each node


def _committed(run, shard_id: int) -> int:
    """Completions the shard has committed on the store (the sum of its commits' parts)."""
    from fleetgen.generate.commit_log import CommitLog

    return sum(part.lines for part in CommitLog(run, shard_id).read().parts["completions"])


def _committed_ids(run) -> dict[int, list[str]]:
    from fleetgen.generate.commit_log import committed_lines, committed_shards

    return {shard: [json.loads(line)["id"] for line in committed_lines(run, shard, "completions")]
            for shard in committed_shards(run)}


def test_a_run_on_the_store_with_a_scratch_folder_per_worker_survives_a_worker_killed_mid_shard(api, stack,
                                                                                                 store_root):
    """No folder shared between the workers, or with the API server: prompts and outputs on SeaweedFS, each worker
    with its own scratch folder. A worker killed with SIGKILL mid-shard; the retry, on the other worker, resumes from
    what the killed try committed, and every prompt ends with exactly one completion."""
    from fleetgen.outputs import run_folder_name
    from fleetgen.storage.location import parse_location
    from fleetgen.storage.objects import ObjectStore

    started = time.monotonic()
    store = ObjectStore.connect(parse_location(store_root, parameter="output_root"), conn_id=STORE_CONN_ID,
                                parameter="output_root")
    store.put("inputs/prompts.jsonl", stack.environment.prompts_path.read_bytes())
    run_id = _trigger(api, stack, time_scale=3.0, shard_size=80, prompts_path=f"{store_root}/inputs/prompts.jsonl",
                      output_root=f"{store_root}/runs", storage_conn_id=STORE_CONN_ID)
    run = store.below("runs", run_folder_name(run_id))
    deadline, victim = time.monotonic() + 300, None
    while victim is None:
        assert time.monotonic() < deadline, f"no shard seen mid-way: {_states(_task_instances(api, run_id))}"
        with stack.held(*stack.workers):  # nothing commits while both are held
            mid = [shard for shard in (0, 1) if 1 <= _committed(run, shard) < 80]
            running = {t["map_index"]: t["hostname"] for t in _task_instances(api, run_id)
                       if t["task_id"] == SHARD_TASK and t["state"] == "running"}
            if mid and mid[0] in running:
                victim, worker = mid[0], running[mid[0]]
                kept = _committed_ids(run)[victim]
                stack.kill(worker, signal.SIGKILL)
        time.sleep(0.5)
    killed_at = time.monotonic()
    finished, tis = _wait(api, stack, run_id, until=_finished, timeout_s=300)
    print(f"\nrun {run_id} on the store: {finished['state']} in {time.monotonic() - started:.0f} s; killed {worker} "
          f"during shard {victim} after {len(kept)} committed completions; finished "
          f"{time.monotonic() - killed_at:.0f} s after the kill")
    table = _who_ran_what(api, run_id)
    stack.start_component(worker)
    assert finished["state"] == "success", [(t["task_id"], t["map_index"], t["state"]) for t in tis]
    tries = _shard_tries(api, run_id, victim)
    assert tries[0]["hostname"] == worker and tries[0]["state"] == "failed"
    assert tries[-1]["state"] == "success" and tries[-1]["hostname"] != worker, table
    ids = _committed_ids(run)
    every = [prompt for shard in sorted(ids) for prompt in ids[shard]]
    expected = [json.loads(line)["id"] for line in stack.environment.prompts_path.read_text().splitlines()]
    assert len(every) == len(set(every)) == PROMPTS and sorted(every) == sorted(expected)
    assert ids[victim][:len(kept)] == kept  # what the killed try committed stands, first
    failures = [json.loads(line) for line in run.get("failures.jsonl").splitlines()]
    assert [f["task"] for f in failures if f.get("error") == "TryLost"] == [f"{SHARD_TASK}[{victim}]"]
    report = json.loads(run.get("report/report.json"))
    assert report["totals"]["completions"] == PROMPTS and report["timing"]["lost_tries"] == 1
    # nothing of the run on a disk: not in the output root the workers share here, not left in the scratch folder of
    # the worker that lived (the killed one's copy is what a dead pod leaves: its disk goes with it)
    assert not _run_dir(stack, run_id).exists()
    survivor = next(name for name in stack.workers if name != worker)
    assert not any(stack.scratch_dir(survivor).glob("fleetgen-run-*"))
