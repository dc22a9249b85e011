"""The SQS-compatible endpoint (docs/sqs.md): boto3, the AWS CLI and other SQS clients work
the queue with nothing changed but `endpoint_url`, authenticated as remote agents."""
