# The Astro CLI project image (`astro dev start`, `astro deploy`): Astro Runtime on Airflow 3.3 with
# Python 3.11, which fleetgen requires. On build the Runtime installs packages.txt (apt) and
# requirements.txt (pip); requirements.txt pins apache-airflow==3.3.2, so use the Runtime release that
# ships Airflow 3.3.2 (`docker run --rm IMAGE airflow version`).
FROM astrocrpublic.azurecr.io/runtime:3.3-2-python-3.11

# Astro copies the project to $AIRFLOW_HOME (/usr/local/airflow) without installing it: the packages
# under include/ (fleetgen, and sglang_sim for a simulated fleet) are found through the path.
ENV PYTHONPATH=/usr/local/airflow/include
