"""Spark-side building blocks (PySpark imported lazily): the session and query start, state
export, the carry-over proof and its simulator, Great Expectations on the state, and the Spark
jobs' files and checks. Imports ``stateops.core`` and ``stateops.control``.
"""
