"""stateops: lifecycle operations for stateful Spark Structured Streaming.

The library imports neither Airflow nor, at module top, PySpark (except the Spark-side
``stateops.pipelines``), so planning code is fast and testable without a JVM.
"""

__version__ = "0.1.0"
