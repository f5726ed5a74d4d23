"""Discrete-event simulation of a training step (simpy) and of failures over a whole run."""

from smplan.planner.schedules import SCHEDULES, ScheduleError, Task, device_orders

from .api import DP_PATTERNS, SimulationError, StepResult, simulate_plan, simulate_step
from .gantt import COLOURS as GANTT_COLOURS
from .gantt import LABELS as GANTT_LABELS
from .step import SimEvent

__all__ = [
    "DP_PATTERNS",
    "GANTT_COLOURS",
    "GANTT_LABELS",
    "SCHEDULES",
    "ScheduleError",
    "SimEvent",
    "SimulationError",
    "StepResult",
    "Task",
    "device_orders",
    "simulate_plan",
    "simulate_step",
]
