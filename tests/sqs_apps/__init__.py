"""Apps written for Amazon SQS, run unchanged against queue_pg's SQS endpoint by tests/test_sqs.py."""
