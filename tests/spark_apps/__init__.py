"""Spark applications that tests submit to a real standalone cluster (tests/test_spark_cluster.py)."""
