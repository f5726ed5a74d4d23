"""Close the loop: execute plans, hold them against the cost model, fit the profile.

The fit (`fit.py`) is pure: a predictor and measured times in, efficiency factors out; the
rest of this package runs the executor and the planner to get those times.
"""

from .measure import Measured, device_dtype, run_plan
from .plans import PlanChoice, choose, to_plan
from .run import (
    CalibrateOptions,
    CalibrationReport,
    Row,
    calibrate,
    local_cluster,
    predict,
    simulate,
)

__all__ = [
    "CalibrateOptions",
    "CalibrationReport",
    "Measured",
    "PlanChoice",
    "Row",
    "calibrate",
    "choose",
    "device_dtype",
    "local_cluster",
    "predict",
    "run_plan",
    "simulate",
    "to_plan",
]
