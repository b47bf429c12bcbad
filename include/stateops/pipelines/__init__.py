"""Reference pipelines: `transformWithStateInPandas` processors used by the registry.

These modules are the Spark side of the project and import PySpark at module top (a
``StatefulProcessor`` subclass needs it); nothing outside Spark jobs imports them.
"""
