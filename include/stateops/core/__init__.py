"""The ground floor: what a checkpoint and a registry are, read and checked without Spark.

The registry, the checkpoint model, the file-level verifier, the inspect report, errors,
times, S3 settings and staging folders. Imports nothing else of ``stateops``.
"""
