"""The Spark jobs' entry points: each file is what ``spark-submit`` runs (its ``main()``),
found by :func:`stateops.spark.jobs.job_path` wherever the package is (a checkout's
``include/``, or an installed wheel). They import PySpark only inside ``main()``."""
