"""The functions the engine evaluates, by the shape of their arguments (Prometheus 2.42's set)."""

from __future__ import annotations

RANGE_FUNCTIONS = frozenset(
    (
        "rate",
        "irate",
        "increase",
        "delta",
        "idelta",
        "deriv",
        "predict_linear",
        "resets",
        "changes",
        "avg_over_time",
        "min_over_time",
        "max_over_time",
        "sum_over_time",
        "count_over_time",
        "last_over_time",
        "quantile_over_time",
        "stddev_over_time",
        "stdvar_over_time",
        "present_over_time",
        "holt_winters",
        "absent_over_time",
    )
)
MATH_FUNCTIONS = frozenset(
    (
        "abs",
        "ceil",
        "floor",
        "sqrt",
        "exp",
        "ln",
        "log2",
        "log10",
        "sgn",
        "sin",
        "cos",
        "tan",
        "asin",
        "acos",
        "atan",
        "sinh",
        "cosh",
        "tanh",
        "asinh",
        "acosh",
        "atanh",
        "deg",
        "rad",
    )
)
DATE_FUNCTIONS = frozenset(
    (
        "day_of_month",
        "day_of_week",
        "day_of_year",
        "days_in_month",
        "hour",
        "minute",
        "month",
        "year",
    )
)
OTHER_FUNCTIONS = frozenset(
    (
        "absent",
        "histogram_quantile",
        "clamp",
        "clamp_min",
        "clamp_max",
        "round",
        "pi",
        "time",
        "timestamp",
        "vector",
        "scalar",
        "label_replace",
        "label_join",
        "sort",
        "sort_desc",
    )
)
FUNCTIONS = RANGE_FUNCTIONS | MATH_FUNCTIONS | DATE_FUNCTIONS | OTHER_FUNCTIONS
