# Airflow image with Horus installed. Built by docker-compose.yaml.
FROM python:3.11-slim
ENV PIP_NO_CACHE_DIR=1 AIRFLOW_HOME=/opt/airflow MLFLOW_DISABLE_TELEMETRY=true
WORKDIR /opt/horus
COPY requirements.txt pyproject.toml README.md ./
RUN pip install -r requirements.txt "apache-airflow-providers-celery[redis]==3.26.0"
COPY horus_airflow ./horus_airflow
RUN pip install --no-deps .
WORKDIR /opt/airflow
