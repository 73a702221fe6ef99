"""TaskFlow decorators: ``@task.horus_kubernetes``."""
