"""Visits per user over the union of two inputs ``a`` and ``b`` (any columns with ``user_id``)."""


def build(spark, inputs):
    both = inputs["a"].select("user_id").unionByName(inputs["b"].select("user_id"))
    return both.groupBy("user_id").count()
