CREATE DATABASE mlflow OWNER airflow;
