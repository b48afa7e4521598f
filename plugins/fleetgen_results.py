"""fleetgen's results one click away from Airflow: extra links on the tasks and a view served by the API server.

- Extra links: *Report* on ``validate.report``, *Data Docs* on ``validate.validate`` and ``validate.report``,
  *Failures* on ``run_outcome`` and on any task that left a line in the run's ``failures.jsonl``.
- The view (``/fleetgen/runs/<dag_id>/<run_id>/...``) renders the report, serves its plots and the Data Docs,
  and lists the failures, reading only files inside the run's folder (``fleetgen.report.site``). It asks
  Airflow's auth manager whether the caller may read the DAG's runs.

The view serves only runs of the DAG ``sglang_generation`` whose folder lies in the deployment's output root
(``FLEETGEN_OUTPUT_ROOT`` of the API server, ``fleetgen.outputs.default_output_root``): never a root taken
from the run's conf, which whoever triggers the run chooses. A run whose DAG parameter ``output_root`` names
another folder, a run id that is not a plain folder name (``.``, ``..``, ``/``...) and a run folder that is a
symlink are answered 404 with the reason (``fleetgen.report.site.served_run_layout``). The API server must
see the workers' output root (the same machine, or shared storage) under the same path; or, with
``FLEETGEN_OUTPUT_ROOT`` an ``s3://`` URL, reach the store through the deployment's connection
(``FLEETGEN_STORAGE_CONN_ID``, else ``aws_default``): the run's pages are then read from its prefix there, a key
below it only, and a store that does not answer is a 502 naming the object.
"""

from __future__ import annotations

from urllib.parse import quote, urlparse

from airflow.plugins_manager import AirflowPlugin
from airflow.sdk import BaseOperatorLink

DAG_ID = "sglang_generation"
PREFIX = "/fleetgen"


def _run_layout(dag_id: str, run_id: str):
    """The run's output folder in the deployment's output root, or None when there is no such run of our DAG;
    raises PathOutsideRun for a run the view does not serve (the run's conf is read from the metadata DB only
    to see whether it names another output root)."""
    from sqlalchemy import select

    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    from fleetgen.outputs import default_output_root
    from fleetgen.report.site import served_run_layout

    if dag_id != DAG_ID:
        return None
    with create_session() as session:
        conf = session.scalar(select(DagRun.conf).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
    if conf is None and not _run_exists(dag_id, run_id):
        return None
    conf = conf or {}
    return served_run_layout(default_output_root(), run_id, conf.get("output_root"), conf.get("storage_conn_id"),
                             connect=_connect)


def _connect(location, conn_id: str):
    from fleetgen.storage.objects import ObjectStore

    return ObjectStore.connect(location, conn_id=conn_id, parameter="FLEETGEN_OUTPUT_ROOT")


def _run_exists(dag_id: str, run_id: str) -> bool:
    from sqlalchemy import select

    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        return session.scalar(select(DagRun.id).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id)) is not None


def run_url(dag_id: str, run_id: str, page: str) -> str:
    from airflow.configuration import conf

    root = urlparse(conf.get("api", "base_url", fallback="") or "").path.rstrip("/")
    return f"{root}{PREFIX}/runs/{quote(dag_id, safe='')}/{quote(run_id, safe='')}/{page}"


class _RunLink(BaseOperatorLink):
    page = ""
    tasks: frozenset[str] = frozenset()

    def shown(self, ti_key) -> bool:
        return ti_key.task_id in self.tasks

    def get_link(self, operator, *, ti_key) -> str:
        if ti_key.dag_id != DAG_ID or not self.shown(ti_key):
            return ""
        return run_url(ti_key.dag_id, ti_key.run_id, self.page)


class ReportLink(_RunLink):
    name = "Report"
    page = "files/report/report.md"
    tasks = frozenset({"validate.report"})


class DataDocsLink(_RunLink):
    name = "Data Docs"
    page = "files/validation/data_docs/index.html"
    tasks = frozenset({"validate.validate", "validate.report"})


class FailuresLink(_RunLink):
    name = "Failures"
    page = "failures"

    def shown(self, ti_key) -> bool:
        if ti_key.task_id == "run_outcome":
            return True
        from fleetgen.errors import PathOutsideRun, StoreError
        from fleetgen.report.site import run_failures

        try:
            layout = _run_layout(ti_key.dag_id, ti_key.run_id)
            return layout is not None and any(record.get("task_id") == ti_key.task_id
                                              for record in run_failures(layout))
        except (PathOutsideRun, StoreError):
            return False


def _app():
    from fastapi import Depends, FastAPI, HTTPException
    from fastapi.responses import HTMLResponse, Response

    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api.security import requires_access_dag

    from fleetgen.errors import PathOutsideRun, StoreError
    from fleetgen.report.site import RunPages

    app = FastAPI(title="fleetgen results", docs_url=None, redoc_url=None, openapi_url=None)
    can_read = [Depends(requires_access_dag("GET", DagAccessEntity.RUN))]

    @app.exception_handler(StoreError)
    def store_failed(request, error: StoreError) -> Response:  # the run is there, its store did not answer
        return Response(str(error), status_code=502, media_type="text/plain; charset=utf-8")

    def pages(dag_id: str, run_id: str) -> RunPages:
        try:
            layout = _run_layout(dag_id, run_id)
        except PathOutsideRun as error:
            raise HTTPException(404, str(error)) from None
        if layout is None:
            raise HTTPException(404, f"no run {run_id} of {dag_id} (the view serves the runs of {DAG_ID})")
        return RunPages(layout, run_id, base=run_url(dag_id, run_id, ""))

    # requires_access_dag reads the DAG from the path's dag_id: the caller must be allowed to read that DAG's runs.
    @app.get("/runs/{dag_id}/{run_id}/files/{relative:path}", dependencies=can_read)
    def run_file(dag_id: str, run_id: str, relative: str) -> Response:
        run_pages = pages(dag_id, run_id)
        try:
            body, media = run_pages.file(relative)
        except PathOutsideRun as error:
            raise HTTPException(404, error.message) from None
        # The pages are self-contained: forbid the browser to fetch anything from elsewhere.
        return Response(body, media_type=media, headers={"Content-Security-Policy": "default-src 'self' "
                        "'unsafe-inline' data:; connect-src 'self'"})

    @app.get("/runs/{dag_id}/{run_id}/failures", dependencies=can_read, response_class=HTMLResponse)
    def run_failures(dag_id: str, run_id: str) -> str:
        return pages(dag_id, run_id).failures()

    return app


class FleetgenResultsPlugin(AirflowPlugin):
    name = "fleetgen_results"
    global_operator_extra_links = [ReportLink(), DataDocsLink(), FailuresLink()]
    fastapi_apps = [{"app": _app(), "url_prefix": PREFIX, "name": "fleetgen results"}]
