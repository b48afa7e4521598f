"""Developer stacks: the DAG run against simulated GPU nodes (``include/sglang_sim``) on this machine.

- ``demo``: one ``airflow dags test`` run end to end (``make demo``), and ``SimEnvironment``, the simulated
  fleet behind SSH with Airflow's settings applied, that the end-to-end tests and benches share;
- ``ui``: the Airflow UI on that fleet (``make ui``);
- ``prod``: the production layout, PostgreSQL + Celery workers (``make prod-up`` / ``make prod-down``);
- ``sessions``: stopping a component the way Kubernetes and systemd do (SIGTERM, then SIGKILL);
- ``local_fleet``: simulated servers started directly, without SSH or Airflow.

These use the product (its settings loader, its endpoints); the simulator itself imports nothing of it.
"""
