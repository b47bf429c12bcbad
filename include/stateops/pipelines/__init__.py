"""Reference pipelines: `transformWithStateInPandas` processors and query-building functions
(`transform`) used by the registry.

These modules are the Spark side of the project; the processors import PySpark at module top (a
``StatefulProcessor`` subclass needs it); nothing outside Spark jobs imports them.
"""
